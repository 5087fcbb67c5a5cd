package maintenance

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/timeout"

	"github.com/turnguard/turnguard/internal/faketime"
)

// recorder collects published events with the fake time they arrived.
type recorder struct {
	mu     sync.Mutex
	start  time.Time
	events []event.Event
	at     []time.Duration
}

func (r *recorder) publish(ev event.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	r.at = append(r.at, time.Since(r.start))
}

func (r *recorder) kinds() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for i, e := range r.events {
		s := e.Kind.String()
		if e.StopReason != "" {
			s += ":" + string(e.StopReason)
		}
		out = append(out, s+"@"+r.at[i].String())
	}
	return out
}

// harness starts a registry and a scheduler inside the current bubble.
type harness struct {
	reg   *abort.Registry
	sched *Scheduler
	rec   *recorder
}

func newHarness(t *testing.T, p Policy) *harness {
	h := &harness{rec: &recorder{start: time.Now()}}
	h.reg = abort.New(func(r *abort.Run) { h.sched.Remove(r) })
	h.sched = New(h.reg, h.rec.publish, Observer{})
	h.sched.SetPolicy(p)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go h.sched.Run(ctx)
	return h
}

func (h *harness) start(t *testing.T, id string, st timeout.Settings) *abort.Run {
	t.Helper()
	r, err := h.reg.Register(context.Background(), abort.Spec{RunID: id, SessionKey: "s", Settings: st})
	if err != nil {
		t.Fatal(err)
	}
	h.sched.Track(r)
	return r
}

var on = Policy{Enabled: true, AutoAbort: true}

func st(step, wall, ceiling, progress time.Duration) timeout.Settings {
	return timeout.Settings{Timeout: wall, StepTimeout: step, MaxTurnTime: ceiling,
		ProgressNotifyAfter: progress, ProgressRepeat: progress, AbortGrace: 3 * time.Second}
}

func equal(t *testing.T, got, want []string) {
	t.Helper()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events:\n got  %v\n want %v", got, want)
	}
}

func TestSilentStepAbortedAtExactlyTheStepDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		r := h.start(t, "r1", st(5*time.Second, time.Hour, 0, 0))
		r.StepStarted("tool", "shell")
		faketime.Advance(10 * time.Second)
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"aborted:step_timeout@5s", "force_finalized:step_timeout@8s"})
		if r.State() != abort.StateAborted || r.StopReason() != event.ReasonStepTimeout {
			t.Fatalf("state %v reason %v", r.State(), r.StopReason())
		}
		if err := context.Cause(r.Context()); err == nil || !strings.Contains(err.Error(), "step_timeout") {
			t.Fatalf("runner context cause = %v", err)
		}
		h.rec.mu.Lock()
		msg := messages.Render(nil, h.rec.events[0])
		h.rec.mu.Unlock()
		if !strings.Contains(msg, "No progress for 5 s") || !strings.Contains(msg, "shell never finished") {
			t.Fatalf("user message %q", msg)
		}
	})
}

func TestLivenessKeepsBusyTurnAlivePastStepWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		r := h.start(t, "r1", st(5*time.Second, time.Hour, 0, 0))
		// 100 steps of 1s each: 100s in all, far past the 5s window.
		for range 100 {
			r.StepStarted("tool", "web_search")
			faketime.Advance(time.Second)
			r.StepCompleted("tool", "web_search")
		}
		synctest.Wait()
		equal(t, h.rec.kinds(), nil)
		if r.State() != abort.StateRunning {
			t.Fatalf("busy turn was stopped: %v", r.StopReason())
		}
		// Then it goes silent: aborted 5s after the last completion.
		faketime.Advance(6 * time.Second)
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"aborted:step_timeout@1m45s"})
		// Lazy re-arm: completions never touched the heap; the run surfaced
		// about once per 5s window (~21-23 times in 105s), not once per step.
		if w := h.sched.Stats().Wakeups; w > 25 {
			t.Fatalf("wakeups = %d, want ≤ 25 for 105s with a 5s window (100 steps)", w)
		}
	})
}

func TestCeilingBeatsProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		r := h.start(t, "r1", st(5*time.Second, time.Hour, 30*time.Second, 0))
		for range 100 { // always making progress, with heartbeats too
			r.StepStarted("tool", "fetch_page")
			faketime.Advance(time.Second)
			r.Heartbeat()
			r.StepCompleted("tool", "fetch_page")
		}
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"aborted:max_turn_time@30s", "force_finalized:max_turn_time@33s"})
	})
}

func TestRequestCannotExtendPastCeiling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		s := timeout.Resolve(time.Hour, timeout.Keys{MaxTurnTimeSeconds: ptr(20), StepTimeoutSeconds: ptr(0)})
		h.start(t, "r1", s)
		faketime.Advance(time.Minute)
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"budget_warning@16s", "aborted:max_turn_time@20s", "force_finalized:max_turn_time@30s"})
	})
}

func TestWallClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		r := h.start(t, "r1", st(5*time.Second, 12*time.Second, time.Minute, 0))
		for range 10 {
			r.StepStarted("llm", "m")
			faketime.Advance(2 * time.Second)
			r.StepCompleted("llm", "m")
		}
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"aborted:timeout@12s", "force_finalized:timeout@15s"})
	})
}

func TestPauseStopsLivenessNotCeiling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		r := h.start(t, "r1", st(5*time.Second, time.Hour, 60*time.Second, 0))
		r.StepStarted("tool", "ask_human")
		faketime.Advance(2 * time.Second)
		r.Pause()
		faketime.Advance(30 * time.Second) // far past the 5s window: paused, so no step timeout
		synctest.Wait()
		equal(t, h.rec.kinds(), nil)
		r.Resume() // 3s of the window remain
		faketime.Advance(2 * time.Second)
		synctest.Wait()
		equal(t, h.rec.kinds(), nil)
		faketime.Advance(2 * time.Second)
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"aborted:step_timeout@35s"})

		// A second turn stays paused: the ceiling still fires.
		r2 := h.start(t, "r2", st(5*time.Second, time.Hour, 60*time.Second, 0))
		r2.Pause()
		faketime.Advance(2 * time.Minute)
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"aborted:step_timeout@35s", "force_finalized:step_timeout@38s",
			"aborted:max_turn_time@1m36s", "force_finalized:max_turn_time@1m39s"})
	})
}

func TestProgressNoticeRepeatsAndStopsWithTheStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		s := st(time.Hour, 2*time.Hour, 0, 30*time.Second)
		s.ProgressRepeat = 60 * time.Second
		r := h.start(t, "r1", s)
		r.StepStarted("tool", "shell")
		faketime.Advance(100 * time.Second)
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"progress@30s", "progress@1m30s"})
		h.rec.mu.Lock()
		msg := messages.Render(nil, h.rec.events[0])
		h.rec.mu.Unlock()
		if msg != "⏳ Still working — shell has been running for 30 s…" {
			t.Fatalf("progress message %q", msg)
		}
		r.StepCompleted("tool", "shell")
		if !r.ClearNotice() {
			t.Fatal("completion did not find the open notice")
		}
		faketime.Advance(10 * time.Minute)
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"progress@30s", "progress@1m30s"})
	})
}

func TestStuckRunnerForceFinalizedAfterGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		r := h.start(t, "r1", st(5*time.Second, time.Hour, 0, 0))
		r.StepStarted("tool", "shell") // and the runner never returns
		faketime.Advance(time.Minute)
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"aborted:step_timeout@5s", "force_finalized:step_timeout@8s"})
		if !r.Released() {
			t.Fatal("stuck run still holds its session")
		}
		if h.reg.Len() != 0 || h.sched.Stats().Entries != 0 {
			t.Fatalf("registry %d entries %d after force-finalize", h.reg.Len(), h.sched.Stats().Entries)
		}
	})
}

