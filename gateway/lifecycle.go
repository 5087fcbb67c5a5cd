// A turn's lifecycle: its named states and legal moves (Engine.move), and
// the liveness clock whose pauses two owners share. The transitions
// themselves are in turn.go; docs/architecture.md has the table.

package gateway

import (
	"slices"
	"sync"

	"github.com/turnguard/turnguard/gateway/abort"
)

// A turn's lifecycle, in one place (docs/architecture.md has the table).
// This file grows into the explicit state machine of issue 20: the named
// states and their legal moves, and the pieces whose state used to be
// shared between two owners (the liveness clock).

// turnState is where a turn is in its lifecycle. A turn exists from its
// registration (Send, or the pump of a queued message) until it is done;
// before and after, its session is idle as far as the turn is concerned.
//
//	starting ──launch──▶ running ──terminal event recorded──▶ ending ──▶ done
//	   │                    │                                   │
//	   │                    └──────force-finalized────────▶ forced ──▶ done
//	   └──forgotten (its claim failed after a lost lease)──▶ done
type turnState uint32

const (
	// turnStarting: registered, the session's active turn; TurnStarted is
	// not out (deferred behind the previous ending, or its queued
	// message's claim in flight). Nothing of it is published yet.
	turnStarting turnState = iota
	// turnRunning: TurnStarted is out and the runner runs.
	turnRunning
	// turnEnding: its terminal event is recorded (or refused by the
	// cluster) and being handed to subscribers; the runner may still run.
	turnEnding
	// turnForced: force-finalized before its runner returned: the session
	// is free and the runner counts as stuck until it returns.
	turnForced
	// turnDone: the terminal event is out (or was never to be published)
	// and the session is free; the turn left Engine.turns.
	turnDone
)

var turnStateNames = [...]string{"starting", "running", "ending", "forced", "done"}

func (s turnState) String() string {
	if int(s) < len(turnStateNames) {
		return turnStateNames[s]
	}
	return "unknown"
}

// turnMoves are the legal moves between turn states.
var turnMoves = map[turnState][]turnState{
	turnStarting: {turnRunning, turnDone},
	turnRunning:  {turnEnding, turnForced}, // forced first: its ending is still being recorded (cluster mode)
	turnEnding:   {turnForced, turnDone},
	turnForced:   {turnDone},
}

// move moves t to state to and reports whether the move was legal; an
// illegal move (a seam between the engine's flags that let something
// happen out of order) is logged and counted in Engine.illegalMoves (the
// model test checks it stays 0), and the state is left as it was.
func (e *Engine) move(t *turn, to turnState) bool {
	for {
		from := turnState(t.state.Load())
		if !slices.Contains(turnMoves[from], to) {
			e.illegalMoves.Add(1)
			e.log.Error("a turn moved out of its lifecycle's order", "run", t.run.ID, "session", t.run.SessionKey,
				"from", from, "to", to)
			return false
		}
		if t.state.CompareAndSwap(uint32(from), uint32(to)) {
			return true
		}
	}
}

// pauseReason is why a turn's liveness clock is stopped. The reasons are
// independent: the clock runs only when none holds.
type pauseReason int

const (
	// pauseRunner: the runner called Callbacks.Pause (and not Resume yet).
	// A runner's pause is a flag: pausing twice and resuming once resumes.
	pauseRunner pauseReason = iota
	// pauseQuestion: a question to the person is open (approvals.go); one
	// count per open question.
	pauseQuestion
)

// livenessClock decides when a turn's liveness clock (abort.Run's Pause and
// Resume) runs: iff the runner is not paused and no question is open. Each
// reason is kept on its own, so resuming one never restarts the clock while
// the other still holds (issue 20, defect 1). Safe for concurrent use; the
// run's Pause and Resume are called on the edges only, in order.
type livenessClock struct {
	run *abort.Run

	mu           sync.Mutex
	runnerPaused bool
	questions    int // open questions
}

// stopped reports whether a reason holds. Called with c.mu held.
func (c *livenessClock) stoppedLocked() bool { return c.runnerPaused || c.questions > 0 }

// pause adds reason; the clock stops if it ran.
func (c *livenessClock) pause(reason pauseReason) { c.change(reason, true) }

// resume removes reason (one question for pauseQuestion); the clock runs
// again when no reason is left.
func (c *livenessClock) resume(reason pauseReason) { c.change(reason, false) }

// change adds (on) or removes reason and stops or restarts the run's clock
// on an edge.
func (c *livenessClock) change(reason pauseReason, on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	was := c.stoppedLocked()
	switch {
	case reason == pauseRunner:
		c.runnerPaused = on
	case on:
		c.questions++
	default:
		c.questions = max(0, c.questions-1)
	}
	switch now := c.stoppedLocked(); {
	case now && !was:
		c.run.Pause()
	case was && !now:
		c.run.Resume()
	}
}

// running reports whether the clock runs (for tests and the model).
func (c *livenessClock) running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.stoppedLocked()
}
