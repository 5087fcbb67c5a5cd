// The engine's cluster transitions, named here and nowhere else:
//
//   - claim: Send's claim of a session (claimBeginLocked, Cluster.Claim
//     with no lock held, claimEndLocked), a queued turn's claim
//     (claimQueued), and the read-back of an answer that said nothing
//     (claimReadBack);
//   - finish: the claimed ending, recorded once (finishClaimed);
//   - fence: the lease lost, everything held under it dropped (Fenced);
//   - restore: a fenced or dead replica's stored queued messages run again
//     (cluster_restore.go);
//
// and forwarding aborts, stops and lookups to the replica that owns a
// session.

package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
)

// This file is the engine's side of the Cluster seam (cluster.go): what
// Send, the start of a queued turn, publish and Abort do differently when
// the engine is one replica of several. Nothing here runs without
// Options.Cluster.

// Bounds of the engine's calls into the cluster.
const (
	claimTimeout     = 10 * time.Second       // one claim of a queued turn
	readBackTimeout  = 5 * time.Second        // reading back a claim whose answer said nothing (claimReadBack)
	finishTimeout    = 5 * time.Second        // one attempt at recording an ending
	finishRetryFirst = 100 * time.Millisecond // the first wait after a failed attempt; doubles
	finishRetryMax   = 2 * time.Second
)

// sessionClaim is a claim of a session's turn Send makes in the cluster,
// begun by claimBeginLocked and ended by claimEndLocked.
type sessionClaim struct {
	req      ClaimRequest
	start    time.Duration // the turn's start in registry time: the claim's limits count from it
	claiming chan struct{} // s.claiming while the claim is in flight; closed when it ends
	fences   uint64        // e.fences when it began: a lease lost meanwhile voids it
}

// claimBeginLocked begins Send's claim of s (free on this replica) for req:
// s.claiming is set, so other messages of s and the queue's pump wait for
// its answer. A runner at its cap of stuck runs refuses the turn anyway:
// *RunnerStuckError, before claiming, so a refusal never holds a claim.
// The caller releases e.mu, calls Cluster.Claim with the claim's request,
// takes e.mu again and ends it with claimEndLocked, whatever the answer.
//
// Lock contract: called with e.mu held (by Send only); it runs entirely
// under it and neither releases nor re-takes it.
func (e *Engine) claimBeginLocked(cfg *config.Config, s *session, req SendRequest) (*sessionClaim, error) {
	name := cfg.RunnerFor(req.Channel)
	if n, limit := e.stuck[name], e.stuckLimit; limit > 0 && n >= limit {
		return nil, &RunnerStuckError{Runner: name, Stuck: n, Limit: limit}
	}
	// The turn starts now, before its claim: the claim writes the limits
	// its TurnStarted will carry (beginLocked registers the run with this
	// start), so the store's recorder writes nothing for it.
	start := e.reg.Now()
	st := cfg.TurnSettings(req.Channel, req.Timeout)
	deadline, ceiling := turnLimits(st, e.reg.Wall(start))
	c := &sessionClaim{
		req: ClaimRequest{RunID: req.RunID, SessionKey: req.SessionKey, Channel: req.Channel,
			ChatRef: req.ChatRef, Text: req.Text,
			Deadline: deadline, Ceiling: ceiling, StepTimeout: st.StepTimeout, Sender: req.Owner},
		start:    start,
		claiming: make(chan struct{}),
		fences:   e.fences,
	}
	s.claiming = c.claiming
	return c, nil
}

