package maintenance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/gateway/event"
	"github.com/turnguard/turnguard/timeout"
)

// These benchmarks run in real time (they measure real timers and CPU), so
// run them with -benchtime=1x; each iteration is one full scenario:
//
//	go test -run '^$' -bench . -benchtime=1x ./gateway/maintenance/

const (
	latencyTurns  = 100_000
	latencySpread = 10 * time.Second
)

// latencies collects "actual abort time − deadline" samples.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B, want int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) != want {
		b.Fatalf("%d aborts, want %d", len(l.d), want)
	}
	slices.Sort(l.d)
	q := func(p float64) time.Duration { return l.d[min(len(l.d)-1, int(p*float64(len(l.d))))] }
	b.ReportMetric(float64(q(0.50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(q(0.99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(l.d[len(l.d)-1].Microseconds())/1000, "max-ms")
}

// spreadTimeouts gives turn i a wall clock deadline spread uniformly over
// latencySpread (shuffled so registration order is not deadline order).
func spreadTimeouts(n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = 100*time.Millisecond + time.Duration(i)*latencySpread/time.Duration(n)
	}
	rand.Shuffle(n, func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// BenchmarkAbortLatency: 100K turns whose deadlines are spread across 10 s;
// how late is each abort? The scheduler against the sweep port with
// OpenClaw's 60 s interval (and, for perspective, an aggressive 1 s one).
func BenchmarkAbortLatency(b *testing.B) {
	b.Run("scheduler", func(b *testing.B) {
		for range b.N {
			lat := &latencies{d: make([]time.Duration, 0, latencyTurns)}
			var reg *abort.Registry
			var sched *Scheduler
			done := make(chan struct{})
			var aborted int
			publish := func(ev event.Event) {
				if ev.Kind != event.Aborted {
					return
				}
				r, _ := reg.Get(ev.RunID)
				lat.add(reg.Now() - r.View().WallDeadline)
				reg.Release(r)
				aborted++ // only the scheduler goroutine publishes here
				if aborted == latencyTurns {
					close(done)
				}
			}
			reg = abort.New(func(r *abort.Run) { sched.Remove(r) })
			sched = New(reg, publish, Observer{})
			ctx, cancel := context.WithCancel(context.Background())
			go sched.Run(ctx)
			st := timeout.Settings{StepTimeout: 0, ProgressRepeat: time.Minute, AbortGrace: time.Second}
			for i, d := range spreadTimeouts(latencyTurns) {
				st.Timeout = d
				r, err := reg.Register(ctx, abort.Spec{RunID: strconv.Itoa(i), SessionKey: "s", Settings: st})
				if err != nil {
					b.Fatal(err)
				}
				sched.Track(r)
			}
			<-done
			cancel()
			lat.report(b, latencyTurns)
		}
	})
	for _, interval := range []time.Duration{60 * time.Second, time.Second} {
		b.Run("sweep-"+interval.String(), func(b *testing.B) {
			for range b.N {
				lat := &latencies{d: make([]time.Duration, 0, latencyTurns)}
				var n int
				done := make(chan struct{})
				sw := newSweepRegistry(func(id string, deadline, now time.Duration) {
					lat.add(now - deadline)
					if n++; n == latencyTurns {
						close(done)
					}
				})
				ctx, cancel := context.WithCancel(context.Background())
				go sw.run(ctx, interval)
				for i, d := range spreadTimeouts(latencyTurns) {
					sw.register(strconv.Itoa(i), d)
				}
				<-done
				cancel()
				lat.report(b, latencyTurns)
			}
		})
	}
}

// BenchmarkIdleFarDeadlines: 1M live turns whose deadlines are an hour away,
// observed for 10 s of real time: how often does the scheduler wake and how
// much CPU does the process burn? The sweep port's cost is one O(n) pass per
// interval; it is measured per pass and over the same 10 s with a 1 s
// interval, and its CPU at the 60 s interval is one pass per 60 s.
func BenchmarkIdleFarDeadlines(b *testing.B) {
	const n = 1_000_000
	const window = 10 * time.Second
	far := timeout.Settings{Timeout: time.Hour, StepTimeout: time.Hour, MaxTurnTime: 2 * time.Hour,
		ProgressNotifyAfter: 0, ProgressRepeat: time.Minute, AbortGrace: time.Second}
	b.Run("scheduler", func(b *testing.B) {
		for range b.N {
			var sched *Scheduler
			reg := abort.New(func(r *abort.Run) { sched.Remove(r) })
			sched = New(reg, func(event.Event) {}, Observer{})
			ctx, cancel := context.WithCancel(context.Background())
			go sched.Run(ctx)
			for i := range n {
				r, _ := reg.Register(ctx, abort.Spec{RunID: strconv.Itoa(i), SessionKey: "s", Settings: far})
				r.StepStarted("tool", "shell")
				sched.Track(r)
			}
			before := sched.Stats()
			cpu0 := cpuTime()
			time.Sleep(window) // real time: the benchmark observes an idle process for 10 s of wall time
			cpu := cpuTime() - cpu0
			after := sched.Stats()
			cancel()
			b.ReportMetric(float64(after.Wakeups-before.Wakeups), "wakeups/10s")
			b.ReportMetric(float64(after.Looks-before.Looks), "looks/10s")
			b.ReportMetric(float64(cpu.Microseconds())/1000, "cpu-ms/10s")
			fmt.Printf("scheduler: %d turns, %d wake-ups and %v CPU in %v\n", n, after.Wakeups-before.Wakeups, cpu, window)
		}
	})
	b.Run("sweep", func(b *testing.B) {
		for range b.N {
			sw := newSweepRegistry(nil)
			for i := range n {
				sw.register(strconv.Itoa(i), time.Hour)
			}
			// One pass, timed.
			t0 := time.Now()
			const passes = 5
			for range passes {
				sw.sweep()
			}
			perPass := time.Since(t0) / passes
			// The same 10 s window with a 1 s interval.
			ctx, cancel := context.WithCancel(context.Background())
			go sw.run(ctx, time.Second)
			cpu0 := cpuTime()
			time.Sleep(window) // real time: the benchmark observes an idle process for 10 s of wall time
			cpu := cpuTime() - cpu0
			cancel()
			b.ReportMetric(float64(perPass.Microseconds())/1000, "ms/pass")
			b.ReportMetric(float64(cpu.Microseconds())/1000, "cpu-ms/10s@1s")
			b.ReportMetric(float64(perPass.Microseconds())/1000*float64(window)/float64(60*time.Second), "cpu-ms/10s@60s")
			fmt.Printf("sweep: %d turns, %v per pass; %v CPU in %v at a 1 s interval\n", n, perPass, cpu, window)
		}
	})
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
