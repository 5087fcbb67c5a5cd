// Busy modes: what Send does with a message for a session whose turn is
// running (queue, collect, steer, interrupt, reject), the session's queue
// of waiting turns, its bounds, and the pump that starts the next one when
// the session is free.

package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
)

// BusyMode says what Send does with a message for a session whose turn is
// running (agents.defaults.busy.mode, overridden per channel).
type BusyMode string

// The busy modes.
const (
	// BusyQueue: the message waits and runs as its own turn when the
	// running one ends, however it ends.
	BusyQueue BusyMode = "queue"
	// BusyCollect: messages that arrive while busy are joined into one
	// follow-up turn.
	BusyCollect BusyMode = "collect"
	// BusySteer: the message is handed to the running turn when its runner
	// can take it (runner.Steerer); otherwise it is queued (Ack.FellBack).
	// Until the runner takes it, it counts against busy.maxQueued and
	// busy.maxQueuedBytes like a queued message.
	BusySteer BusyMode = "steer"
	// BusyInterrupt: the running turn stops with reason superseded and the
	// message runs next.
	BusyInterrupt BusyMode = "interrupt"
	// BusyReject: Send answers *BusyError.
	BusyReject BusyMode = "reject"
)

// Valid reports whether m is one of the busy modes.
func (m BusyMode) Valid() bool {
	switch m {
	case BusyQueue, BusyCollect, BusySteer, BusyInterrupt, BusyReject:
		return true
	}
	return false
}

// The statuses of a message Send did not start at once.
const (
	// StatusQueued: the message waits behind the running turn (Ack.Ahead
	// messages before it). Its turn will start with Ack.RunID as its run id
	// (for collect: the run id of the follow-up turn it joined).
	StatusQueued Status = "queued"
	// StatusSteered: the message was handed to the running turn, whose run
	// id is Ack.RunID.
	StatusSteered Status = "steered"
	// StatusDropped: the message was dropped and will not run:
	// busy.maxQueued messages already waited and busy.overflow is drop-new
	// (Ack.Dropped holds its text).
	StatusDropped Status = "dropped"
)

// QueuedMessage is a message waiting for its session's running turn to end.
type QueuedMessage struct {
	RunID      string    `json:"runId"` // the run id its turn will have
	SessionKey string    `json:"sessionKey"`
	Channel    string    `json:"channel"`
	ChatRef    string    `json:"chatRef,omitempty"`
	Owner      string    `json:"-"`
	Text       string    `json:"text"`
	QueuedAt   time.Time `json:"queuedAt"`
	// Timeout is the message's per-request wall clock (SendRequest.Timeout;
	// 0: configured). Messages collected into one turn run with the first
	// one's.
	Timeout time.Duration `json:"-"`
	// Resume, when set, makes the message's turn a resumed attempt of a
	// turn cut off by a restart or a takeover (QueueStore restores it).
	Resume *Resume `json:"-"`
}

// queued is one turn waiting in its session's queue: one message, or (busy
// mode collect) several joined into one follow-up turn.
type queued struct {
	msgs    []QueuedMessage // msgs[0].RunID is the turn's run id
	timeout time.Duration
	mode    BusyMode // how it was queued (Ack.Busy)
	collect bool     // later messages join it (mode collect)
	// superseded: a newer message arrived in mode interrupt while this one
	// waited; it starts and is stopped at once with reason superseded, so
	// its sender hears what became of it and the newest message runs next.
	superseded bool
	// holding: a burst is being merged (busy.debounceMs): the session was
	// idle when its first message came; every message until holdUntil
	// joins it (and moves holdUntil on), and it does not start before.
	// Only ever the session's only entry.
	holding   bool
	holdUntil time.Time
	// persisting counts QueueStore.AddQueued calls in flight for its
	// messages: the turn may not start before they are done.
	persisting int
	// begun is closed when the turn is registered (or the entry dropped):
	// Wait waits on it for a queued run id, then for the turn turnID
	// (set before begun is closed; "" when dropped).
	begun  chan struct{}
	turnID string
}

// end closes begun (once): the entry started or was dropped. Called with
// e.mu held.
func (q *queued) end() {
	if !isClosed(q.begun) {
		close(q.begun)
	}
}

func (q *queued) runID() string      { return q.msgs[0].RunID }
func (q *queued) sessionKey() string { return q.msgs[0].SessionKey }