// claimEndLocked ends claim c of s with the cluster's answer err: s is no
// longer claiming. A nil effect: the claim is this replica's, and the
// caller begins the turn under the same hold of e.mu. Otherwise the turn
// does not begin here and the effect, run once e.mu is released, is Send's
// answer: the session is busy elsewhere (forwarded there, or *BusyError),
// the run id is known (its status), the cluster cannot decide, or this
// replica lost its lease or is shutting down meanwhile (*UnavailableError,
// ErrShutdown: the claim is released). When the cluster refused, the
// queue's pump, which waited for the claim (pumpLocked), starts what was
// queued meanwhile, in the effect.
//
// Lock contract: called with e.mu held (by Send only); it runs entirely
// under it and neither releases nor re-takes it.
func (e *Engine) claimEndLocked(s *session, c *sessionClaim, req SendRequest, err error) sendEffect {
	s.claiming = nil
	close(c.claiming)
	if err == nil && e.fences != c.fences {
		// Claimed under the lease this replica lost meanwhile: Fenced's
		// abort did not see it, and the survivor ends it as interrupted.
		// It must not run here (its reply would be refused); the client
		// retries with the same id and hears how it ended.
		return answer(Ack{}, &UnavailableError{Cause: fmt.Errorf("run %s: claimed as this replica lost its lease: %w", req.RunID, ErrLeaseLost)})
	}
	if err == nil {
		if e.closing {
			return func(context.Context) (Ack, error) {
				e.releaseClaim(req, ErrShutdown)
				return Ack{}, ErrShutdown
			}
		}
		return nil
	}
	start := e.pumpLocked(s)
	return func(ctx context.Context) (Ack, error) {
		start()
		return e.claimRefused(ctx, req, err)
	}
}

// abandonClaim releases Send's claim of s for req, on which no turn could
// begin (cause), then starts what the pump held back for the claim
// (pumpLocked).
//
// Lock contract: called without e.mu; it releases the claim unlocked, then
// takes e.mu itself for the pump and releases it before starting anything.
func (e *Engine) abandonClaim(s *session, req SendRequest, cause error) {
	e.releaseClaim(req, cause)
	e.mu.Lock()
	start := e.pumpLocked(s)
	e.mu.Unlock()
	start()
}

// claimRefused answers a Send whose claim the cluster refused.
//
// Lock contract: called without e.mu (it may forward to another replica);
// it does not take it.
func (e *Engine) claimRefused(ctx context.Context, req SendRequest, err error) (Ack, error) {
	var held *HeldError
	var exists *RunExistsError
	switch {
	case errors.As(err, &held):
		if req.Forwarded || held.Replica == e.cluster.Replica() {
			// Forwarded here already (the turn moved on meanwhile), or an
			// earlier life of this replica holds it until it is taken
			// over: busy, with the holder's run id.
			return Ack{}, &BusyError{SessionKey: req.SessionKey, RunID: held.RunID}
		}
		// The replica that runs the session's turn decides, with its busy
		// mode, as if the message had been sent there.
		fwd := req
		fwd.Forwarded = true
		ack, ferr := e.cluster.Forward(ctx, held.Replica, fwd)
		if errors.Is(ferr, ErrClusterUnavailable) {
			// That replica does not answer (it may be dying: a survivor
			// frees the session within the lease), or its answer was lost
			// after it queued the message. Not "busy" — a refusal the user
			// would answer with a new message, which could then run twice —
			// but a temporary failure: the client retries with the same
			// idempotency key, which the owner (or the survivor) answers.
			e.log.Warn("a message for a session another replica runs could not be forwarded there", "run", req.RunID,
				"session", req.SessionKey, "replica", held.Replica, "err", ferr)
			return Ack{}, &UnavailableError{Cause: fmt.Errorf("forwarding to replica %s: %w", held.Replica, ferr)}
		}
		return ack, ferr
	case errors.As(err, &exists):
		if exists.SessionKey != "" && exists.SessionKey != req.SessionKey {
			return Ack{}, fmt.Errorf("run %s: %w", req.RunID, ErrWrongSession)
		}
		if exists.Running {
			return Ack{RunID: req.RunID, Status: StatusInFlight}, nil
		}
		out := exists.Outcome
		if out == nil {
			out = &Outcome{RunID: req.RunID, SessionKey: req.SessionKey, StopReason: exists.StopReason, Status: statusOf(exists.StopReason)}
		}
		return Ack{RunID: req.RunID, Status: out.Status, Outcome: out}, nil
	default:
		return Ack{}, &UnavailableError{Cause: err}
	}
}

