package maintenance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/timeout"
)

// These benchmarks run in real time (they measure real timers and CPU), so
// run them with -benchtime=1x; each iteration is one full scenario:
//
//	go test -run '^$' -bench . -benchtime=1x ./gateway/maintenance/

// benchSizes are the live-turn counts the comparisons run at.
var benchSizes = []int{100_000, 1_000_000}

// The latency scenario: every turn has a 2 s step (liveness) timeout and a
// far wall clock, and completes a step every 500 ms until its own moment of
// silence, spread uniformly over [1 s, 6 s); it is then aborted for its step
// timeout 2 s after its last completion. Completions only store a time (the
// scheduler re-arms lazily: each turn surfaces at its old deadline and is
// re-armed for the real one), or Reset the turn's timer (timer per turn), or
// store a time found by the next pass (sweep).
const (
	stepWindow   = 2 * time.Second
	stepEvery    = 500 * time.Millisecond
	silentFrom   = time.Second
	silentSpread = 5 * time.Second
	stepPhases   = 10 // the driver completes one tenth of the turns every stepEvery/stepPhases
)

// latencies collects "actual abort time − deadline" samples.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
	n  atomic.Int64
}

func newLatencies(n int) *latencies { return &latencies{d: make([]time.Duration, 0, n)} }

// add records one abort and reports whether it was the want-th.
func (l *latencies) add(d time.Duration, want int) bool {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
	return l.n.Add(1) == int64(want)
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

// silences gives turn i its moment of silence (shuffled, so registration
// order is not deadline order).
func silences(n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = silentFrom + time.Duration(i)*silentSpread/time.Duration(n)
	}
	rand.Shuffle(n, func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// registerAlive registers turns 0..n-1 and then collects the set-up's
// garbage (so it is not billed to the scenario). Meanwhile it completes a
// step of every turn registered so far each stepEvery, so that no turn
// reaches its step deadline during a set-up that takes longer than
// stepWindow (1M turns on a loaded machine take several seconds to register
// and to collect).
func registerAlive(n int, register, complete func(i int)) {
	last := time.Now()
	for i := range n {
		register(i)
		if i%1024 == 0 && time.Since(last) >= stepEvery {
			for j := range i + 1 {
				complete(j)
			}
			last = time.Now()
		}
	}
	gcDone := make(chan struct{})
	go func() {
		runtime.GC()
		close(gcDone)
	}()
	tick := time.NewTicker(stepEvery)
	defer tick.Stop()
	for {
		for i := range n {
			complete(i)
		}
		select {
		case <-gcDone:
			return
		case <-tick.C:
		}
	}
}

// driveSteps completes a step of every turn every stepEvery until the
// turn's silence, then returns. It first completes one step of every turn,
// so turns registered early do not time out while the rest register.
func driveSteps(n int, silent []time.Duration, complete func(i int)) {
	for i := range n {
		complete(i)
	}
	start := time.Now()
	tick := time.NewTicker(stepEvery / stepPhases)
	defer tick.Stop()
	for k := 0; ; k++ {
		el := time.Since(start)
		if el > silentFrom+silentSpread {
			return
		}
		for i := k % stepPhases; i < n; i += stepPhases {
			if el < silent[i] {
				complete(i)
			}
		}
		<-tick.C
	}
}

// waitAborts waits for the last abort, bounded.
func waitAborts(b *testing.B, done <-chan struct{}, l *latencies, want int) {
	select {
	case <-done:
	case <-time.After(2 * time.Minute): // real time: a bound, so a lost abort fails instead of hanging
		b.Fatalf("only %d of %d turns aborted within 2 min", l.n.Load(), want)
	}
}

// BenchmarkAbortLatency: how late is each step-timeout abort, for turns that
// complete steps and then go silent (see stepWindow)? The scheduler against
// one runtime timer per turn (time.AfterFunc + Timer.Reset per completion)
// and the sweep port with an aggressive 1 s interval (at OpenClaw's 60 s the
// lateness is the interval: 0–60 s).
func BenchmarkAbortLatency(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("scheduler/turns=%d", n), func(b *testing.B) {
			for range b.N {
				benchLatencyScheduler(b, n)
			}
		})
		b.Run(fmt.Sprintf("timer-per-turn/turns=%d", n), func(b *testing.B) {
			for range b.N {
				lat := newLatencies(n)
				done := make(chan struct{})
				tr := newTimerRegistry(func(_ *timerTurn, _ event.StopReason, deadline, now time.Duration) {
					if lat.add(now-deadline, n) {
						close(done)
					}
				})
				turns := make([]*timerTurn, n)
				registerAlive(n, func(i int) { turns[i] = tr.register(strconv.Itoa(i), time.Hour, stepWindow) },
					func(i int) { turns[i].stepCompleted() })
				cpu0 := cpuTime()
				go driveSteps(n, silences(n), func(i int) { turns[i].stepCompleted() })
				waitAborts(b, done, lat, n)
				cpu := cpuTime() - cpu0
				tr.stop()
				lat.report(b, n)
				b.ReportMetric(float64(cpu.Microseconds())/1000, "cpu-ms")
			}
		})
		b.Run(fmt.Sprintf("timer-per-run/turns=%d", n), func(b *testing.B) {
			for range b.N {
				benchLatencyTimerPerRun(b, n)
			}
		})
		b.Run(fmt.Sprintf("sweep-1s/turns=%d", n), func(b *testing.B) {
			for range b.N {
				lat := newLatencies(n)
				done := make(chan struct{})
				sw := newSweepRegistry(func(_ string, deadline, now time.Duration) {
					if lat.add(now-deadline, n) {
						close(done)
					}
				})
				entries := make([]*sweepEntry, n)
				registerAlive(n, func(i int) { entries[i] = sw.registerStep(strconv.Itoa(i), time.Hour, stepWindow) },
					func(i int) { sw.stepCompleted(entries[i]) })
				ctx, cancel := context.WithCancel(context.Background())
				go sw.run(ctx, time.Second)
				go driveSteps(n, silences(n), func(i int) { sw.stepCompleted(entries[i]) })
				waitAborts(b, done, lat, n)
				cancel()
				lat.report(b, n)
			}
		})
	}
}