func TestRunnerThatReturnsInGraceIsNotForceFinalized(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		r := h.start(t, "r1", st(5*time.Second, time.Hour, 0, 0))
		go func() {
			<-r.Context().Done()
			faketime.Advance(time.Second) // cleanup takes a second, within the 3s grace
			r.MarkReturned()
			h.reg.Release(r)
		}()
		faketime.Advance(time.Minute)
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"aborted:step_timeout@5s"})
	})
}

func TestKillswitches(t *testing.T) {
	tests := []struct {
		name string
		p    Policy
		want []string
	}{
		{"enabled", on, []string{"progress@2s", "progress@4s", "aborted:step_timeout@5s", "force_finalized:step_timeout@8s"}},
		{"autoAbort off: notices only", Policy{Enabled: true}, []string{"progress@2s", "progress@4s", "progress@6s", "progress@8s", "progress@10s"}},
		{"disabled wins over autoAbort", Policy{AutoAbort: true}, nil},
		{"all off", Policy{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, tt.p)
				r := h.start(t, "r1", st(5*time.Second, 9*time.Second, 0, 2*time.Second))
				r.StepStarted("tool", "shell")
				faketime.Advance(11 * time.Second)
				synctest.Wait()
				equal(t, h.rec.kinds(), tt.want)
			})
		})
	}
}

func TestKillswitchAppliesToLiveTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, Policy{})
		h.start(t, "r1", st(5*time.Second, time.Hour, 0, 0))
		faketime.Advance(10 * time.Second)
		synctest.Wait()
		equal(t, h.rec.kinds(), nil)
		h.sched.SetPolicy(on) // re-enabled: the overdue step deadline fires at once
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"aborted:step_timeout@10s"})
	})
}

func TestFarDeadlinesCauseNoWakeups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		for i := range 1000 {
			h.start(t, "r"+string(rune('a'+i%26))+time.Duration(i).String(), st(time.Hour, 2*time.Hour, 3*time.Hour, 0))
		}
		faketime.Advance(10 * time.Minute)
		synctest.Wait()
		if w := h.sched.Stats().Wakeups; w != 0 {
			t.Fatalf("wakeups = %d in 10 minutes with deadlines an hour away", w)
		}
	})
}

func ptr(f float64) *float64 { return &f }

// TestTouchDuringLookKeepsTheEarlierTime: the scheduler looks at a run (its
// step just completed, so only the 1h wall clock is ahead), and between its
// decision and its re-arm the runner starts the next step, whose progress
// notice is due in 1s. The look's re-arm, made from the older view, must not
// move the run back to 1h: the user gets the notice at 2s.
func TestTouchDuringLookKeepsTheEarlierTime(t *testing.T) {
	var r *abort.Run
	raced := false
	testHookLookDecided = func(x *abort.Run) {
		if x == r && !raced {
			raced = true
			r.StepStarted("tool", "fetch_page") // on the runner's side: StepStarted then its Touch
		}
	}
	defer func() { testHookLookDecided = nil }()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		r = h.start(t, "r1", st(0, time.Hour, 0, time.Second)) // no step timeout; progress after 1s
		r.StepStarted("tool", "search")
		faketime.Advance(500 * time.Millisecond)
		r.StepCompleted("tool", "search") // lazy: the run stays armed for 1s
		faketime.Advance(3 * time.Second)
		synctest.Wait()
		if !raced {
			t.Fatal("the look never ran")
		}
		equal(t, h.rec.kinds(), []string{"progress@2s", "progress@3s"})
	})
}

