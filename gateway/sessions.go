// The session cache: a session per key with its conversation id, history
// (loaded from the store on first use) and active run; least recently used
// eviction bounded by server.maxSessions and server.sessionIdleSeconds;
// Reset (/new); and the read side callers use (Active, History, Sessions).

package gateway

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
)

// session is a conversation in memory, in Engine.sessions (evictLocked
// removes idle ones).
type session struct {
	key     string
	id      string // a stable id for this conversation (changes on Reset, not on eviction)
	reset   bool   // id is Reset's (random), not derived from key
	active  *abort.Run
	history []Message
	loaded  bool          // the stored history is in history (or there is no loader)
	loading chan struct{} // closed when the in-flight load ends; nil when none is
	loadErr error         // why the last load failed (nil once one succeeded)
	updated time.Time
	used    time.Time     // last use, for eviction
	lru     *list.Element // in Engine.lru
	// ending counts the terminal events of this session's turns that are
	// recorded but not yet handed to every bus subscriber. While it is not
	// 0 the session may be free, but a turn Send accepts is only started
	// (TurnStarted, scheduler, runner) by the publisher, once the ending is
	// out: deferred holds those starts. The session is not evicted meanwhile.
	ending   int
	deferred []func()
	// queue holds the turns waiting for this session to be free, oldest
	// first (busy.go). A session with a queue is never evicted.
	queue []*queued
	// claiming is closed when the cluster claim in flight for this session
	// (Send, cluster mode) is decided; nil when none is. Sends meanwhile
	// wait for it, so a replica claims a session once at a time.
	claiming chan struct{}
	// busyMode is the busy mode set for this session by /queue <mode>
	// (SetBusyMode; "" = the channel's configured one), read from
	// Options.Settings with the history.
	busyMode BusyMode
	// With a HistoryChecker (cluster mode): marked says mark is where the
	// store's rows stood when the history was loaded or last checked, and
	// sinceMark counts the messages appended to it since; cached is the
	// history refresh set aside, kept if the check finds no difference.
	marked    bool
	mark      HistoryMark
	sinceMark int
	cached    []Message
}

// Active returns the session's active run, if any.
func (e *Engine) Active(sessionKey string) (*abort.Run, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.sessions[sessionKey]; ok && s.active != nil {
		return s.active, true
	}
	return nil, false
}

// History returns up to limit most recent messages of the session, oldest
// first, and the session's id. When the stored history cannot be loaded
// (or ctx ends first) it returns the session's id and a
// *HistoryUnavailableError: a history missing its stored part is never
// answered as if it were the whole.
func (e *Engine) History(ctx context.Context, sessionKey string, limit int) (sessionID string, msgs []Message, err error) {
	s, err := e.session(ctx, e.refresh(sessionKey))
	e.mu.Lock()
	defer e.mu.Unlock()
	if err == nil && !s.loaded {
		err = s.loadErr
		if err == nil {
			err = errors.New("the stored history is not loaded")
		}
	}
	if err != nil {
		return s.id, nil, &HistoryUnavailableError{SessionKey: sessionKey, Cause: err}
	}
	h := s.history
	if limit > 0 && len(h) > limit {
		h = h[len(h)-limit:]
	}
	return s.id, append([]Message(nil), h...), nil
}

// SessionInfo describes a session.
type SessionInfo struct {
	Key       string    `json:"key"`
	ID        string    `json:"sessionId"`
	Updated   time.Time `json:"updatedAt"`
	Messages  int       `json:"messages"`
	ActiveRun string    `json:"activeRun,omitempty"`
}

// Sessions lists the sessions the engine knows, most recently updated first.
func (e *Engine) Sessions() []SessionInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]SessionInfo, 0, len(e.sessions))
	for _, s := range e.sessions {
		si := SessionInfo{Key: s.key, ID: s.id, Updated: s.updated, Messages: len(s.history)}
		if s.active != nil {
			si.ActiveRun = s.active.ID
		}
		out = append(out, si)
	}
	sortSessions(out)
	return out
}