// latencyPublish is the latency scenario's publish over the registry's
// runs: it records each Aborted event's lateness and releases the run. It
// reads the clock first and finds its run by index, as the timer design's
// callback does (it is handed its turn): the moment of the publish is the
// abort's, and the benchmark's own look-up is not billed to it.
func latencyPublish(reg **abort.Registry, runs []*abort.Run, lat *latencies, done chan struct{}) func(event.Event) {
	return func(ev event.Event) {
		if ev.Kind != event.Aborted {
			return
		}
		now := (*reg).Now()
		i, err := strconv.Atoi(ev.RunID)
		if err != nil {
			panic(err)
		}
		r := runs[i]
		v := r.View()
		if lat.add(now-(v.LivenessRef+v.Settings.StepTimeout), len(runs)) {
			close(done)
		}
		(*reg).Release(r)
	}
}

var latencySettings = timeout.Settings{Timeout: time.Hour, StepTimeout: stepWindow, ProgressRepeat: time.Minute, AbortGrace: time.Second}

func benchLatencyScheduler(b *testing.B, n int) {
	lat := newLatencies(n)
	var reg *abort.Registry
	var sched *Scheduler
	runs := make([]*abort.Run, n)
	done := make(chan struct{})
	publish := latencyPublish(&reg, runs, lat, done)
	reg = abort.New(func(r *abort.Run) { sched.Remove(r) })
	sched = New(reg, publish, Observer{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go sched.Run(ctx)
	registerAlive(n, func(i int) {
		r, err := reg.Register(ctx, abort.Spec{RunID: strconv.Itoa(i), SessionKey: "s", Settings: latencySettings})
		if err != nil {
			b.Fatal(err)
		}
		sched.Track(r)
		r.StepStarted("tool", "web_search")
		runs[i] = r
	}, func(i int) { runs[i].StepCompleted("tool", "web_search") })
	before := sched.Stats()
	cpu0 := cpuTime()
	go driveSteps(n, silences(n), func(i int) { runs[i].StepCompleted("tool", "web_search") })
	waitAborts(b, done, lat, n)
	cpu := cpuTime() - cpu0
	after := sched.Stats()
	lat.report(b, n)
	b.ReportMetric(float64(cpu.Microseconds())/1000, "cpu-ms")
	b.ReportMetric(float64(after.Rearms-before.Rearms)/float64(n), "lazy-rearms/turn")
}

// benchLatencyTimerPerRun is the timer design doing the product's abort:
// the registry's runs, one runtime timer per run (Timer.Reset after each
// step completion, on the completing goroutine), and a callback that makes
// the scheduler's decision and abort (Decide, AbortDue, Publish through the
// same publish). It tells the design apart from the abort's own work, which
// the timer-per-turn baseline (a bare context cancel) does not do.
func benchLatencyTimerPerRun(b *testing.B, n int) {
	lat := newLatencies(n)
	var reg *abort.Registry
	runs := make([]*abort.Run, n)
	timers := make([]*time.Timer, n)
	done := make(chan struct{})
	publish := latencyPublish(&reg, runs, lat, done)
	reg = abort.New(nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fire := func(i int) {
		r := runs[i]
		now := reg.Now()
		d := Decide(now, r.View(), Policy{Enabled: true, AutoAbort: true})
		switch d.Action {
		case Abort:
			if ev, ok := r.AbortDue(d.Reason); ok {
				r.Publish(publish, ev)
			}
		case None:
			if d.Next > 0 {
				timers[i].Reset(d.Next - now)
			}
		}
	}
	complete := func(i int) {
		runs[i].StepCompleted("tool", "web_search")
		timers[i].Reset(stepWindow)
	}
	registerAlive(n, func(i int) {
		r, err := reg.Register(ctx, abort.Spec{RunID: strconv.Itoa(i), SessionKey: "s", Settings: latencySettings})
		if err != nil {
			b.Fatal(err)
		}
		r.StepStarted("tool", "web_search")
		runs[i] = r
		timers[i] = time.AfterFunc(stepWindow, func() { fire(i) })
	}, complete)
	cpu0 := cpuTime()
	go driveSteps(n, silences(n), complete)
	waitAborts(b, done, lat, n)
	cpu := cpuTime() - cpu0
	for _, t := range timers {
		t.Stop()
	}
	lat.report(b, n)
	b.ReportMetric(float64(cpu.Microseconds())/1000, "cpu-ms")
}

var farSettings = timeout.Settings{Timeout: time.Hour, StepTimeout: time.Hour, MaxTurnTime: 2 * time.Hour,
	ProgressRepeat: time.Minute, AbortGrace: time.Second}

// BenchmarkMemoryPerTurn: heap bytes per live turn with one running step:
// the registry and the scheduler's heap entry; the timer per turn (its
// record, context, runtime timer and map entry); the sweep port's entry.
func BenchmarkMemoryPerTurn(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("scheduler/turns=%d", n), func(b *testing.B) {
			for range b.N {
				measureHeap(b, n, func() any {
					var sched *Scheduler
					reg := abort.New(func(r *abort.Run) { sched.Remove(r) })
					sched = New(reg, func(event.Event) {}, Observer{})
					for i := range n {
						r, _ := reg.Register(context.Background(), abort.Spec{RunID: strconv.Itoa(i), SessionKey: "s", Settings: farSettings})
						sched.Track(r)
						r.StepStarted("tool", "web_search")
					}
					return sched
				})
			}
		})
		b.Run(fmt.Sprintf("timer-per-turn/turns=%d", n), func(b *testing.B) {
			for range b.N {
				var tr *timerRegistry
				measureHeap(b, n, func() any {
					tr = newTimerRegistry(nil)
					for i := range n {
						tr.register(strconv.Itoa(i), time.Hour, time.Hour)
					}
					return tr
				})
				tr.stop()
			}
		})
		b.Run(fmt.Sprintf("sweep/turns=%d", n), func(b *testing.B) {
			for range b.N {
				measureHeap(b, n, func() any {
					sw := newSweepRegistry(nil)
					for i := range n {
						sw.registerStep(strconv.Itoa(i), time.Hour, time.Hour)
					}
					return sw
				})
			}
		})
	}
}

func measureHeap(b *testing.B, n int, build func() any) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	keep := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "B/turn")
	runtime.KeepAlive(keep)
}

