// Queue controls: a session's own busy mode (/queue), kept in
// Options.Settings across restarts, and the snapshot /queue shows; what
// becomes of a message past busy.maxQueued (busy.overflow drop-old;
// drop-new and reject are answers of busyLocked); the merging of a burst
// of messages into one turn (busy.debounceMs).

package gateway

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// SessionSettings keeps a session's own settings across restarts (the
// busy mode /queue <mode> sets). Implemented by the store (adapted in
// cmd/gateway); optional (nil: they live in memory until the session is
// evicted).
type SessionSettings interface {
	// BusyModeOf returns the busy mode set for sessionKey, "" for none.
	BusyModeOf(ctx context.Context, sessionKey string) (string, error)
	// SetBusyMode records mode for sessionKey durably; "" forgets it.
	SetBusyMode(ctx context.Context, sessionKey, mode string) error
}

// QueueInfo is what /queue shows of a session: the busy rules in force
// for its messages and what waits.
type QueueInfo struct {
	Mode BusyMode
	// Own: Mode was set for this session (/queue <mode>), not configured.
	Own       bool
	Overflow  string // busy.overflow
	MaxQueued int
	Debounce  time.Duration // busy.debounceMs in force: 0 in cluster mode, where it is ignored
	// Queue lists the waiting messages, oldest first (StatusOf's).
	Queue []QueuedMessage
}

// QueueInfo returns the session's busy rules for messages from channel and
// what waits (wherever its turn runs: StatusOf, whose error it returns
// along with this replica's view).
func (e *Engine) QueueInfo(ctx context.Context, sessionKey, channel string) (QueueInfo, error) {
	s, err := e.session(ctx, sessionKey)
	if err != nil {
		return QueueInfo{}, fmt.Errorf("queue of %s: %w", sessionKey, err)
	}
	cfg := e.cfg.Current()
	mode, maxQueued := cfg.BusyFor(channel)
	info := QueueInfo{Mode: BusyMode(mode), Overflow: cfg.OverflowFor(channel), MaxQueued: maxQueued, Debounce: cfg.DebounceFor(channel)}
	if e.cluster != nil {
		info.Debounce = 0 // ignored in cluster mode (Send; config.Warnings says so)
	}
	e.mu.Lock()
	if s.busyMode != "" {
		info.Mode, info.Own = s.busyMode, true
	}
	e.mu.Unlock()
	st, err := e.StatusOf(ctx, sessionKey)
	info.Queue = st.Queue
	return info, err
}

// SetBusyMode sets the busy mode of sessionKey's messages (/queue <mode>),
// over the channel's configured one; "" goes back to the configured one.
// It is stored (Options.Settings) before it applies: on return it holds
// across a restart. An invalid mode is ErrInvalidBusyMode.
func (e *Engine) SetBusyMode(ctx context.Context, sessionKey string, mode BusyMode) error {
	if mode != "" && !mode.Valid() {
		return fmt.Errorf("busy mode %q: %w", mode, ErrInvalidBusyMode)
	}
	s, err := e.session(ctx, sessionKey)
	if err != nil {
		return fmt.Errorf("busy mode of %s: %w", sessionKey, err)
	}
	if e.settings != nil {
		if err := e.settings.SetBusyMode(ctx, sessionKey, string(mode)); err != nil {
			return fmt.Errorf("busy mode of %s: %w", sessionKey, err)
		}
	}
	e.mu.Lock()
	if e.sessions[sessionKey] == s {
		s.busyMode = mode
	}
	e.mu.Unlock()
	return nil
}

// loadBusyMode reads the busy mode stored for s (loadHistory calls it with
// the history). Called without e.mu; the caller installs the result.
func (e *Engine) loadBusyMode(ctx context.Context, key string) BusyMode {
	if e.settings == nil {
		return ""
	}
	m, err := e.settings.BusyModeOf(ctx, key)
	if err != nil {
		e.log.Warn("loading the session's busy mode failed; the configured one applies", "session", key, "err", err)
		return ""
	}
	if mode := BusyMode(m); mode.Valid() {
		return mode
	}
	return ""
}

// dropOldestLocked makes room for req in s (busy.overflow drop-old): it
// drops the oldest waiting messages until fewer than maxQueued wait, and
// returns them; nil, dropping nothing, when that cannot make room (only
// messages steered into the running turn wait, or req's text would still
// pass busy.maxQueuedBytes). The QueueStore is the caller's to tell.
// Called with e.mu held.
func (e *Engine) dropOldestLocked(s *session, req SendRequest, maxQueued int) []QueuedMessage {
	n, bytes := e.waitingLocked(s)
	var plan []QueuedMessage
	for _, q := range s.queue {
		for _, m := range q.msgs {
			if n < maxQueued {
				break
			}
			plan = append(plan, m)
			n, bytes = n-1, bytes-len(m.Text)
		}
	}
	if n >= maxQueued || bytes+len(req.Text) > e.cfg.Current().QueuedBytesFor(req.Channel) {
		return nil
	}
	for _, m := range plan {
		e.unqueueLocked(s, e.waiting[m.RunID], m.RunID)
	}
	return plan
}