// statusOf is the status of a run that ended with reason.
func statusOf(reason event.StopReason) Status {
	switch reason {
	case event.ReasonStop:
		return StatusOK
	case event.ReasonError:
		return StatusError
	default:
		return StatusAborted
	}
}

// releaseClaim ends a claim the engine took but could not start a turn
// on (cause): the turn is recorded as failed, so the session is free again
// and the run id answers with that outcome.
//
// Lock contract: called without e.mu (it calls the cluster); it does not
// take it.
func (e *Engine) releaseClaim(req SendRequest, cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), finishTimeout)
	defer cancel()
	ev := event.Event{Kind: event.Finished, RunID: req.RunID, SessionKey: req.SessionKey, Channel: req.Channel,
		ChatRef: req.ChatRef, StopReason: event.ReasonError, Time: time.Now(),
		Message: messages.NotStarted}
	if err := e.cluster.Finish(ctx, ev); err != nil {
		e.log.Error("a claim that could not start a turn was not released; the session stays busy until this replica's lease is taken over",
			"run", req.RunID, "session", req.SessionKey, "cause", cause, "err", err)
	}
}

// claimQueued claims a queued message's turn, then starts it. If the
// session was claimed elsewhere in between (another replica took a message
// of it first) or the cluster cannot decide, the turn starts and ends at
// once with an error the user can act on: a queued message is never
// dropped silently. A claim whose answer is an error that does not say
// what happened (its answer was lost after it committed) is read back
// (claimReadBack): if it committed, the turn runs.
//
// Lock contract: called without e.mu, on its own goroutine (startTurn);
// it claims unlocked and takes e.mu only to read the fence count.
func (e *Engine) claimQueued(rn runner.Runner, t *turn, rt runner.Turn) {
	ctx, cancel := context.WithTimeout(e.baseCtx, claimTimeout)
	deadline, ceiling := turnLimits(t.run.Settings, t.run.StartedAt())
	err := e.cluster.Claim(ctx, ClaimRequest{RunID: t.run.ID, SessionKey: t.run.SessionKey, Channel: t.run.Channel,
		ChatRef: t.run.ChatRef, Text: rt.Message, Joined: t.joined,
		Deadline: deadline, Ceiling: ceiling, StepTimeout: t.run.Settings.StepTimeout, Sender: t.owner})
	cancel()
	if err != nil && e.claimReadBack(t.run.ID, t.run.SessionKey, err) {
		err = nil
	}
	e.mu.Lock()
	fenced := e.fences != t.fences
	e.mu.Unlock()
	if err == nil && !fenced {
		t.claimed.Store(true)
		e.launch(rn, t, rt)
		return
	}
	var exists *RunExistsError
	if fenced || errors.Is(err, ErrLeaseLost) || errors.As(err, &exists) {
		// Held under a lease this replica lost, or run elsewhere already:
		// its message runs (or ran) on the replica that took the session
		// over, not here, and no one is told it failed.
		e.log.Info("a queued message is left to the replica that took its session over",
			"run", t.run.ID, "session", t.run.SessionKey, "err", err)
		e.forgetUnstarted(t)
		return
	}
	text := messages.NotClaimed
	var held *HeldError
	if errors.As(err, &held) {
		if e.forwardQueued(t, rt, held) {
			return
		}
		text = messages.OvertakenInCluster
	}
	e.log.Warn("a queued message could not be claimed in the cluster; it ends with an error the user sees", "run", t.run.ID,
		"session", t.run.SessionKey, "err", err)
	e.launch(refusedRunner{text: text}, t, rt)
}

