// Package maintenance owns the deadline scheduler and the stall ladder: it
// decides, for each live turn, what is due — a "still working" progress
// notice, an abort with a stop reason, or a force-finalization after the
// abort grace — and wakes exactly when the earliest such thing is due.
//
// It replaces the fixed-interval O(n) sweep of older gateways: each live run
// has one entry in a min-heap (one heap per core) keyed by when it next needs
// a look. Progress resets (a step completing) only store a new deadline in
// the run; an entry that surfaces before its run's real deadline is re-armed
// for the real time (the lazy re-arm of gRPC keepalive, Netty's
// IdleStateHandler and Temporal's heartbeat timer). What is due is decided by
// one pure function, Decide.
package maintenance

import (
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/timeout"
)

// Action is what Decide says to do now.
type Action uint8

// The actions.
const (
	None          Action = iota // nothing due; look again at Decision.Next
	Progress                    // send a "still working" notice for the running step
	Abort                       // abort with Decision.Reason
	ForceFinalize               // the runner ignored the abort past the grace: free the session
	Drop                        // the run is over: forget it
	Warn                        // the budget warning is due: tell the runner and the person
)

func (a Action) String() string {
	return [...]string{"none", "progress", "abort", "force_finalize", "drop", "warn"}[a]
}

// Class is what a live turn is doing, as /status, /api/turns, the
// dashboard and the metrics show it. Decide gives it with every decision,
// from the same deadlines it decides on.
type Class uint8

// The classes. Quiet is how long a turn may go without progress (a step
// completing, a heartbeat, counted activity) before it is called stalled or
// its step long: progressNotifyAfter, or, with progress notices off, half
// the liveness window; with both off only Working and Stuck apply.
const (
	// Working: steps complete (no step has run Quiet, progress within
	// Quiet), or the turn waits for a person (its liveness clock is
	// paused), or it has just ended.
	Working Class = iota
	// LongRunning: one step has run Quiet or longer, but the turn shows
	// progress (heartbeats, counted activity) within Quiet.
	LongRunning
	// Stalled: no progress for Quiet or longer, but the liveness window
	// (stepTimeoutSeconds) has not passed.
	Stalled
	// Stuck: a deadline has passed and the runner has not stopped — the
	// turn was aborted (a deadline, /stop) and its runner has not returned,
	// or a deadline passed with auto-abort off.
	Stuck
)

// Classes lists the classes in order, for a gauge per class.
var Classes = [...]Class{Working, LongRunning, Stalled, Stuck}

func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "unknown"
}

var classNames = [...]string{"working", "long_running", "stalled", "stuck"}

// Policy holds the killswitches. Enabled false wins: no tier fires. With
// AutoAbort false, progress notices still fire but deadlines abort nothing.
type Policy struct {
	Enabled   bool
	AutoAbort bool
}

// Decision is Decide's answer: the action due now (None if nothing) and,
// for None, when to look again (0 = never, until something changes).
type Decision struct {
	Action Action
	Class  Class            // what the turn is doing now (whatever the action)
	Reason event.StopReason // for Abort
	Due    time.Duration    // for an action: the deadline that was reached (registry time)
	Next   time.Duration    // for None; registry time
}

// Decide is the stall ladder for one turn at registry time now:
//
//  1. a step running ≥ progressNotifyAfter → Progress (then at most every
//     progressRepeat for that step); none while paused;
//  2. the first passed of ceiling, step (liveness) deadline and wall clock →
//     Abort with that reason; when several have passed the ceiling wins, then
//     the step deadline, then the wall clock;
//  3. an aborted run whose runner has not returned abortGrace after the abort
//     → ForceFinalize;
//  4. a released run → Drop;
//  5. a running turn that has used budgetWarningRatio of the time to the
//     earlier of its wall clock and ceiling, and was not warned yet → Warn
//     (only with auto-abort: without it nothing will be stopped).
//
// Aborts take precedence over a warning, and a warning over a progress
// notice, due at the same moment (the scheduler looks again at once).
// Every decision carries the turn's Class, from the same deadlines.
// Force-finalization applies whatever the policy: it is the only way a
// session whose runner ignores an abort (including a user's /stop) becomes
// free again. Decide is pure: it reads only its arguments.
func Decide(now time.Duration, v abort.View, p Policy) Decision {
	dl := deadlinesOf(v)
	d := decide(now, v, p, dl)
	d.Class = classify(now, v, dl)
	return d
}