// text is the turn's message: collected messages are joined by a blank line.
func (q *queued) text() string {
	if len(q.msgs) == 1 {
		return q.msgs[0].Text
	}
	parts := make([]string, len(q.msgs))
	for i, m := range q.msgs {
		parts[i] = m.Text
	}
	return strings.Join(parts, "\n\n")
}

func (q *queued) ids() []string {
	ids := make([]string, len(q.msgs))
	for i, m := range q.msgs {
		ids[i] = m.RunID
	}
	return ids
}

// waitingLocked counts the messages waiting in s and the bytes of their
// text: those in its queue and those steered into its running turn that
// the runner has not taken yet (they are queued again when it ends).
// Called with e.mu held.
func (e *Engine) waitingLocked(s *session) (n, bytes int) {
	for _, q := range s.queue {
		for _, m := range q.msgs {
			n++
			bytes += len(m.Text)
		}
	}
	if s.active != nil {
		if t := e.turns[s.active.ID]; t != nil && t.inbox != nil {
			pn, pb := t.inbox.Pending()
			n, bytes = n+pn, bytes+pb
		}
	}
	return n, bytes
}

// roomLocked returns *QueueFullError when req may not wait in s: maxQueued
// messages already wait, or its text would bring those waiting past the
// channel's busy.maxQueuedBytes. Steered messages not yet taken count, so
// queueing them again when their turn ends never passes either bound.
// Called with e.mu held.
func (e *Engine) roomLocked(s *session, req SendRequest, maxQueued int) error {
	n, bytes := e.waitingLocked(s)
	if n >= maxQueued {
		return &QueueFullError{SessionKey: req.SessionKey, Limit: maxQueued}
	}
	if budget := e.cfg.Current().QueuedBytesFor(req.Channel); bytes+len(req.Text) > budget {
		return &QueueFullError{SessionKey: req.SessionKey, Limit: maxQueued, Bytes: budget}
	}
	return nil
}

// queuedAckLocked answers a message waiting in q. Called with e.mu held.
func (e *Engine) queuedAckLocked(q *queued) Ack {
	if q.holding {
		// A burst being merged (busy.debounceMs): its turn starts by
		// itself when the burst ends.
		return Ack{RunID: q.runID(), Status: StatusStarted}
	}
	ack := Ack{RunID: q.runID(), Status: StatusQueued, Busy: q.mode}
	if s := e.sessions[q.sessionKey()]; s != nil {
		ack.Ahead = max(slices.Index(s.queue, q), 0)
	}
	return ack
}

// sendEffect is the part of Send's answer that runs after e.mu is
// released: it may call the store or the cluster, and takes e.mu again
// itself, as a separate step, when it needs it. A function that decides
// under e.mu returns one instead of releasing the lock its caller holds.
type sendEffect func(ctx context.Context) (Ack, error)

// answer is a sendEffect that only answers ack, err.
func answer(ack Ack, err error) sendEffect {
	return func(context.Context) (Ack, error) { return ack, err }
}