// forwardQueued hands queued turn t (claim refused: held is the turn
// that runs its session) to the replica that runs the session, as Send
// does with a new message: that replica queues it by its busy mode, or
// knows it already — a survivor that restored the stored queue while this
// replica's turn was ending has it queued or ran it. true: the message is
// that replica's now and t is forgotten here without a word. Issue 20
// (found by TestLifecycleModelCluster): ending it here as "overtaken"
// told the user to send again a message the survivor then ran. A turn
// of collected messages, one of this replica's own earlier life, or a
// forward that fails or is refused (busy, by that replica's mode) is not
// handed over: the caller ends it with an error the user can act on.
//
// Lock contract: called without e.mu; it forwards unlocked and takes e.mu
// only in forgetUnstarted.
func (e *Engine) forwardQueued(t *turn, rt runner.Turn, held *HeldError) bool {
	if len(t.joined) > 0 || held.Replica == e.cluster.Replica() {
		return false
	}
	ctx, cancel := context.WithTimeout(e.baseCtx, claimTimeout)
	defer cancel()
	ack, err := e.cluster.Forward(ctx, held.Replica, SendRequest{SessionKey: t.run.SessionKey, Channel: t.run.Channel,
		ChatRef: t.run.ChatRef, RunID: t.run.ID, Text: rt.Message, Owner: t.owner, Forwarded: true, Restored: true})
	if err != nil {
		e.log.Warn("a queued message whose session another replica took could not be handed to it", "run", t.run.ID,
			"session", t.run.SessionKey, "replica", held.Replica, "err", err)
		return false
	}
	e.log.Info("a queued message is handed to the replica that runs its session", "run", t.run.ID,
		"session", t.run.SessionKey, "replica", held.Replica, "status", ack.Status)
	e.forgetUnstarted(t)
	return true
}

// claimReadBack decides a claim of run runID in session key whose answer
// was err: true when the claim committed all the same — the cluster holds
// the session for runID on this replica (Holder) — though its answer was
// lost (a request cancelled mid-COMMIT). Issue 20: guessed "not claimed",
// the turn ended with an error while the cluster held its session for a
// run nothing ran, and every later message of the session failed until the
// replica's lease was taken over. Answers that say what happened (held by
// another run, the run id known, the lease lost) are not read back, and a
// read that fails too is "not committed": the caller tells the user.
//
// Lock contract: called without e.mu; it does not take it.
func (e *Engine) claimReadBack(runID, key string, err error) bool {
	var held *HeldError
	var exists *RunExistsError
	if errors.As(err, &held) || errors.As(err, &exists) || errors.Is(err, ErrLeaseLost) {
		return false
	}
	ctx, cancel := context.WithTimeout(e.baseCtx, readBackTimeout)
	defer cancel()
	holder, replica, ok, rerr := e.cluster.Holder(ctx, key)
	mine := rerr == nil && ok && holder == runID && replica == e.cluster.Replica()
	e.log.Warn("a claim's answer was an error; read back", "run", runID, "session", key, "err", err,
		"committed", mine, "read_err", rerr)
	return mine
}

// forgetUnstarted ends turn t, registered but never started (no event of it
// was published), without publishing anything: the session is freed and
// Wait answers that it does not know the run here. Nothing may abort it
// any more (its state leaves running first).
//
// Lock contract: called without e.mu; it takes it once, and releases it
// before releasing the run (released takes it again).
func (e *Engine) forgetUnstarted(t *turn) {
	t.run.Finish(event.ReasonError) // an Abort now changes nothing and publishes nothing
	t.run.MarkReturned()
	t.life.Store(1) // never ran: not a stuck run when released
	e.mu.Lock()
	t.lost, t.ended = true, true
	e.mu.Unlock()
	close(t.started) // Abort and Shutdown waiting for it find it over
	e.reg.Release(t.run)
}

// refusedRunner ends a turn at once with a message for the user.
type refusedRunner struct{ text string }

func (r refusedRunner) Run(context.Context, runner.Turn, runner.Callbacks) (runner.Result, error) {
	return runner.Result{}, &runner.UserError{Message: r.text}
}