// debounceLocked holds a message that would start a turn in the idle
// session s (busy.debounceMs d): it waits in s's queue, stored like a
// queued message, and every message that arrives within d of the last
// joins it (busyLocked); its turn starts when d passes without one
// (debounced). Send answers StatusStarted: the turn will start by itself.
// Called with e.mu held (by Send only); the effect runs after the unlock.
func (e *Engine) debounceLocked(s *session, req SendRequest, d time.Duration) sendEffect {
	now := time.Now()
	qm := QueuedMessage{RunID: req.RunID, SessionKey: req.SessionKey, Channel: req.Channel, ChatRef: req.ChatRef,
		Owner: req.Owner, Text: req.Text, QueuedAt: now, Timeout: req.Timeout}
	q := e.enqueueLocked(s, qm, BusyCollect)
	q.holding, q.holdUntil = true, now.Add(d)
	q.persisting++
	time.AfterFunc(d, func() { e.debounced(s, q) })
	return func(ctx context.Context) (Ack, error) {
		return e.storeQueued(ctx, s, q, qm, BusyCollect, false, "")
	}
}

// joinHoldLocked joins req to q, the burst s is merging, and moves its
// start to busy.debounceMs from now. Called with e.mu held (by busyLocked).
func (e *Engine) joinHoldLocked(s *session, q *queued, req SendRequest) sendEffect {
	now := time.Now()
	qm := QueuedMessage{RunID: req.RunID, SessionKey: req.SessionKey, Channel: req.Channel, ChatRef: req.ChatRef,
		Owner: req.Owner, Text: req.Text, QueuedAt: now, Timeout: req.Timeout}
	q.msgs = append(q.msgs, qm)
	e.waiting[qm.RunID] = q
	q.holdUntil = now.Add(e.cfg.Current().DebounceFor(req.Channel))
	q.persisting++
	return func(ctx context.Context) (Ack, error) {
		return e.storeQueued(ctx, s, q, qm, BusyCollect, false, "")
	}
}

// holdingLocked reports whether s is merging a burst (busy.debounceMs).
// Called with e.mu held.
func (e *Engine) holdingLocked(s *session) bool {
	n := len(s.queue)
	return n > 0 && s.queue[n-1].holding
}

// debounced ends q's hold once its last message is busy.debounceMs old
// (waiting again for the rest when one joined meanwhile) and starts it
// if the session is free.
//
// Lock contract: called without e.mu (a timer's goroutine); it takes it
// once and starts the turn after releasing it.
func (e *Engine) debounced(s *session, q *queued) {
	e.mu.Lock()
	if !q.holding || !slices.Contains(s.queue, q) {
		e.mu.Unlock()
		return
	}
	if wait := time.Until(q.holdUntil); wait > 0 {
		e.mu.Unlock()
		time.AfterFunc(wait, func() { e.debounced(s, q) })
		return
	}
	q.holding, q.collect = false, false
	start := e.pumpLocked(s)
	e.mu.Unlock()
	start()
}

// QueueCancel is a queued message cancelled before it ran: by a Cancel
// button (CancelQueued, Telegram's and the web chat's) or by Abort of its
// run id (chat.abort).
type QueueCancel struct {
	SessionKey string
	RunID      string
	Text       string // the person's message
}

// cancelSubs are the functions OnQueueCancel registered.
type cancelSubs struct {
	mu   sync.Mutex
	next int
	fns  map[int]func(QueueCancel)
}

// OnQueueCancel registers f to be told of each queued message cancelled on
// this engine, once it has left the queue (and the QueueStore), so that the
// session's other clients can update at once. In cluster mode a cancel is
// told on the replica that holds the session's queue (where the cancel
// runs). f runs on the canceller's goroutine, without the engine's lock:
// it must not block. The returned function unregisters f.
func (e *Engine) OnQueueCancel(f func(QueueCancel)) (unregister func()) {
	c := &e.cancelSubs
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fns == nil {
		c.fns = make(map[int]func(QueueCancel))
	}
	id := c.next
	c.next++
	c.fns[id] = f
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.fns, id)
	}
}

// tellCancel tells the OnQueueCancel functions of qc. Called without e.mu.
func (e *Engine) tellCancel(qc QueueCancel) {
	c := &e.cancelSubs
	c.mu.Lock()
	fns := make([]func(QueueCancel), 0, len(c.fns))
	for _, f := range c.fns {
		fns = append(fns, f)
	}
	c.mu.Unlock()
	for _, f := range fns {
		f(qc)
	}
}