// Reset starts a fresh conversation in sessionKey: the history is cleared
// (in memory, and in the store through a SessionReset event), the queued
// messages are dropped and the session id changes. A running turn is not
// affected.
func (e *Engine) Reset(sessionKey string) SessionInfo {
	e.mu.Lock()
	s, ok := e.sessions[sessionKey]
	if !ok {
		s = e.newSessionLocked(sessionKey, time.Now())
	}
	e.touchLocked(s, time.Now())
	e.evictLocked(time.Now(), s)
	s.id, s.reset = uuid.NewString(), true
	s.history, s.cached, s.marked = nil, nil, false
	// A fresh conversation: what waited (queued, or steered into the running
	// turn and not taken) was for the old one.
	dropped := e.dropQueueLocked(s, "", true)
	if s.active != nil {
		if t := e.turns[s.active.ID]; t != nil {
			e.takeSteeredLocked(t)
		}
	}
	s.loaded = true
	s.updated = time.Now()
	info := SessionInfo{Key: s.key, ID: s.id, Updated: s.updated}
	e.mu.Unlock()
	go e.removeQueued(context.Background(), dropped) // never waits for a disk
	// Published (outside the lock: handlers may call the engine) so the store
	// forgets the history too, across restarts.
	e.bus.Publish(event.Event{Kind: event.SessionReset, SessionKey: sessionKey, Time: info.Updated})
	return info
}

// touchLocked records that s is used at now. Called with e.mu held.
func (e *Engine) touchLocked(s *session, now time.Time) {
	s.used = now
	if s.lru == nil {
		s.lru = e.lru.PushBack(s)
	} else {
		e.lru.MoveToBack(s.lru)
	}
}

// evictScan bounds the sessions one eviction pass may skip (those with an
// active turn or a load in flight), so a pass is O(1) however many there are.
const evictScan = 64

// evictLocked evicts, least recently used first, the sessions unused for
// server.sessionIdleSeconds and, while more than server.maxSessions remain,
// the least recently used idle ones. A session with an active turn (until
// its terminal event is published and the run released) or a history load in
// flight is never evicted, nor is keep (the session being used). An evicted session's history is reloaded from the
// store on its next use. Called with e.mu held, on every session lookup: no
// timer.
func (e *Engine) evictLocked(now time.Time, keep *session) {
	srv := e.cfg.Current().Server
	idle := time.Duration(srv.SessionIdleSeconds * float64(time.Second))
	skipped := 0
	for el := e.lru.Front(); el != nil && skipped < evictScan; {
		s := el.Value.(*session)
		next := el.Next()
		over := srv.MaxSessions > 0 && len(e.sessions) > srv.MaxSessions
		if !over && (idle <= 0 || now.Sub(s.used) < idle) {
			return // the rest were used more recently
		}
		if s.active != nil || s.loading != nil || s.ending > 0 || len(s.queue) > 0 || s.claiming != nil || s == keep {
			skipped++
		} else {
			e.lru.Remove(el)
			s.lru = nil
			delete(e.sessions, s.key)
			if s.reset {
				e.keepResetIDLocked(s.key, s.id)
			}
		}
		el = next
	}
}

// keptResetIDs bounds how many evicted reset sessions keep their id: any
// client can reset sessions. Past it the oldest goes back to its derived id.
const keptResetIDs = 4096

type resetID struct{ key, id string }

// newSessionLocked adds a session for key with its id: the one it had
// before it was evicted (derived from key, or kept since a reset). Its
// history is yet to load (if there is a loader). Called with e.mu held.
func (e *Engine) newSessionLocked(key string, now time.Time) *session {
	s := &session{key: key, id: uuid.NewSHA1(e.idSpace, []byte(key)).String(), updated: now,
		loaded: e.loadHist == nil && e.histCheck == nil && e.settings == nil}
	if el, ok := e.resetIDs[key]; ok {
		s.id, s.reset = el.Value.(resetID).id, true
		e.resetAge.Remove(el)
		delete(e.resetIDs, key)
	}
	e.sessions[key] = s
	return s
}

