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
)

func (a Action) String() string {
	return [...]string{"none", "progress", "abort", "force_finalize", "drop"}[a]
}

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
//  4. a released run → Drop.
//
// Aborts take precedence over a progress notice due at the same moment.
// Force-finalization applies whatever the policy: it is the only way a
// session whose runner ignores an abort (including a user's /stop) becomes
// free again. Decide is pure: it reads only its arguments.
func Decide(now time.Duration, v abort.View, p Policy) Decision {
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
		stepDeadline := time.Duration(0)
		if v.Settings.StepTimeout > 0 && !v.Paused {
			stepDeadline = v.LivenessRef + v.Settings.StepTimeout
		}
		switch {
		case v.Ceiling > 0 && now >= v.Ceiling:
			return Decision{Action: Abort, Reason: event.ReasonMaxTurnTime, Due: v.Ceiling}
		case stepDeadline > 0 && now >= stepDeadline:
			return Decision{Action: Abort, Reason: event.ReasonStepTimeout, Due: stepDeadline}
		case now >= v.WallDeadline:
			return Decision{Action: Abort, Reason: event.ReasonTimeout, Due: v.WallDeadline}
		}
		soonest(v.Ceiling)
		soonest(stepDeadline)
		soonest(v.WallDeadline)
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
