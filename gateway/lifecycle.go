package gateway

import (
	"sync"

	"github.com/turnguard/turnguard/gateway/abort"
)

// A turn's lifecycle, in one place (docs/architecture.md has the table).
// This file grows into the explicit state machine of issue 20; for now it
// holds the pieces whose state used to be shared between two owners.

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