// deadlines are a running turn's deadlines in registry time; 0 = none.
type deadlines struct {
	step    time.Duration // the liveness window's end; 0 while paused or disabled
	wall    time.Duration
	ceiling time.Duration
}

func deadlinesOf(v abort.View) deadlines {
	dl := deadlines{wall: v.WallDeadline, ceiling: v.Ceiling}
	if v.Settings.StepTimeout > 0 && !v.Paused {
		dl.step = v.LivenessRef + v.Settings.StepTimeout
	}
	return dl
}

// passed returns the stop reason of the first deadline passed at now
// (ceiling, then step, then wall clock) and when it was due.
func (dl deadlines) passed(now time.Duration) (event.StopReason, time.Duration, bool) {
	switch {
	case dl.ceiling > 0 && now >= dl.ceiling:
		return event.ReasonMaxTurnTime, dl.ceiling, true
	case dl.step > 0 && now >= dl.step:
		return event.ReasonStepTimeout, dl.step, true
	case now >= dl.wall:
		return event.ReasonTimeout, dl.wall, true
	}
	return event.ReasonNone, 0, false
}

func decide(now time.Duration, v abort.View, p Policy, dl deadlines) Decision {
	if v.Released {
		return Decision{Action: Drop}
	}
	switch v.State {
	case abort.StateFinished:
		// Finished but not yet released: the engine releases it as soon as the
		// runner's call returns; nothing to do here.
		return Decision{}
	case abort.StateAborted:
		if v.Returned {
			return Decision{}
		}
		due := v.AbortedAt + v.Settings.AbortGrace
		if now >= due {
			return Decision{Action: ForceFinalize, Due: due}
		}
		return Decision{Next: due}
	}
	if !p.Enabled {
		return Decision{}
	}
	var next time.Duration
	soonest := func(t time.Duration) {
		if t > 0 && (next == 0 || t < next) {
			next = t
		}
	}
	if p.AutoAbort {
		if reason, due, ok := dl.passed(now); ok {
			return Decision{Action: Abort, Reason: reason, Due: due}
		}
		soonest(dl.ceiling)
		soonest(dl.step)
		soonest(dl.wall)
		if at, _, ok := v.Settings.WarnAt(v.Start, v.WallDeadline, v.Ceiling); ok && !v.Warned {
			if now >= at {
				return Decision{Action: Warn, Due: at}
			}
			soonest(at)
		}
	}
	if after := v.Settings.ProgressNotifyAfter; after > 0 && v.StepRunning && !v.Paused {
		due := v.StepStarted + after
		if v.NoticeSeq == v.StepSeq {
			due = max(due, v.LastNoticeAt+v.Settings.ProgressRepeat)
		}
		if now >= due {
			return Decision{Action: Progress, Due: due}
		}
		soonest(due)
	}
	return Decision{Next: next}
}

// quiet is how long a turn may go without progress before it is stalled
// (see Class); 0 = never.
func quiet(s timeout.Settings) time.Duration {
	if s.ProgressNotifyAfter > 0 {
		return s.ProgressNotifyAfter
	}
	return s.StepTimeout / 2
}

// classify is the Class of a turn at now, from its deadlines.
func classify(now time.Duration, v abort.View, dl deadlines) Class {
	switch {
	case v.Released || v.State == abort.StateFinished:
		return Working
	case v.State == abort.StateAborted:
		if v.Returned {
			return Working
		}
		return Stuck
	}
	if _, _, ok := dl.passed(now); ok {
		return Stuck
	}
	q := quiet(v.Settings)
	if v.Paused || q <= 0 {
		return Working
	}
	switch {
	case now-v.LivenessRef >= q:
		return Stalled
	case v.StepRunning && now-v.StepStarted >= q:
		return LongRunning
	}
	return Working
}
