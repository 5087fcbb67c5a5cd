package maintenance

import (
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/timeout"
)

const s = time.Second

// settings: step 10s, wall 60s, ceiling 100s, progress after 5s every 7s, grace 3s.
var settings = timeout.Settings{
	Timeout: 60 * s, StepTimeout: 10 * s, MaxTurnTime: 100 * s,
	ProgressNotifyAfter: 5 * s, ProgressRepeat: 7 * s, AbortGrace: 3 * s,
}

// view builds a running turn that started at 0.
func view(mod func(*abort.View)) abort.View {
	v := abort.View{WallDeadline: 60 * s, Ceiling: 100 * s, Settings: settings}
	if mod != nil {
		mod(&v)
	}
	return v
}

func TestDecide(t *testing.T) {
	on := Policy{Enabled: true, AutoAbort: true}
	tests := []struct {
		name string
		now  time.Duration
		v    abort.View
		p    Policy
		want Decision
	}{
		{"idle turn arms at the step deadline", 1 * s, view(nil), on,
			Decision{Next: 10 * s}},
		{"silent turn aborts exactly at the step deadline", 10 * s, view(nil), on,
			Decision{Action: Abort, Reason: event.ReasonStepTimeout, Due: 10 * s}},
		{"one nanosecond before the step deadline nothing is due", 10*s - 1, view(nil), on,
			Decision{Next: 10 * s}},
		{"liveness reset pushes the step deadline", 10 * s, view(func(v *abort.View) { v.LivenessRef = 8 * s }), on,
			Decision{Next: 18 * s}},
		{"running step gets progress first", 1 * s, view(func(v *abort.View) {
			v.StepRunning, v.StepSeq, v.StepStarted = true, 1, 0
		}), on, Decision{Next: 5 * s}},
		{"progress due after notify threshold", 5 * s, view(func(v *abort.View) {
			v.StepRunning, v.StepSeq, v.StepStarted = true, 1, 0
		}), on, Decision{Action: Progress, Due: 5 * s}},
		{"progress repeats only after the repeat interval", 6 * s, view(func(v *abort.View) {
			v.StepRunning, v.StepSeq, v.NoticeSeq, v.LastNoticeAt = true, 1, 1, 5*s
			v.LivenessRef = 5 * s
		}), on, Decision{Next: 12 * s}},
		{"a new step gets its own first notice", 9 * s, view(func(v *abort.View) {
			v.StepRunning, v.StepSeq, v.StepStarted, v.NoticeSeq, v.LastNoticeAt = true, 2, 4*s, 1, 3*s
			v.LivenessRef = 4 * s
		}), on, Decision{Action: Progress, Due: 9 * s}},
		{"no progress while paused and no step deadline", 20 * s, view(func(v *abort.View) {
			v.StepRunning, v.StepSeq, v.Paused = true, 1, true
		}), on, Decision{Next: 60 * s}},
		{"wall clock", 60 * s, view(func(v *abort.View) { v.LivenessRef = 55 * s }), on,
			Decision{Action: Abort, Reason: event.ReasonTimeout, Due: 60 * s}},
		{"ceiling beats progress and everything", 100 * s, view(func(v *abort.View) {
			v.LivenessRef, v.WallDeadline = 99*s, 100*s
		}), on, Decision{Action: Abort, Reason: event.ReasonMaxTurnTime, Due: 100 * s}},
		{"step beats wall on a tie", 60 * s, view(func(v *abort.View) { v.LivenessRef = 50 * s }), on,
			Decision{Action: Abort, Reason: event.ReasonStepTimeout, Due: 60 * s}},
		{"ceiling beats step on a tie", 100 * s, view(func(v *abort.View) { v.LivenessRef = 90 * s; v.WallDeadline = 200 * s }), on,
			Decision{Action: Abort, Reason: event.ReasonMaxTurnTime, Due: 100 * s}},
		{"abort beats a progress notice due at the same time", 10 * s, view(func(v *abort.View) {
			v.StepRunning, v.StepSeq, v.StepStarted = true, 1, 5*s
		}), on, Decision{Action: Abort, Reason: event.ReasonStepTimeout, Due: 10 * s}},
		{"disabled step timeout", 50 * s, view(func(v *abort.View) { v.Settings.StepTimeout = 0 }), on,
			Decision{Next: 60 * s}},
		{"no ceiling", 50 * s, view(func(v *abort.View) { v.Ceiling = 0; v.LivenessRef = 45 * s }), on,
			Decision{Next: 55 * s}},
		{"watchdog disabled: nothing fires", 500 * s, view(nil), Policy{Enabled: false, AutoAbort: true},
			Decision{}},
		{"watchdog disabled wins over autoAbort", 500 * s, view(func(v *abort.View) {
			v.StepRunning, v.StepSeq = true, 1
		}), Policy{Enabled: false, AutoAbort: false}, Decision{}},
		{"autoAbort off: notices only", 500 * s, view(func(v *abort.View) {
			v.StepRunning, v.StepSeq = true, 1
		}), Policy{Enabled: true, AutoAbort: false}, Decision{Action: Progress, Due: 5 * s}},
		{"autoAbort off: no abort, nothing else due", 500 * s, view(nil), Policy{Enabled: true, AutoAbort: false},
			Decision{}},
		{"aborted run waits for the grace", 11 * s, view(func(v *abort.View) {
			v.State, v.AbortedAt = abort.StateAborted, 10*s
		}), on, Decision{Next: 13 * s}},
		{"stuck runner is force-finalized after the grace", 13 * s, view(func(v *abort.View) {
			v.State, v.AbortedAt = abort.StateAborted, 10*s
		}), on, Decision{Action: ForceFinalize, Due: 13 * s}},
		{"force-finalize applies even with the watchdog off", 13 * s, view(func(v *abort.View) {
			v.State, v.AbortedAt = abort.StateAborted, 10*s
		}), Policy{}, Decision{Action: ForceFinalize, Due: 13 * s}},
		{"aborted run that returned needs nothing", 13 * s, view(func(v *abort.View) {
			v.State, v.AbortedAt, v.Returned = abort.StateAborted, 10*s, true
		}), on, Decision{}},
		{"finished run needs nothing", 13 * s, view(func(v *abort.View) { v.State = abort.StateFinished }), on, Decision{}},
		{"released run is dropped", 13 * s, view(func(v *abort.View) { v.Released = true }), on, Decision{Action: Drop}},
		{"budget warning armed at 80 % of the wall clock", 1 * s, view(warnAt(0.8, func(v *abort.View) { v.Settings.StepTimeout = 0 })), on,
			Decision{Next: 48 * s}},
		{"budget warning due at exactly 80 % of the wall clock", 48 * s, view(warnAt(0.8, func(v *abort.View) { v.LivenessRef = 45 * s })), on,
			Decision{Action: Warn, Due: 48 * s}},
		{"one nanosecond before 80 % no warning", 48*s - 1, view(warnAt(0.8, func(v *abort.View) { v.LivenessRef = 45 * s })), on,
			Decision{Next: 48 * s}},
		{"budget warning at 80 % of the ceiling when it ends first", 40 * s, view(warnAt(0.8, func(v *abort.View) {
			v.Ceiling, v.WallDeadline, v.LivenessRef = 50*s, 60*s, 39*s
		})), on, Decision{Action: Warn, Due: 40 * s}},
		{"warned once: next is the deadline", 50 * s, view(warnAt(0.8, func(v *abort.View) { v.LivenessRef, v.Warned = 45*s, true })), on,
			Decision{Next: 55 * s}},
		{"ratio 0: no warning", 48 * s, view(warnAt(0, func(v *abort.View) { v.LivenessRef = 45 * s })), on,
			Decision{Next: 55 * s}},
		{"autoAbort off: no warning (nothing will be stopped)", 48 * s, view(warnAt(0.8, func(v *abort.View) { v.LivenessRef = 45 * s })),
			Policy{Enabled: true, AutoAbort: false}, Decision{}},
		{"the abort beats a warning due at the same time", 60 * s, view(warnAt(0.8, func(v *abort.View) { v.LivenessRef = 55 * s })), on,
			Decision{Action: Abort, Reason: event.ReasonTimeout, Due: 60 * s}},
		{"the warning beats a progress notice due at the same time", 48 * s, view(warnAt(0.8, func(v *abort.View) {
			v.LivenessRef, v.StepRunning, v.StepSeq, v.StepStarted = 45*s, true, 1, 43*s
		})), on, Decision{Action: Warn, Due: 48 * s}},
		{"a finished turn is not warned", 48 * s, view(warnAt(0.8, func(v *abort.View) { v.State = abort.StateFinished })), on, Decision{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Decide(tt.now, tt.v, tt.p)
			got.Class = 0 // TestDecideClass
			if got != tt.want {
				t.Errorf("Decide(%v) = %+v, want %+v", tt.now, got, tt.want)
			}
		})
	}
}