// keepResetIDLocked remembers the id of an evicted reset session. Called
// with e.mu held.
func (e *Engine) keepResetIDLocked(key, id string) {
	if el, ok := e.resetIDs[key]; ok {
		e.resetAge.Remove(el)
	}
	e.resetIDs[key] = e.resetAge.PushBack(resetID{key: key, id: id})
	for e.resetAge.Len() > keptResetIDs {
		old := e.resetAge.Remove(e.resetAge.Front()).(resetID)
		delete(e.resetIDs, old.key)
	}
}

// historyLoadTimeout bounds one load of a session's stored history.
const historyLoadTimeout = 10 * time.Second

// session returns the session for key, creating it and loading its stored
// history on first use. The load runs on the engine's context (bounded by
// historyLoadTimeout), not the caller's: a caller that gives up does not
// cancel it for the others. Concurrent callers share one in-flight load; the
// session counts as loaded only once a load succeeded, so a failed one is
// retried by the next caller. The error is the caller's context ending
// while it waited; a failed load is logged and the session is returned
// without its stored history.
//
// Lock contract: called without e.mu; it takes it to find or create the
// session and releases it before waiting for the load.
func (e *Engine) session(ctx context.Context, key string) (*session, error) {
	e.mu.Lock()
	now := time.Now()
	s, ok := e.sessions[key]
	if !ok {
		s = e.newSessionLocked(key, now)
	}
	e.touchLocked(s, now)
	e.evictLocked(now, s)
	if s.loaded {
		e.mu.Unlock()
		return s, nil
	}
	wait := s.loading
	if wait == nil {
		wait = make(chan struct{})
		s.loading = wait
		go e.loadHistory(s, wait)
	}
	e.mu.Unlock()
	select {
	case <-wait:
		return s, nil
	case <-ctx.Done():
		return s, fmt.Errorf("loading the history of session %s: %w", key, context.Cause(ctx))
	}
}

// loadHistory loads s's stored history and closes done.
//
// Lock contract: called without e.mu (on its own goroutine); it reads the
// store unlocked, then takes e.mu once to install the history.
func (e *Engine) loadHistory(s *session, done chan struct{}) {
	base := e.baseCtx
	if base == nil {
		base = context.Background()
	}
	ctx, cancel := context.WithTimeout(base, historyLoadTimeout)
	defer cancel()
	limit := e.cfg.Current().Server.HistoryLimit
	if e.checkHistory(ctx, s, done) {
		return
	}
	var h []Message
	var mark HistoryMark
	var err error
	switch {
	case e.histCheck != nil:
		h, mark, err = e.histCheck.LoadMarked(ctx, s.key, limit)
	case e.loadHist != nil:
		h, err = e.loadHist(ctx, s.key, limit)
	}
	mode := e.loadBusyMode(ctx, s.key)
	e.mu.Lock()
	defer e.mu.Unlock()
	defer close(done)
	s.loading = nil
	s.loadErr = err
	if err == nil && mode != "" {
		s.busyMode = mode // a /new keeps it: it is the chat's, not the conversation's
	}
	if err != nil {
		e.log.Warn("loading history failed; the next message retries", "session", s.key, "err", err)
		return
	}
	if s.loaded {
		return // reset meanwhile: the stored history is gone
	}
	s.loaded = true
	// Messages kept in memory meanwhile (a turn started after a failed
	// load) that the store already has are not repeated: only those newer
	// than the last stored one are kept after it.
	var last time.Time
	if len(h) > 0 {
		last = h[len(h)-1].Time
	}
	kept := 0
	for _, m := range s.history {
		if m.Time.After(last) {
			h = append(h, m)
			kept++
		}
	}
	s.history, s.cached = h, nil
	s.marked, s.mark, s.sinceMark = e.histCheck != nil, mark, kept
	if limit > 0 && len(s.history) > limit {
		s.history = s.history[len(s.history)-limit:]
	}
}
