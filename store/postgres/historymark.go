package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// HistoryMark is how far a read of a session's history reaches: the
// session's highest message id and its reset mark (reset_after).
type HistoryMark struct {
	LastID     int64
	ResetAfter int64
}

// HistoryKey identifies a stored message for a cache's comparison.
type HistoryKey struct {
	RunID      string
	Role       store.Role
	StopReason event.StopReason
}

// HistorySince is what a session holds after a HistoryMark.
type HistorySince struct {
	Mark     HistoryMark // LastID: the last message returned's (the mark's when none)
	Messages []HistoryKey
	BusyMode string // "" for none
}

// HistoryMarked is History with its mark, read first (one statement
// before the history's): the mark is never past what the history holds,
// so a later HistorySince shows every message the history may lack.
func (s *Store) HistoryMarked(ctx context.Context, sessionKey string, limit int) ([]store.Message, HistoryMark, error) {
	if err := s.live(); err != nil {
		return nil, HistoryMark{}, err
	}
	var m HistoryMark
	err := s.pool.QueryRow(ctx, `SELECT coalesce((SELECT max(id) FROM messages WHERE session_key = $1), 0),
		coalesce((SELECT reset_after FROM sessions WHERE key = $1), 0)`, sessionKey).Scan(&m.LastID, &m.ResetAfter)
	if err != nil {
		return nil, HistoryMark{}, fmt.Errorf("history mark of %q: %w", sessionKey, err)
	}
	h, err := s.History(ctx, sessionKey, limit)
	if err != nil {
		return nil, HistoryMark{}, err
	}
	return h, m, nil
}

// HistorySince reads, in one statement, the session's reset mark, its busy
// mode and the first n messages after mark.LastID (oldest first).
func (s *Store) HistorySince(ctx context.Context, sessionKey string, mark HistoryMark, n int) (HistorySince, error) {
	if err := s.live(); err != nil {
		return HistorySince{}, err
	}
	rows, err := s.pool.Query(ctx, `SELECT r.after, r.mode, m.id, m.run_id, m.role, m.stop_reason
		FROM (SELECT coalesce((SELECT reset_after FROM sessions WHERE key = $1), 0) AS after,
			coalesce((SELECT busy_mode FROM session_settings WHERE session_key = $1), '') AS mode) AS r
		LEFT JOIN LATERAL (SELECT id, run_id, role, stop_reason FROM messages
			WHERE session_key = $1 AND id > $2 ORDER BY id LIMIT $3) AS m ON true
		ORDER BY m.id`, sessionKey, mark.LastID, max(1, n))
	if err != nil {
		return HistorySince{}, fmt.Errorf("history of %q since %d: %w", sessionKey, mark.LastID, err)
	}
	out := HistorySince{Mark: mark}
	var id *int64
	var runID, role, reason *string
	_, err = pgx.ForEachRow(rows, []any{&out.Mark.ResetAfter, &out.BusyMode, &id, &runID, &role, &reason}, func() error {
		if id != nil {
			out.Mark.LastID = *id
			out.Messages = append(out.Messages, HistoryKey{RunID: *runID, Role: store.Role(*role), StopReason: event.StopReason(*reason)})
		}
		return nil
	})
	if err != nil {
		return HistorySince{}, fmt.Errorf("history of %q since %d: %w", sessionKey, mark.LastID, err)
	}
	return out, nil
}
