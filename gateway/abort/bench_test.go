package abort

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnguard/turnguard/timeout"
)

var sizes = []int{1, 1_000, 100_000, 1_000_000}

// liveRuns registers n runs, each with a running tool step.
func liveRuns(b *testing.B, n int) []*Run {
	g := New(nil)
	runs := make([]*Run, n)
	st := timeout.Defaults()
	for i := range runs {
		r, err := g.Register(context.Background(), Spec{RunID: "run-" + strconv.Itoa(i), SessionKey: "s", Settings: st})
		if err != nil {
			b.Fatal(err)
		}
		r.StepStarted("tool", "web_search")
		runs[i] = r
	}
	return runs
}

// turnWord is the per-turn baseline: the one word a turn's progress must
// store, in its own heap object the size of a Run, so the baseline pays the
// same cache misses a real per-turn record does.
type turnWord struct {
	_    [2]uint64
	word atomic.Int64
	_    [33]uint64
}

func turnWords(n int) []*turnWord {
	out := make([]*turnWord, n)
	for i := range out {
		out[i] = new(turnWord)
		_ = make([]byte, 200) // interleave other per-turn allocations, as Register does
	}
	return out
}

// timerTurn is the per-turn baseline a Go engineer would pick instead of the
// scheduler: one runtime timer per turn (time.AfterFunc), Reset on every
// step completion to the earlier of the step deadline and the wall clock.
// (maintenance's benchmarks compare the two designs end to end.)
type timerTurn struct {
	epoch        time.Time
	timer        *time.Timer
	stepTimeout  time.Duration
	wall         time.Duration
	lastProgress atomic.Int64
}

func timerTurns(n int) []*timerTurn {
	out := make([]*timerTurn, n)
	epoch := time.Now()
	for i := range out {
		t := &timerTurn{epoch: epoch, stepTimeout: 5 * time.Minute, wall: time.Since(epoch) + 30*time.Minute}
		t.timer = time.AfterFunc(t.stepTimeout, func() {})
		out[i] = t
	}
	return out
}

// stepCompleted is the timer design's progress reset.
func (t *timerTurn) stepCompleted() {
	now := time.Since(t.epoch)
	t.lastProgress.Store(int64(now))
	t.timer.Reset(min(t.stepTimeout, t.wall-now))
}

func stopTimers(turns []*timerTurn) {
	for _, t := range turns {
		t.timer.Stop()
	}
}

// BenchmarkStepCompleted measures the hot path at growing numbers of live
// turns, next to the baseline of what it must at least do: read the clock
// and store one word atomically — into a dense array ("baseline"), and into
// the turn's own heap object ("baseline-per-turn") — and next to the design
// it replaces, Timer.Reset of one runtime timer per turn ("timer-per-turn").
// The scheduler re-arms lazily, so StepCompleted is all a completion costs.
func BenchmarkStepCompleted(b *testing.B) {
	for _, n := range sizes {
		b.Run(fmt.Sprintf("baseline-per-turn/turns=%d", n), func(b *testing.B) {
			words := turnWords(n)
			epoch := time.Now()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				words[i%n].word.Store(int64(time.Since(epoch)))
			}
		})
		b.Run(fmt.Sprintf("baseline/turns=%d", n), func(b *testing.B) {
			words := make([]atomic.Int64, n)
			epoch := time.Now()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				words[i%n].Store(int64(time.Since(epoch)))
			}
		})
		b.Run(fmt.Sprintf("registry/turns=%d", n), func(b *testing.B) {
			runs := liveRuns(b, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				runs[i%n].StepCompleted("tool", "web_search")
			}
		})
		b.Run(fmt.Sprintf("timer-per-turn/turns=%d", n), func(b *testing.B) {
			turns := timerTurns(n)
			defer stopTimers(turns)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				turns[i%n].stepCompleted()
			}
		})
	}
}

// BenchmarkStepCompletedParallel is the same with all cores completing steps
// of different turns at once (turns=1: all on one turn).
func BenchmarkStepCompletedParallel(b *testing.B) {
	for _, n := range sizes {
		b.Run(fmt.Sprintf("baseline-per-turn/turns=%d", n), func(b *testing.B) {
			words := turnWords(n)
			epoch := time.Now()
			var next atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1)) * 7919
				for pb.Next() {
					i++
					words[i%n].word.Store(int64(time.Since(epoch)))
				}
			})
		})
		b.Run(fmt.Sprintf("baseline/turns=%d", n), func(b *testing.B) {
			words := make([]atomic.Int64, n)
			epoch := time.Now()
			var next atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1)) * 7919
				for pb.Next() {
					i++
					words[i%n].Store(int64(time.Since(epoch)))
				}
			})
		})
		b.Run(fmt.Sprintf("registry/turns=%d", n), func(b *testing.B) {
			runs := liveRuns(b, n)
			var next atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1)) * 7919
				for pb.Next() {
					i++
					runs[i%n].StepCompleted("tool", "web_search")
				}
			})
		})
		b.Run(fmt.Sprintf("timer-per-turn/turns=%d", n), func(b *testing.B) {
			turns := timerTurns(n)
			defer stopTimers(turns)
			var next atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1)) * 7919
				for pb.Next() {
					i++
					turns[i%n].stepCompleted()
				}
			})
		})
	}
}

// BenchmarkRegistryMemory reports the heap bytes each live turn costs in the
// registry (run, context, map entry, one step record).
func BenchmarkRegistryMemory(b *testing.B) {
	const n = 100_000
	for i := 0; i < b.N; i++ {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		runs := liveRuns(b, n)
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/turn")
		runtime.KeepAlive(runs)
	}
}