// finishClaimed records ev, a terminal event, through the cluster when its
// turn is claimed, retrying transient failures. false: the turn is not
// this replica's any more (fenced, or a survivor took it over): ev must not
// be published.
func (e *Engine) finishClaimed(ev event.Event) bool {
	e.mu.Lock()
	t := e.turns[ev.RunID]
	e.mu.Unlock()
	if t == nil || !t.claimed.Load() {
		return true
	}
	wait := finishRetryFirst
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), finishTimeout)
		err := e.cluster.Finish(ctx, ev)
		cancel()
		switch {
		case err == nil:
			return true
		case errors.Is(err, ErrNotTurnOwner):
			e.log.Warn("a turn's ending was not published: this replica no longer owns the turn (its lease was lost; a survivor ends it as interrupted)",
				"run", ev.RunID, "session", ev.SessionKey, "stop_reason", ev.StopReason, "err", err)
			return false
		}
		e.log.Warn("recording a turn's ending failed; retrying", "run", ev.RunID, "attempt", attempt, "err", err)
		time.Sleep(wait) // until the database answers or this replica fences itself (2/3 of its lease)
		wait = min(2*wait, finishRetryMax)
	}
}

// schedPublish is the scheduler's publish: in cluster mode an ending is
// recorded in the database before it is published, and the scheduler must
// not wait for that (its other deadlines would be late), so the scheduler's
// endings are published on a goroutine of their own. An ending is a run's
// last event but ForceFinalized, which comes an abort grace later.
func (e *Engine) schedPublish(ev event.Event) {
	if e.cluster != nil && ev.Kind.Terminal() {
		go e.publish(ev)
		return
	}
	e.publish(ev)
}

// export hands a published event to the other replicas.
func (e *Engine) export(ev event.Event) {
	if e.cluster != nil {
		e.cluster.Export(ev)
	}
}

// abortElsewhere forwards an abort of a run this replica does not have to
// the replica that runs the session's turn.
func (e *Engine) abortElsewhere(ctx context.Context, sessionKey, runID string, reason event.StopReason, requester string, operator bool) (AbortResult, error) {
	holder, replica, ok, err := e.cluster.Holder(ctx, sessionKey)
	if err != nil {
		return AbortResult{}, &UnavailableError{Cause: err}
	}
	if !ok || replica == e.cluster.Replica() {
		return AbortResult{RunIDs: []string{}}, nil
	}
	// Another run id than the running one may be a message queued behind
	// it there, where the session's queue lives: that replica cancels it
	// (Abort of a queued run id) or answers that it knows no such run.
	target := holder
	if runID != "" {
		target = runID
	}
	return e.cluster.ForwardAbort(ctx, replica, AbortRequest{SessionKey: sessionKey, RunID: target, Reason: reason,
		Requester: requester, Operator: operator})
}

// cancelElsewhere passes CancelQueued of a run id not waiting here to the
// replica that runs the session's turn, where its queue lives; the running
// turn itself is never stopped by it.
func (e *Engine) cancelElsewhere(ctx context.Context, sessionKey, runID, requester string, operator bool) (AbortResult, error) {
	holder, replica, ok, err := e.cluster.Holder(ctx, sessionKey)
	if err != nil {
		return AbortResult{}, &UnavailableError{Cause: err}
	}
	if !ok || replica == e.cluster.Replica() || runID == holder {
		return AbortResult{RunIDs: []string{}}, nil
	}
	return e.cluster.ForwardAbort(ctx, replica, AbortRequest{SessionKey: sessionKey, RunID: runID, Reason: event.ReasonUser,
		Requester: requester, Operator: operator})
}

// stopElsewhere passes a /stop of a session this replica runs nothing of
// to the replica that runs its turn, where its queue is too; ok false when
// no other replica runs it (the stop is then this replica's to do).
func (e *Engine) stopElsewhere(ctx context.Context, req StopRequest) (StopResult, bool, error) {
	_, replica, ok, err := e.cluster.Holder(ctx, req.SessionKey)
	if err != nil {
		return StopResult{}, true, &UnavailableError{Cause: err}
	}
	if !ok || replica == e.cluster.Replica() {
		return StopResult{}, false, nil
	}
	req.Forwarded = true
	res, err := e.cluster.ForwardStop(ctx, replica, req)
	return res, true, err
}

