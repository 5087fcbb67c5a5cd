// The idempotency cache: the recorded outcomes kept for
// server.idempotencyTTLSeconds (cached, purgeExpired), the answer to a run
// id Send already knows (repeatLocked), and Wait, which blocks until a run
// has its outcome.

package gateway

import (
	"context"
	"fmt"
	"time"
)

// cached is a recorded outcome in the idempotency cache (Engine.outcomes),
// kept for server.idempotencyTTLSeconds.
type cached struct {
	out     Outcome
	expires time.Time
	aliases []string // the run ids of the messages collected into this turn besides its own
}

// repeatLocked answers a run id Send already knows: ended (the cached
// outcome), running (StatusInFlight), waiting in a queue (StatusQueued),
// or a message collected or steered into another turn (that turn's). ok
// false: a new run id.
//
// Lock contract: called with e.mu held (by Send, and by mergeStoredLocked
// to skip what this replica knows); it runs entirely under it and neither
// releases nor re-takes it.
func (e *Engine) repeatLocked(req SendRequest) (Ack, bool, error) {
	key := req.RunID // the run to answer for: a collected or steered message's is its turn's
	if id, ok := e.alias[key]; ok {
		key = id
	}
	// A repeated key is answered with the outcome as soon as it is recorded
	// (a client that saw the terminal event must get it), before the turn
	// is done (Wait waits for that).
	if el, ok := e.outcomes[key]; ok {
		out := el.Value.(*cached).out
		if out.SessionKey != req.SessionKey {
			return Ack{}, true, fmt.Errorf("run %s: %w", req.RunID, ErrWrongSession)
		}
		return Ack{RunID: key, Status: out.Status, Outcome: &out}, true, nil
	}
	if t, ok := e.turns[key]; ok {
		if t.run.SessionKey != req.SessionKey {
			return Ack{}, true, fmt.Errorf("run %s: %w", req.RunID, ErrWrongSession)
		}
		return Ack{RunID: key, Status: StatusInFlight}, true, nil
	}
	if q, ok := e.waiting[req.RunID]; ok {
		if q.sessionKey() != req.SessionKey {
			return Ack{}, true, fmt.Errorf("run %s: %w", req.RunID, ErrWrongSession)
		}
		return e.queuedAckLocked(q), true, nil
	}
	return Ack{}, false, nil
}

// purgeExpired forgets the cached outcomes (and their aliases) expired at
// now. Called with e.mu held.
func (e *Engine) purgeExpired(now time.Time) {
	for el := e.expiry.Front(); el != nil; el = e.expiry.Front() {
		c := el.Value.(*cached)
		if c.expires.After(now) {
			return
		}
		e.expiry.Remove(el)
		if e.outcomes[c.out.RunID] == el {
			delete(e.outcomes, c.out.RunID)
		}
		for _, a := range c.aliases {
			if e.alias[a] == c.out.RunID {
				delete(e.alias, a)
			}
		}
	}
}

// Wait blocks until run runID has an outcome or ctx is done. ok is false for
// an unknown run (or one whose outcome has expired), for a run whose ending
// the cluster refused (this replica lost it; the survivor's outcome is the
// one that stands) and when ctx ends first. When Wait returns an outcome, the run's terminal event has been published
// and its session is free (unless a runner ignoring cancellation keeps it
// until force-finalization): the next message is accepted.
func (e *Engine) Wait(ctx context.Context, runID string) (Outcome, bool) {
	e.mu.Lock()
	e.purgeExpired(time.Now())
	if id, ok := e.alias[runID]; ok {
		runID = id // collected into that turn
	}
	// A live turn first: its outcome may be cached already, but it is done
	// only once its ending is published and its session is free.
	t, ok := e.turns[runID]
	if q, queued := e.waiting[runID]; !ok && queued {
		// Queued: wait for its turn to be registered (or dropped), then
		// for that turn (a collected message's is the first one's).
		e.mu.Unlock()
		select {
		case <-q.begun:
			if q.turnID == "" {
				return Outcome{}, false // dropped
			}
			return e.Wait(ctx, q.turnID)
		case <-ctx.Done():
			return Outcome{}, false
		}
	}
	if !ok {
		el, ok := e.outcomes[runID]
		e.mu.Unlock()
		if !ok {
			return Outcome{}, false
		}
		return el.Value.(*cached).out, true
	}
	e.mu.Unlock()
	select {
	case <-t.done:
		e.mu.Lock()
		defer e.mu.Unlock()
		if t.lost {
			return Outcome{}, false // the survivor that took it over has its outcome
		}
		return t.out, true
	case <-ctx.Done():
		return Outcome{}, false
	}
}