// BenchmarkIdleFarDeadlines: 1M live turns whose deadlines are an hour away,
// observed for 10 s of real time: how often does the scheduler wake and how
// much CPU does the process burn? One runtime timer per turn is measured the
// same way (the runtime exposes no wake-up count; its CPU is the measure). The sweep port's cost is one O(n) pass per
// interval; it is measured per pass and over the same 10 s with a 1 s
// interval, and its CPU at the 60 s interval is one pass per 60 s.
func BenchmarkIdleFarDeadlines(b *testing.B) {
	const n = 1_000_000
	const window = 10 * time.Second
	far := farSettings
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
			runtime.GC() // do not bill the set-up's garbage collection to the idle window
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
	b.Run("timer-per-turn", func(b *testing.B) {
		for range b.N {
			tr := newTimerRegistry(nil)
			for i := range n {
				tr.register(strconv.Itoa(i), time.Hour, time.Hour)
			}
			runtime.GC() // do not bill the set-up's garbage collection to the idle window
			cpu0 := cpuTime()
			time.Sleep(window) // real time: the benchmark observes an idle process for 10 s of wall time
			cpu := cpuTime() - cpu0
			tr.stop()
			b.ReportMetric(float64(cpu.Microseconds())/1000, "cpu-ms/10s")
			fmt.Printf("timer-per-turn: %d turns, %v CPU in %v\n", n, cpu, window)
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
			runtime.GC() // do not bill the set-up's garbage collection to the idle window
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
