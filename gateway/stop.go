// Stopping turns: Abort (a run, by run id or the session's active one,
// with any stop reason) and Stop (/stop: the running turn and the
// requester's queued messages), with their owner and session checks. In
// cluster mode a turn that runs on another replica is stopped there
// (clustered.go).

package gateway

import (
	"context"
	"fmt"
	"slices"

	"github.com/turnguard/turnguard/event"
)

// AbortResult reports what Abort stopped.
type AbortResult struct {
	Aborted bool
	RunIDs  []string
	// Dequeued: RunIDs names a queued message, removed from its session's
	// queue (and the QueueStore) before it started; Text is its text.
	Dequeued bool   `json:",omitempty"`
	Text     string `json:",omitempty"`
}

// Abort stops a run of sessionKey with reason: runID, or the session's
// active run when runID is "". Only the run's owner or an operator may abort
// it (ErrNotOwner); a runID of another session is ErrWrongSession. An unknown
// or finished run is not an error: Aborted is false. The Aborted event is
// published before Abort returns. A run whose TurnStarted is still being
// published is aborted right after it (so Abort must not be called from a
// bus handler, which must not block anyway).
//
// A runID of a message still waiting in its session's queue cancels that
// message (Dequeued): it leaves the queue, and the QueueStore before Abort
// returns, and never runs; the same owner rule applies (a message of no
// owner anyone may cancel).
func (e *Engine) Abort(ctx context.Context, sessionKey, runID string, reason event.StopReason, requester string, operator bool) (AbortResult, error) {
	e.mu.Lock()
	var t *turn
	if runID != "" {
		t = e.turns[runID]
		if _, queued := e.waiting[runID]; t == nil && queued {
			return e.dequeueLocked(ctx, sessionKey, runID, requester, operator)
		}
		if t == nil {
			if el, ok := e.outcomes[runID]; ok && el.Value.(*cached).out.SessionKey != sessionKey {
				e.mu.Unlock()
				return AbortResult{}, ErrWrongSession
			}
		}
	} else if s, ok := e.sessions[sessionKey]; ok && s.active != nil {
		t = e.turns[s.active.ID]
	}
	e.mu.Unlock()
	if t == nil {
		if e.cluster != nil {
			return e.abortElsewhere(ctx, sessionKey, runID, reason, requester, operator)
		}
		return AbortResult{RunIDs: []string{}}, nil
	}
	if t.run.SessionKey != sessionKey {
		return AbortResult{}, ErrWrongSession
	}
	if !operator && t.owner != "" && t.owner != requester {
		return AbortResult{}, ErrNotOwner
	}
	// A run is abortable once its TurnStarted is out (Send publishes it
	// right after registering), so no event of it precedes TurnStarted.
	select {
	case <-t.started:
	case <-ctx.Done():
		return AbortResult{}, fmt.Errorf("abort %s: %w", t.run.ID, context.Cause(ctx))
	}
	ev, ok := t.run.Abort(reason)
	if !ok {
		return AbortResult{RunIDs: []string{}}, nil
	}
	t.run.Publish(e.publish, ev) // Run.Abort armed the grace deadline itself
	return AbortResult{Aborted: true, RunIDs: []string{t.run.ID}}, nil
}

// StopResult reports what Stop did.
type StopResult struct {
	AbortResult
	// Stopping: the running turn was already being stopped.
	Stopping bool
	// Dropped counts the queued messages discarded.
	Dropped int
}

// Stop is /stop: it aborts the session's running turn with reason user and
// discards queued messages, on behalf of requester: the running turn must
// be requester's (its owner, or "" for anyone) unless operator, otherwise
// ErrNotOwner and nothing changes. Without operator only requester's own
// queued messages (and those of no owner) are dropped — in a shared session
// the others' stay; an operator drops them all. Messages steered into the
// turn and not taken by its runner are dropped the same way (the others'
// are queued next). The queue is dropped before the turn is aborted, so
// nothing dropped starts after the stop; the QueueStore forgets the
// dropped messages on its own goroutine (Stop never waits for a disk).
//
// In cluster mode a session whose turn runs on another replica is stopped
// there (Cluster.ForwardStop): its queue lives with its turn.
func (e *Engine) Stop(ctx context.Context, sessionKey, requester string, operator bool) (StopResult, error) {
	return e.StopWith(ctx, StopRequest{SessionKey: sessionKey, Requester: requester, Operator: operator})
}

// StopRequest is a /stop: Stop's arguments, and whether another replica
// passed it on (cluster mode: it is not passed on again).
type StopRequest struct {
	SessionKey string
	Requester  string
	Operator   bool
	Forwarded  bool
	// RunID, if set, is the turn the stop is meant for (a Stop button
	// under that turn, e.g. Telegram's on its draft): unless it is the
	// session's running turn, nothing is stopped and nothing dropped — a
	// tap that raced its turn's end does not stop the next one.
	RunID string
}

