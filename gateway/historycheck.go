package gateway

import (
	"context"
	"slices"

	"github.com/turnguard/turnguard/event"
)

// HistoryMark says how far a loaded history reaches in the store: the
// highest message id the session had when it was read (read before the
// history itself, so it is never past what was loaded) and the session's
// reset mark (a /new moves it).
type HistoryMark struct {
	LastID     int64
	ResetAfter int64
}

// HistoryKey is what a cached message is compared by with a stored one:
// its turn, role and stop reason.
type HistoryKey struct {
	RunID      string
	Role       string
	StopReason event.StopReason
}

// HistorySince is what the store holds of a session after a HistoryMark:
// the messages written since (oldest first, at most the number asked),
// the mark they reach and the session's busy mode.
type HistorySince struct {
	Mark     HistoryMark
	Messages []HistoryKey
	BusyMode string
}

// HistoryChecker, optional (cluster mode), spares a replica the reload of
// an idle session's whole history before each turn: a session's cached
// history is kept while the store holds, after the mark the cache was
// loaded or last checked at, exactly the messages this replica appended to
// it since — no other replica's turn, no /new (the reset mark), nothing
// missing — and the check also reads the busy mode. One statement instead
// of the history's and the busy mode's; any difference, and any error,
// reloads as before.
type HistoryChecker interface {
	// LoadMarked is HistoryLoader with the history's mark.
	LoadMarked(ctx context.Context, sessionKey string, limit int) ([]Message, HistoryMark, error)
	// Since returns what the store holds after mark: at most max messages.
	Since(ctx context.Context, sessionKey string, mark HistoryMark, max int) (HistorySince, error)
}

// appendHistoryLocked appends m to s's history (bounded by limit) and
// counts it as one the store's rows after s's mark must show. Called with
// e.mu held.
func (e *Engine) appendHistoryLocked(s *session, m Message, limit int) {
	s.history = appendBounded(s.history, m, limit)
	s.sinceMark++
}

// checkHistory tries to keep s's cached history (refresh set it aside):
// true when the store shows exactly the messages appended since the mark,
// and then the history and busy mode are installed and done is closed.
// false (nothing changed) when there is no checker or cache, the check
// failed or found a difference: the caller loads the history.
//
// Lock contract: called without e.mu; it reads the store unlocked, then
// takes e.mu once.
func (e *Engine) checkHistory(ctx context.Context, s *session, done chan struct{}) bool {
	if e.histCheck == nil {
		return false
	}
	e.mu.Lock()
	cached, mark, since, ok := s.cached, s.mark, s.sinceMark, s.marked
	e.mu.Unlock()
	if !ok || cached == nil || since > len(cached) {
		return false
	}
	got, err := e.histCheck.Since(ctx, s.key, mark, since+1)
	if err != nil {
		e.log.Debug("checking a cached history failed; it is reloaded", "session", s.key, "err", err)
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.loaded || s.cached == nil || s.mark != mark || s.sinceMark != since || len(s.history) > 0 ||
		got.Mark.ResetAfter != mark.ResetAfter || !sameKeys(got.Messages, s.cached[len(s.cached)-since:]) {
		return false
	}
	s.history, s.cached = s.cached, nil
	s.sinceMark = 0
	if len(got.Messages) > 0 {
		s.mark.LastID = got.Mark.LastID
	}
	if mode := BusyMode(got.BusyMode); mode != "" && mode.Valid() {
		s.busyMode = mode
	}
	s.loading, s.loadErr, s.loaded = nil, nil, true
	close(done)
	return true
}

// sameKeys reports whether the stored messages are the cached ones, in
// order.
func sameKeys(stored []HistoryKey, cached []Message) bool {
	return slices.EqualFunc(stored, cached, func(k HistoryKey, m Message) bool {
		return k == HistoryKey{RunID: m.RunID, Role: m.Role, StopReason: m.StopReason}
	})
}
