// Stuck-runner accounting: a run force-finalized while its runner still
// runs (it ignored cancellation) counts against its runner until the runner
// returns; at server.maxStuckRuns the runner refuses new turns (Send's
// RunnerStuckError) and StuckRunsFunc is told of each edge.

package gateway

import "maps"

// StuckRunsFunc is told when a runner reaches its cap of stuck runs
// (saturated, new turns refused) and when it is below it again. Calls are
// edge-triggered (one per change), in order, outside the engine's main
// lock; it must not block or call the engine.
type StuckRunsFunc func(runner string, stuck, limit int, saturated bool)

// stuckChanged adds delta to runner's count of force-finalized runs still
// running and tells StuckRuns when the runner reaches server.maxStuckRuns
// or drops below it.
//
// Lock contract: called without e.mu; it takes it once and notifies
// after releasing it.
func (e *Engine) stuckChanged(runner string, delta int) {
	e.mu.Lock()
	notify := e.stuckChangedLocked(runner, delta)
	e.mu.Unlock()
	notify()
	if delta < 0 {
		e.pumpStalled()
	}
}

// stuckChangedLocked is stuckChanged with e.mu held; the caller calls the
// returned function once it has unlocked e.mu.
func (e *Engine) stuckChangedLocked(runner string, delta int) (notify func()) {
	if n, ok := e.recountStuckLocked(runner, delta); ok {
		return e.notifyStuckLocked([]stuckNotice{n})
	}
	return func() {}
}

// stuckNotice is one edge of a runner's saturation for StuckRuns.
type stuckNotice struct {
	runner       string
	stuck, limit int
	saturated    bool
}

// recountStuckLocked adds delta to runner's stuck runs and compares the
// count with the cap in force; it returns the notice to give when the
// runner's saturation changed. Called with e.mu held.
func (e *Engine) recountStuckLocked(runner string, delta int) (stuckNotice, bool) {
	limit := e.stuckLimit
	n := e.stuck[runner] + delta
	if n <= 0 {
		delete(e.stuck, runner)
	} else {
		e.stuck[runner] = n
	}
	at := limit > 0 && n >= limit
	if at == e.refusing[runner] {
		return stuckNotice{}, false
	}
	if at {
		e.refusing[runner] = true
	} else {
		delete(e.refusing, runner)
	}
	return stuckNotice{runner: runner, stuck: max(n, 0), limit: limit, saturated: at}, true
}

// notifyStuckLocked returns the function that gives notices, in order; the
// caller calls it once it has unlocked e.mu. notifyMu is taken before e.mu
// is released, so notices leave in the order the changes were made under
// e.mu.
//
// Lock contract: called with e.mu held, which it neither releases nor
// re-takes; when there are notices it takes notifyMu, and the returned
// function (which the caller must call exactly once, after unlocking
// e.mu) releases it — always, whatever the notices.
func (e *Engine) notifyStuckLocked(notices []stuckNotice) func() {
	if len(notices) == 0 {
		return func() {}
	}
	e.notifyMu.Lock()
	return func() {
		defer e.notifyMu.Unlock()
		for _, n := range notices {
			if n.saturated {
				e.log.Error("runner refuses new turns: too many of its runs ignored cancellation and still run",
					"runner", n.runner, "stuck", n.stuck, "limit", n.limit)
			} else {
				e.log.Info("runner accepts new turns again", "runner", n.runner, "stuck", n.stuck, "limit", n.limit)
			}
			if e.onStuck != nil {
				e.onStuck(n.runner, n.stuck, n.limit, n.saturated)
			}
		}
	}
}

// StuckRuns returns, by runner, the force-finalized runs whose runner has
// not returned yet.
func (e *Engine) StuckRuns() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.stuck)
}