// StopWith is Stop with a StopRequest (the cluster's forwarded stops).
func (e *Engine) StopWith(ctx context.Context, req StopRequest) (StopResult, error) {
	sessionKey, requester, operator := req.SessionKey, req.Requester, req.Operator
	if e.cluster != nil && !req.Forwarded {
		e.mu.Lock()
		s := e.sessions[sessionKey]
		here := s != nil && (s.active != nil || len(s.queue) > 0)
		e.mu.Unlock()
		if !here {
			if res, ok, err := e.stopElsewhere(ctx, req); ok {
				return res, err
			}
		}
	}
	e.mu.Lock()
	s := e.sessions[sessionKey]
	if req.RunID != "" && (s == nil || s.active == nil || s.active.ID != req.RunID) {
		e.mu.Unlock()
		return StopResult{AbortResult: AbortResult{RunIDs: []string{}}}, nil
	}
	running := false
	var t *turn
	if s != nil && s.active != nil {
		running = true
		t = e.turns[s.active.ID]
		if t != nil && !operator && t.owner != "" && t.owner != requester {
			e.mu.Unlock()
			return StopResult{}, ErrNotOwner
		}
	}
	dropped := e.dropQueueLocked(s, requester, operator)
	n := len(dropped)
	requeue := func() {}
	if t != nil {
		var others []QueuedMessage
		for _, m := range e.takeSteeredLocked(t) {
			if droppable(m, requester, operator) {
				n++
			} else {
				others = append(others, m)
			}
		}
		requeue = e.requeueLocked(s, others)
	}
	e.mu.Unlock()
	go e.removeQueued(context.WithoutCancel(ctx), dropped)
	res, err := e.Abort(ctx, sessionKey, req.RunID, event.ReasonUser, requester, operator)
	go requeue() // stores others' steered messages: never waits for a disk
	if err != nil {
		return StopResult{Dropped: n}, err
	}
	return StopResult{AbortResult: res, Stopping: !res.Aborted && running, Dropped: n}, nil
}

// droppable reports whether requester may drop m: m is requester's or no
// one's, or requester is an operator.
func droppable(m QueuedMessage, requester string, operator bool) bool {
	return operator || m.Owner == "" || m.Owner == requester
}

// CancelQueued cancels the queued message runID of sessionKey on behalf of
// requester (a Cancel button under its "queued" answer): it leaves the
// queue, and the QueueStore before CancelQueued returns, and never runs.
// Unlike Abort it never stops a running turn: a run id that no longer
// waits (started, ended, dropped, unknown) is not an error, Aborted is
// false. The owner and session rules are Abort's (ErrNotOwner,
// ErrWrongSession). In cluster mode a run id not waiting here is passed to
// the replica that runs the session's turn, where its queue lives.
func (e *Engine) CancelQueued(ctx context.Context, sessionKey, runID, requester string, operator bool) (AbortResult, error) {
	e.mu.Lock()
	if _, ok := e.waiting[runID]; !ok || runID == "" {
		e.mu.Unlock()
		if e.cluster != nil && runID != "" {
			return e.cancelElsewhere(ctx, sessionKey, runID, requester, operator)
		}
		return AbortResult{RunIDs: []string{}}, nil
	}
	return e.dequeueLocked(ctx, sessionKey, runID, requester, operator)
}

// dequeueLocked cancels the queued message runID of sessionKey on behalf
// of requester (Abort or CancelQueued of a queued run id).
//
// Lock contract: called with e.mu held (by Abort and CancelQueued); it releases it,
// then forgets the message in the QueueStore and starts the session's
// next turn if removing it made the session's head startable.
func (e *Engine) dequeueLocked(ctx context.Context, sessionKey, runID, requester string, operator bool) (AbortResult, error) {
	q := e.waiting[runID]
	if q.sessionKey() != sessionKey {
		e.mu.Unlock()
		return AbortResult{}, ErrWrongSession
	}
	i := slices.IndexFunc(q.msgs, func(m QueuedMessage) bool { return m.RunID == runID })
	if i < 0 {
		e.mu.Unlock()
		return AbortResult{RunIDs: []string{}}, nil
	}
	m := q.msgs[i]
	if !droppable(m, requester, operator) {
		e.mu.Unlock()
		return AbortResult{}, ErrNotOwner
	}
	s := e.sessions[sessionKey]
	e.unqueueLocked(s, q, runID)
	start := func() {}
	if s != nil {
		start = e.pumpLocked(s)
	}
	e.mu.Unlock()
	e.removeQueued(ctx, []string{runID})
	e.tellCancel(QueueCancel{SessionKey: sessionKey, RunID: runID, Text: m.Text})
	start()
	return AbortResult{Aborted: true, RunIDs: []string{runID}, Dequeued: true, Text: m.Text}, nil
}
