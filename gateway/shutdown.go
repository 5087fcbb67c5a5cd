// Shutdown: refuse new turns, abort every running one with reason
// shutdown, wait for the runs to be released (at most the longest abort
// grace) and force-finalize the rest; and the live-turn snapshots
// diagnostics read.

package gateway

import (
	"context"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
)

// drainedLocked returns a channel closed when no turn is live. Called with
// e.mu held.
func (e *Engine) drainedLocked() <-chan struct{} {
	if len(e.turns) == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	if e.drained == nil {
		e.drained = make(chan struct{})
	}
	return e.drained
}

// Shutdown stops the engine: new turns are refused, every running turn is
// aborted with reason shutdown (its users get the shutdown message), and
// Shutdown waits until every run is released, at most the longest abort
// grace (or until ctx ends); runs still held then are force-finalized.
func (e *Engine) Shutdown(ctx context.Context) {
	e.mu.Lock()
	e.closing = true
	// Every run is registered under e.mu while not closing, so this is all
	// of them; each is aborted only once its TurnStarted is out.
	live := make([]*turn, 0, len(e.turns))
	for _, t := range e.turns {
		live = append(live, t)
	}
	e.mu.Unlock()
	var grace time.Duration
	for _, t := range live {
		<-t.started // Send publishes it right after registering, without waiting on anything
		r := t.run
		grace = max(grace, r.Settings.AbortGrace)
		if ev, ok := r.Abort(event.ReasonShutdown); ok {
			r.Publish(e.publish, ev)
		}
	}
	e.mu.Lock()
	drained := e.drainedLocked()
	e.mu.Unlock()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-drained:
	case <-timer.C:
	case <-ctx.Done():
	}
	for _, r := range e.reg.Runs() {
		cur, last := r.CurrentStep()
		if e.reg.Release(r) {
			r.Publish(e.publish, event.Event{Kind: event.ForceFinalized, StopReason: r.StopReason(), Step: cur, LastStep: last})
		}
	}
	if e.cancel != nil {
		e.cancel()
	}
}

// Live returns snapshots of the live turns, each with its stall class.
func (e *Engine) Live() []abort.Snapshot {
	runs := e.reg.Runs()
	out := make([]abort.Snapshot, 0, len(runs))
	for _, r := range runs {
		out = append(out, e.snapshot(r))
	}
	sortSnapshots(out)
	return out
}