// warnAt sets the budget warning ratio of a view, then applies mods.
func warnAt(ratio float64, mods ...func(*abort.View)) func(*abort.View) {
	return func(v *abort.View) {
		v.Settings.BudgetWarningRatio = ratio
		for _, m := range mods {
			m(v)
		}
	}
}

// TestDecideClass: the class of a turn comes with every decision, from the
// same deadlines. Quiet is progressNotifyAfter (5 s here), or half the
// liveness window when notices are off.
func TestDecideClass(t *testing.T) {
	on := Policy{Enabled: true, AutoAbort: true}
	tests := []struct {
		name string
		now  time.Duration
		v    abort.View
		p    Policy
		want Class
	}{
		{"fresh turn", 1 * s, view(nil), on, Working},
		{"steps completing", 30 * s, view(func(v *abort.View) {
			v.StepRunning, v.StepSeq, v.StepStarted, v.LivenessRef = true, 9, 28*s, 28*s
		}), on, Working},
		{"one step long, heartbeating", 30 * s, view(func(v *abort.View) {
			v.StepRunning, v.StepSeq, v.StepStarted, v.LivenessRef = true, 1, 20*s, 29*s
		}), on, LongRunning},
		{"no progress for quiet, inside the window", 30 * s, view(func(v *abort.View) {
			v.StepRunning, v.StepSeq, v.StepStarted, v.LivenessRef = true, 1, 20*s, 25*s
		}), on, Stalled},
		{"one nanosecond short of quiet", 30*s - 1, view(func(v *abort.View) {
			v.StepRunning, v.StepSeq, v.StepStarted, v.LivenessRef = true, 1, 25*s, 25*s
		}), on, Working},
		{"silent between steps", 30 * s, view(func(v *abort.View) { v.LivenessRef = 24 * s }), on, Stalled},
		{"paused for a person", 30 * s, view(func(v *abort.View) {
			v.StepRunning, v.StepSeq, v.StepStarted, v.Paused = true, 1, 1*s, true
		}), on, Working},
		{"step deadline passed, not aborted yet", 10 * s, view(nil), on, Stuck},
		{"wall clock passed with auto-abort off", 61 * s, view(func(v *abort.View) { v.LivenessRef = 59 * s }),
			Policy{Enabled: true, AutoAbort: false}, Stuck},
		{"aborted, runner not returned", 11 * s, view(func(v *abort.View) {
			v.State, v.AbortedAt = abort.StateAborted, 10*s
		}), on, Stuck},
		{"aborted, runner returned", 11 * s, view(func(v *abort.View) {
			v.State, v.AbortedAt, v.Returned = abort.StateAborted, 10*s, true
		}), on, Working},
		{"finished", 11 * s, view(func(v *abort.View) { v.State = abort.StateFinished }), on, Working},
		{"notices off: quiet is half the window", 6 * s, view(func(v *abort.View) { v.Settings.ProgressNotifyAfter = 0 }), on, Stalled},
		{"notices and window off: never stalled", 50 * s, view(func(v *abort.View) {
			v.Settings.ProgressNotifyAfter, v.Settings.StepTimeout = 0, 0
		}), on, Working},
		{"watchdog off: still classified", 30 * s, view(func(v *abort.View) { v.LivenessRef = 24 * s }), Policy{}, Stalled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Decide(tt.now, tt.v, tt.p).Class; got != tt.want {
				t.Errorf("Decide(%v).Class = %v, want %v", tt.now, got, tt.want)
			}
		})
	}
}