// refresh forgets the cached history of session key when it is idle here
// (cluster mode): its turns may have run on another replica since, so the
// next use reloads it from the store — or, with a HistoryChecker, checks
// that the store shows no change since (checkHistory). It returns key.
//
// Lock contract: called without e.mu; it takes it once.
func (e *Engine) refresh(key string) string {
	if e.cluster == nil || (e.loadHist == nil && e.histCheck == nil) {
		return key
	}
	e.mu.Lock()
	if s, ok := e.sessions[key]; ok && s.loaded && !s.reset && s.active == nil && len(s.queue) == 0 && s.ending == 0 &&
		s.claiming == nil && s.loading == nil {
		if s.marked {
			s.cached = s.history // kept if the store shows no change (checkHistory)
		}
		s.loaded, s.history = false, nil
	}
	e.mu.Unlock()
	return key
}

// Fenced is told that this replica lost its cluster lease: every live turn
// is stopped (stop reason interrupted) and, since Cluster.Finish refuses
// their endings, nothing of them is published — the survivor that takes
// the lease over ends them and tells their users. It does not wait.
//
// Everything else held under the lost lease is dropped with them (issue 20,
// defects 3 and 8): the messages queued here, and those steered into a
// running turn and not taken yet, leave this replica's memory — not the
// QueueStore, from which the survivor that takes the session over runs
// them — and a queued turn whose claim was in flight is forgotten without
// a word if its claim fails (claimQueued). Nothing of them starts here or
// tells a user they failed: they run, once, elsewhere.
func (e *Engine) Fenced() {
	e.mu.Lock()
	e.fences++
	live := make([]*turn, 0, len(e.turns))
	for _, t := range e.turns {
		live = append(live, t)
		e.takeSteeredLocked(t)
	}
	dropped := 0
	for _, s := range e.sessions {
		for _, q := range slices.Clone(s.queue) {
			for _, m := range slices.Clone(q.msgs) {
				e.unqueueLocked(s, q, m.RunID)
				dropped++
			}
		}
		delete(e.stalled, s)
	}
	e.mu.Unlock()
	if dropped > 0 {
		e.log.Warn("this replica lost its lease: the messages queued here are left to the replica that takes their sessions over",
			"messages", dropped)
	}
	for _, t := range live {
		go func() {
			<-t.started
			if ev, ok := t.run.Abort(event.ReasonInterrupted); ok {
				t.run.Publish(e.publish, ev)
			}
		}()
	}
}

// Import calls h with the events other replicas publish and gap with a
// session whose events could not be delivered in order (Cluster.Import),
// for channels that show sessions whose turns may run anywhere (the
// WebSocket protocol). Without a cluster it does nothing. stop ends it.
func (e *Engine) Import(h event.Handler, gap func(sessionKey string)) (stop func()) {
	if e.cluster == nil {
		return func() {}
	}
	return e.cluster.Import(h, gap)
}

// Watches is what a Cluster may do beyond the interface: be told which
// sessions this replica's channels show, so that the other replicas
// publish a turn's live events only while some replica shows them
// (cluster/node: a turn nobody else watches publishes only its end).
// A Cluster without it carries every event to every replica.
type Watches interface {
	// Watching: this replica shows sessionKey's events to someone (on)
	// or no longer (off). It must not block.
	Watching(sessionKey string, on bool)
	// WatchingAll is Watching for every session.
	WatchingAll(on bool)
}

// Watching tells the cluster (if it asks, Watches) that a channel here
// shows session key's events to someone (on) or no longer (off): the first
// watcher of the session on this replica and its last. Called, in order,
// for each change; it never blocks. Without a cluster it does nothing.
func (e *Engine) Watching(key string, on bool) {
	if w, ok := e.cluster.(Watches); ok {
		w.Watching(key, on)
	}
}

// WatchingAll is Watching for every session (a connection that follows
// all of them, as the operator's view does).
func (e *Engine) WatchingAll(on bool) {
	if w, ok := e.cluster.(Watches); ok {
		w.WatchingAll(on)
	}
}