// busyLocked decides what becomes of a message for session s, which has a
// running turn or messages waiting, in busy mode mode (not reject): refused
// (*QueueFullError), steered into the running turn, or queued (in s.queue
// already, not yet stored). It returns Send's answer as an effect, to run
// once e.mu is released: storing the queued message (storeQueued) or the
// answer alone.
//
// Lock contract: called with e.mu held (by Send only); it runs entirely
// under it and neither releases nor re-takes it.
func (e *Engine) busyLocked(s *session, req SendRequest, mode BusyMode, maxQueued int) sendEffect {
	var dropped []QueuedMessage // drop-old: the messages dropped to make room
	if err := e.roomLocked(s, req, maxQueued); err != nil && !req.Restored {
		var full *QueueFullError
		if !errors.As(err, &full) || full.Bytes > 0 {
			return answer(Ack{}, err)
		}
		switch e.cfg.Current().OverflowFor(req.Channel) {
		case config.OverflowDropNew:
			return answer(Ack{RunID: req.RunID, Status: StatusDropped, Busy: mode, Dropped: []string{req.Text}, Limit: maxQueued}, nil)
		case config.OverflowDropOld:
			if dropped = e.dropOldestLocked(s, req, maxQueued); dropped == nil {
				return answer(Ack{}, err)
			}
		default:
			return answer(Ack{}, err)
		}
	}
	if n := len(s.queue); n > 0 && s.queue[n-1].holding {
		// A burst being merged (busy.debounceMs): this message joins it,
		// whatever the busy mode.
		return e.joinHoldLocked(s, s.queue[n-1], req)
	}
	fellBack := false
	if mode == BusySteer {
		if s.active != nil && len(s.queue) == 0 && s.active.State() == abort.StateRunning {
			if t := e.turns[s.active.ID]; t != nil && t.inbox != nil && t.inbox.Put(req.Text) {
				now := time.Now()
				e.appendHistoryLocked(s, Message{Role: "user", Text: req.Text, Time: now}, e.cfg.Current().Server.HistoryLimit)
				s.updated = now
				id := s.active.ID
				// Its run id answers for the turn it joined (a retry is not
				// steered again), until its runner leaves it untaken
				// (requeueLocked).
				t.steered = append(t.steered, QueuedMessage{RunID: req.RunID, SessionKey: req.SessionKey, Channel: req.Channel,
					ChatRef: req.ChatRef, Owner: req.Owner, Text: req.Text, QueuedAt: now, Timeout: req.Timeout})
				t.aliases = append(t.aliases, req.RunID)
				e.alias[req.RunID] = id
				return answer(Ack{RunID: id, Status: StatusSteered, Busy: BusySteer}, nil)
			}
		}
		fellBack = true
	}
	qm := QueuedMessage{RunID: req.RunID, SessionKey: req.SessionKey, Channel: req.Channel, ChatRef: req.ChatRef,
		Owner: req.Owner, Text: req.Text, QueuedAt: time.Now(), Timeout: req.Timeout, Resume: req.Resume}
	q := e.enqueueLocked(s, qm, mode)
	q.persisting++
	var victim string
	if mode == BusyInterrupt {
		if s.active != nil && s.active.State() == abort.StateRunning {
			victim = s.active.ID
		}
		// The messages waiting ahead of this one (an earlier interrupt
		// whose victim is still stopping) are replaced too.
		for _, w := range s.queue {
			if w != q {
				w.superseded = true
			}
		}
	}
	return func(ctx context.Context) (Ack, error) {
		texts := make([]string, len(dropped))
		ids := make([]string, len(dropped))
		for i, m := range dropped {
			texts[i], ids[i] = m.Text, m.RunID
		}
		e.removeQueued(ctx, ids)
		ack, err := e.storeQueued(ctx, s, q, qm, mode, fellBack, victim)
		if err == nil && len(texts) > 0 {
			ack.Dropped, ack.DroppedIDs, ack.Limit = texts, ids, maxQueued
		}
		return ack, err
	}
}