// TestAbortFromOutsideArmsTheGrace: an abort not made by the scheduler (a
// shutdown, a user's /stop) starts the abort grace; a runner that ignores it
// is force-finalized when the grace ends, not at the far wall clock.
func TestAbortFromOutsideArmsTheGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		r := h.start(t, "r1", st(0, time.Hour, 0, 0))
		faketime.Advance(time.Second)
		ev, ok := r.Abort(event.ReasonShutdown)
		if !ok {
			t.Fatal("abort lost")
		}
		r.Publish(h.rec.publish, ev)
		faketime.Advance(time.Minute)
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"aborted:shutdown@1s", "force_finalized:shutdown@4s"})
	})
}

// TestLivenessResetsNeverMoveTheStepDeadlineEarlier: a step completes while
// the run is paused, then the run resumes and heartbeats. The window
// restarts at the resume (progress was made during the pause), then at the
// heartbeat; the abort comes 5s after the heartbeat, on time.
func TestLivenessResetsNeverMoveTheStepDeadlineEarlier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		r := h.start(t, "r1", st(5*time.Second, time.Hour, 0, 0))
		r.StepStarted("tool", "ask_human")
		r.Pause()
		faketime.Advance(10 * time.Second)
		r.StepCompleted("tool", "ask_human") // progress while paused
		faketime.Advance(10 * time.Second)
		r.Resume() // at 20s: the window restarts: due at 25s
		if u := r.Snapshot().UntilStep; u != 5*time.Second {
			t.Fatalf("after the resume the step deadline is %v away, want 5s", u)
		}
		faketime.Advance(2 * time.Second)
		r.Heartbeat() // at 22s: due at 27s
		faketime.Advance(time.Minute)
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"aborted:step_timeout@27s", "force_finalized:step_timeout@30s"})
	})
}

// TestBudgetWarningAtExactlyTheRatioOnce: the warning is published at
// exactly 80 % of the wall clock (the scheduler wakes for it: no sweep),
// once, with the time left and the running step; the turn is still stopped
// at its wall clock.
func TestBudgetWarningAtExactlyTheRatioOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, on)
		set := st(0, 10*time.Second, time.Minute, 0)
		set.BudgetWarningRatio = 0.8
		r := h.start(t, "r1", set)
		r.StepStarted("tool", "build")
		faketime.Advance(time.Minute)
		synctest.Wait()
		equal(t, h.rec.kinds(), []string{"budget_warning@8s", "aborted:timeout@10s", "force_finalized:timeout@13s"})
		h.rec.mu.Lock()
		ev := h.rec.events[0]
		h.rec.mu.Unlock()
		if ev.Limit != 2*time.Second || ev.Elapsed != 8*time.Second || ev.Step.Name != "build" ||
			!ev.Deadline.Equal(r.StartedAt().Add(10*time.Second)) {
			t.Fatalf("warning %+v: want 2 s left of a 10 s wall clock, step build", ev)
		}
		if got := messages.Render(nil, ev); got != "⏳ Your request will be stopped in 2 s unless it finishes." {
			t.Fatalf("the person reads %q", got)
		}
		if n := h.sched.Stats().Warnings; n != 1 {
			t.Fatalf("Stats().Warnings = %d, want 1", n)
		}
	})
}

// TestNoBudgetWarning: ratio 0 warns of nothing, and a turn that finishes
// before the ratio is never warned.
func TestNoBudgetWarning(t *testing.T) {
	for _, tt := range []struct {
		name   string
		ratio  float64
		finish time.Duration // 0: never
		want   []string
	}{
		{"ratio 0", 0, 0, []string{"aborted:timeout@10s", "force_finalized:timeout@13s"}},
		{"finished before the ratio", 0.8, 7 * time.Second, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, on)
				set := st(0, 10*time.Second, time.Minute, 0)
				set.BudgetWarningRatio = tt.ratio
				r := h.start(t, "r1", set)
				if tt.finish > 0 {
					faketime.Advance(tt.finish)
					r.Finish(event.ReasonStop)
					r.MarkReturned()
					h.reg.Release(r)
				}
				faketime.Advance(time.Minute)
				synctest.Wait()
				equal(t, h.rec.kinds(), tt.want)
			})
		})
	}
}