// storeQueued stores qm, queued as q in s by busyLocked (q.persisting
// counts it), then answers Send: queued (Ahead, FellBack), started (the
// session was free by then and the pump started it), aborted (dropped by
// /stop or /new while it was being stored), or the store's error (the
// message leaves the queue). In mode interrupt it then stops victim, the
// running turn it supersedes.
//
// Lock contract: called without e.mu; it takes e.mu itself, once, after
// the store answered, and releases it before starting anything or
// aborting the victim.
func (e *Engine) storeQueued(ctx context.Context, s *session, q *queued, qm QueuedMessage, mode BusyMode, fellBack bool, victim string) (Ack, error) {
	var err error
	if e.qstore != nil {
		err = e.qstore.AddQueued(ctx, qm)
	}

	e.mu.Lock()
	q.persisting--
	if err != nil {
		e.unqueueLocked(s, q, qm.RunID)
		start := e.pumpLocked(s)
		e.mu.Unlock()
		start()
		return Ack{}, fmt.Errorf("queueing the message: %w", err)
	}
	if !slices.Contains(s.queue, q) || e.waiting[qm.RunID] != q {
		// Dropped (/stop, /new, busy.overflow drop-old, cancelled) while it
		// was being stored.
		e.mu.Unlock()
		go e.removeQueued(context.WithoutCancel(ctx), []string{qm.RunID})
		return Ack{RunID: qm.RunID, Status: StatusAborted, Busy: mode}, nil
	}
	ack := e.queuedAckLocked(q)
	ack.FellBack = fellBack
	start := e.pumpLocked(s)
	if _, ok := e.turns[q.runID()]; ok && q.begun != nil && isClosed(q.begun) {
		ack = Ack{RunID: q.runID(), Status: StatusStarted} // the session was free: it started at once
	}
	e.mu.Unlock()
	start()
	if victim != "" {
		// Queued first: the pump starts it as soon as the superseded turn
		// has ended and freed the session.
		if _, err := e.Abort(ctx, qm.SessionKey, victim, event.ReasonSuperseded, qm.Owner, false); err != nil {
			e.log.Info("interrupt: the running turn was not stopped; the message waits", "run", victim, "err", err)
			ack.Busy = BusyQueue
		}
	}
	return ack, nil
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// enqueueLocked adds qm to s's queue — to the last waiting turn when both
// are collected (that turn keeps its first message's timeout) — and returns
// its entry. Called with e.mu held.
func (e *Engine) enqueueLocked(s *session, qm QueuedMessage, mode BusyMode) *queued {
	var q *queued
	if n := len(s.queue); mode == BusyCollect && n > 0 && s.queue[n-1].collect {
		q = s.queue[n-1]
		q.msgs = append(q.msgs, qm)
	} else {
		q = &queued{msgs: []QueuedMessage{qm}, timeout: qm.Timeout, mode: mode, collect: mode == BusyCollect,
			begun: make(chan struct{})}
		s.queue = append(s.queue, q)
	}
	e.waiting[qm.RunID] = q
	return q
}

// unqueueLocked removes the message runID from q (and q from s's queue when
// it was its last). Called with e.mu held.
func (e *Engine) unqueueLocked(s *session, q *queued, runID string) {
	delete(e.waiting, runID)
	q.msgs = slices.DeleteFunc(q.msgs, func(m QueuedMessage) bool { return m.RunID == runID })
	if len(q.msgs) == 0 {
		s.queue = slices.DeleteFunc(s.queue, func(x *queued) bool { return x == q })
		q.end()
	}
}

// dropQueueLocked drops the messages in s's queue (nil s: nothing) that
// requester may drop (droppable) and returns their run ids. Called with
// e.mu held.
func (e *Engine) dropQueueLocked(s *session, requester string, operator bool) []string {
	if s == nil {
		return nil
	}
	var ids []string
	for _, q := range slices.Clone(s.queue) {
		for _, m := range slices.Clone(q.msgs) {
			if droppable(m, requester, operator) {
				e.unqueueLocked(s, q, m.RunID)
				ids = append(ids, m.RunID)
			}
		}
	}
	if len(s.queue) == 0 {
		delete(e.stalled, s)
	}
	return ids
}

// pumpLocked starts the next queued turn of s if s is free: no active turn,
// no ending on its way to subscribers (ended pumps after it), not shutting
// down, and the head stored. It returns the function that starts it (a no-op
// when nothing starts), to call once e.mu is released. Called with e.mu held.
func (e *Engine) pumpLocked(s *session) func() {
	delete(e.stalled, s)
	var forgets []func() // the dropped heads' (they could not start)
	dropped := func() {
		for _, f := range forgets {
			f()
		}
	}
	// Not while a claim of the session is in flight (cluster): it may win
	// the session; claimEndLocked pumps when it did not.
	for !e.closing && s.active == nil && s.ending == 0 && s.claiming == nil && len(s.queue) > 0 && s.queue[0].persisting == 0 &&
		!s.queue[0].holding {
		q := s.queue[0]
		first := q.msgs[0]
		req := SendRequest{SessionKey: first.SessionKey, Channel: first.Channel, ChatRef: first.ChatRef,
			RunID: first.RunID, Text: q.text(), Timeout: q.timeout, Owner: first.Owner, Resume: first.Resume}
		start, err := e.beginLocked(e.cfg.Current(), s, req, 0)
		var stuck *RunnerStuckError
		if errors.As(err, &stuck) {
			// It waits: the session's next message or a restart tries again.
			e.log.Warn("a queued message waits: its runner refuses new turns", "run", req.RunID, "session", s.key, "err", err)
			e.stalled[s] = true
			return dropped
		}
		s.queue = s.queue[1:]
		ids := q.ids()
		for _, id := range ids {
			delete(e.waiting, id)
		}
		if err == nil {
			q.turnID = req.RunID
		}
		q.end()
		if err != nil {
			// Not the runner's state: this message can never start. The
			// next one may. The store forgets it on its own goroutine: the
			// pump may run on the scheduler's or a publisher's, which must
			// not wait for a disk.
			e.log.Error("a queued message could not start and was dropped", "run", req.RunID, "session", s.key, "err", err)
			forgets = append(forgets, func() { go e.removeQueued(context.Background(), ids) })
			continue
		}
		// A started turn's queued rows are deleted by the store in the
		// transaction that records its TurnStarted (with Joined): exactly
		// once across a crash.
		if t := e.turns[req.RunID]; t != nil {
			t.queuedAt = first.QueuedAt
		}
		if t := e.turns[req.RunID]; t != nil && len(ids) > 1 {
			t.aliases = ids[1:]
			t.joined = ids[1:]
			for _, a := range t.aliases {
				e.alias[a] = req.RunID
			}
		}
		if q.superseded {
			key, id := s.key, req.RunID
			return func() {
				dropped()
				start()
				// Replaced while it waited: stopped as soon as it started
				// (its TurnStarted is out), so its sender reads why.
				if _, err := e.Abort(context.Background(), key, id, event.ReasonSuperseded, "", true); err != nil {
					e.log.Info("interrupt: a replaced queued message was not stopped", "run", id, "err", err)
				}
			}
		}
		return func() {
			dropped()
			start()
		}
	}
	return dropped
}

// pumpStalled tries again the sessions whose queue waited for a runner that
// refused new turns.
//
// Lock contract: called without e.mu; it takes it once.
func (e *Engine) pumpStalled() {
	e.mu.Lock()
	var starts []func()
	for _, s := range slices.Collect(maps.Keys(e.stalled)) { // pumpLocked changes the map
		starts = append(starts, e.pumpLocked(s))
	}
	e.mu.Unlock()
	for _, start := range starts {
		start()
	}
}

// requeueSteered puts the steered messages t's runner never took at the
// head of its session's queue (requeueLocked), once its runner returned.
//
// Lock contract: called without e.mu; it takes it once.
func (e *Engine) requeueSteered(t *turn) {
	e.mu.Lock()
	after := e.requeueLocked(e.sessions[t.run.SessionKey], e.takeSteeredLocked(t))
	e.mu.Unlock()
	after()
}

// takeSteeredLocked closes t's inbox (the runner takes nothing more) and
// returns the messages steered into t that its runner never took, oldest
// first. Called with e.mu held (inbox.Put is too, so the inbox's texts are
// the last of t.steered).
func (e *Engine) takeSteeredLocked(t *turn) []QueuedMessage {
	if t.inbox == nil {
		return nil
	}
	n := min(len(t.inbox.Close()), len(t.steered))
	untaken := slices.Clone(t.steered[len(t.steered)-n:])
	t.steered = t.steered[:len(t.steered)-n]
	return untaken
}

// requeueLocked puts msgs (steered messages never taken) at the head of
// s's queue (they counted as waiting since they were steered, so the queue
// does not pass busy.maxQueued or busy.maxQueuedBytes by them), joined into one turn under their own run ids (a retry is
// answered queued, no longer by the turn they were steered into). It
// returns the function to call once e.mu is released: it stores them in
// the QueueStore (so a shutdown or a crash does not lose them; the turn
// waits for that) and then starts the session's next turn if the session
// is free (its turn may have been force-finalized long ago). Called with
// e.mu held.
func (e *Engine) requeueLocked(s *session, msgs []QueuedMessage) func() {
	if s == nil || len(msgs) == 0 {
		return func() {}
	}
	q := &queued{msgs: msgs, timeout: msgs[0].Timeout, mode: BusySteer, begun: make(chan struct{})}
	for _, m := range msgs {
		delete(e.alias, m.RunID)
		e.waiting[m.RunID] = q
	}
	s.queue = append([]*queued{q}, s.queue...)
	q.persisting++
	return func() {
		if e.qstore != nil {
			ctx, cancel := context.WithTimeout(context.Background(), queueStoreTimeout)
			for _, m := range msgs {
				if err := e.qstore.AddQueued(ctx, m); err != nil {
					e.log.Error("storing a steered message its turn never took failed: a restart loses it", "run", m.RunID, "err", err)
				}
			}
			cancel()
		}
		e.mu.Lock()
		q.persisting--
		var gone []string // dropped (/stop, /new) while being stored
		for _, m := range msgs {
			if _, ok := e.waiting[m.RunID]; !ok || !slices.Contains(s.queue, q) {
				gone = append(gone, m.RunID)
			}
		}
		start := e.pumpLocked(s)
		e.mu.Unlock()
		start()
		e.removeQueued(context.Background(), gone)
	}
}
