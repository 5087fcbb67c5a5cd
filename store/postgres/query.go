package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// History returns the last limit messages of the session since its last
// reset (/new), oldest first. Messages still in the recorder's queue are
// not included; see Flush. The reply of a turn that started before the
// reset is left out though written after it (as store.SQLite.History).
func (s *Store) History(ctx context.Context, sessionKey string, limit int) ([]store.Message, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT run_id, role, text, stop_reason, created_at FROM (
			SELECT m.id, m.run_id, m.role, m.text, m.stop_reason, m.created_at FROM messages m,
				(SELECT coalesce((SELECT reset_after FROM sessions WHERE key = $1), 0) AS after) r
			WHERE m.session_key = $1 AND m.id > r.after
			AND (r.after = 0 OR m.role <> 'assistant' OR m.run_id = ''
				OR coalesce((SELECT u.id FROM messages u
					WHERE u.session_key = $1 AND u.id < m.id AND u.run_id = m.run_id AND u.role = 'user'
					ORDER BY u.id DESC LIMIT 1), r.after + 1) > r.after)
			ORDER BY m.id DESC LIMIT $2
		) AS recent ORDER BY id`, sessionKey, store.ClampLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("history of %q: %w", sessionKey, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Message, error) {
		var m store.Message
		err := row.Scan(&m.RunID, &m.Role, &m.Text, &m.StopReason, &m.Time)
		m.Time = m.Time.UTC()
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("history of %q: %w", sessionKey, err)
	}
	return out, nil
}

// Sessions returns up to limit sessions, most recently updated first.
func (s *Store) Sessions(ctx context.Context, limit int) ([]store.Session, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT s.key, s.created_at, s.updated_at,
			(SELECT count(*) FROM messages m WHERE m.session_key = s.key)
		FROM sessions s ORDER BY s.updated_at DESC, s.key LIMIT $1`, store.ClampLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("sessions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Session, error) {
		var ss store.Session
		err := row.Scan(&ss.Key, &ss.CreatedAt, &ss.UpdatedAt, &ss.Messages)
		ss.CreatedAt, ss.UpdatedAt = ss.CreatedAt.UTC(), ss.UpdatedAt.UTC()
		return ss, err
	})
	if err != nil {
		return nil, fmt.Errorf("sessions: %w", err)
	}
	return out, nil
}

const turnColumns = `run_id, session_key, channel, chat_ref, state, stop_reason, started_at, updated_at,
	ended_at, step_kind, step_name, step_seq, last_step_kind, last_step_name, last_step_seq,
	deadline_at, ceiling_at, step_timeout_ns, sender`

func scanTurn(row pgx.Row) (store.Turn, error) {
	var t store.Turn
	var ended, deadline, ceiling *time.Time
	var stepTimeout *int64
	var cur, last nullStep
	err := row.Scan(&t.RunID, &t.SessionKey, &t.Channel, &t.ChatRef, &t.State, &t.StopReason, &t.StartedAt, &t.UpdatedAt,
		&ended, &cur.kind, &cur.name, &cur.seq, &last.kind, &last.name, &last.seq,
		&deadline, &ceiling, &stepTimeout, &t.Sender)
	if err != nil {
		return store.Turn{}, err
	}
	t.StartedAt, t.UpdatedAt, t.EndedAt = t.StartedAt.UTC(), t.UpdatedAt.UTC(), timeOf(ended)
	t.CurrentStep, t.LastStep = cur.step(), last.step()
	t.Deadline, t.Ceiling = timeOf(deadline), timeOf(ceiling)
	if stepTimeout != nil {
		t.StepTimeout = time.Duration(*stepTimeout)
	}
	return t, nil
}

type nullStep struct {
	kind, name *string
	seq        *int64
}

func (n nullStep) step() event.Step {
	var st event.Step
	if n.kind != nil {
		st.Kind = *n.kind
	}
	if n.name != nil {
		st.Name = *n.name
	}
	if n.seq != nil {
		st.Seq = uint32(*n.seq)
	}
	return st
}

// Turn returns the recorded turn with runID, or an error wrapping
// store.ErrNotFound.
func (s *Store) Turn(ctx context.Context, runID string) (store.Turn, error) {
	if err := s.live(); err != nil {
		return store.Turn{}, err
	}
	t, err := scanTurn(s.pool.QueryRow(ctx, `SELECT `+turnColumns+` FROM turns WHERE run_id = $1`, runID))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Turn{}, fmt.Errorf("turn %q: %w", runID, store.ErrNotFound)
	}
	if err != nil {
		return store.Turn{}, fmt.Errorf("turn %q: %w", runID, err)
	}
	return t, nil
}

// RunningTurns returns every turn recorded as running, oldest first. Called
// at start-up, before any turn starts, it lists the turns the previous
// process was cut off in: end each with MarkInterrupted. A turn claimed by
// a cluster replica (cluster/pgcoord) is not listed: its replica's lease
// decides when it was cut off, and a takeover ends it.
func (s *Store) RunningTurns(ctx context.Context) ([]store.Turn, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT `+turnColumns+` FROM turns
		WHERE state = 'running' AND owner_epoch IS NULL ORDER BY started_at, run_id`)
	if err != nil {
		return nil, fmt.Errorf("running turns: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Turn, error) { return scanTurn(row) })
	if err != nil {
		return nil, fmt.Errorf("running turns: %w", err)
	}
	return out, nil
}

// MarkInterrupted ends a running turn that the previous process was cut off
// in (stop reason "interrupted", a journal entry, its pending approvals
// expired, message appended to the history), committed with synchronous_commit on. The change is one
// conditional UPDATE, whose row lock makes it exactly-once: among any
// number of concurrent callers, in any number of processes, exactly one
// gets true. False if the turn had already ended, or is claimed by a
// cluster replica (cluster/pgcoord: only its owner's Finish or a takeover
// of its lease ends it); store.ErrNotFound if there is no such turn.
func (s *Store) MarkInterrupted(ctx context.Context, runID, message string) (bool, error) {
	if err := s.live(); err != nil {
		return false, err
	}
	now := time.Now()
	won := false
	err := s.inTx(ctx, true, func(tx pgx.Tx) error {
		var sessionKey string
		var started time.Time
		var cur nullStep
		var last *string
		err := tx.QueryRow(ctx, `UPDATE turns SET state = 'aborted', stop_reason = $1, updated_at = $2, ended_at = $2
			WHERE run_id = $3 AND state = 'running' AND owner_epoch IS NULL
			RETURNING session_key, started_at, step_kind, step_name, step_seq, coalesce(last_step_name, last_step_kind)`,
			string(event.ReasonInterrupted), now, runID,
		).Scan(&sessionKey, &started, &cur.kind, &cur.name, &cur.seq, &last)
		if errors.Is(err, pgx.ErrNoRows) {
			var one int
			if err := tx.QueryRow(ctx, `SELECT 1 FROM turns WHERE run_id = $1`, runID).Scan(&one); errors.Is(err, pgx.ErrNoRows) {
				return store.ErrNotFound
			} else if err != nil {
				return err
			}
			return nil // already ended
		}
		if err != nil {
			return err
		}
		won = true
		// The questions it was waiting on can no longer be answered.
		if _, err := tx.Exec(ctx, `UPDATE approvals SET status = 'expired', resolved_at = $1
			WHERE run_id = $2 AND status = 'pending'`, now, runID); err != nil {
			return fmt.Errorf("expire its approvals: %w", err)
		}
		step := cur.step()
		lastStep := ""
		if last != nil {
			lastStep = *last
		}
		if _, err := tx.Exec(ctx, insertJournalRow, runID, sessionKey, int64(0), event.Aborted.String(),
			string(event.ReasonInterrupted), step.Kind, step.Name, int64(step.Seq), lastStep,
			int64(now.Sub(started)), message, now); err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		if message == "" {
			return nil
		}
		if _, err := tx.Exec(ctx, insertMessage, sessionKey, runID, string(store.RoleAssistant), message,
			string(event.ReasonInterrupted), now); err != nil {
			return fmt.Errorf("history: %w", err)
		}
		if _, err := tx.Exec(ctx, upsertSession, sessionKey, now); err != nil {
			return fmt.Errorf("session: %w", err)
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("mark turn %q interrupted: %w", runID, err)
	}
	return won, nil
}

// Journal returns the journal entries matching f, oldest first (the most
// recent f.Limit of them).
func (s *Store) Journal(ctx context.Context, f store.Filter) ([]store.JournalEntry, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	where, args := filterWhere(f)
	args = append(args, store.ClampLimit(f.Limit))
	rows, err := s.pool.Query(ctx, `SELECT id, run_id, session_key, seq, kind, stop_reason, step_kind, step_name,
			step_seq, last_step, elapsed_ns, message, at
		FROM journal`+where+` ORDER BY id DESC LIMIT $`+strconv.Itoa(len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.JournalEntry, error) {
		var e store.JournalEntry
		var seq, stepSeq, elapsed int64
		err := row.Scan(&e.ID, &e.RunID, &e.SessionKey, &seq, &e.KindName, &e.StopReason, &e.Step.Kind,
			&e.Step.Name, &stepSeq, &e.LastStep, &elapsed, &e.Message, &e.Time)
		e.Seq, e.Step.Seq, e.Elapsed, e.Time = uint64(seq), uint32(stepSeq), time.Duration(elapsed), e.Time.UTC()
		e.Kind = store.KindOf(e.KindName)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	slices.Reverse(out)
	return out, nil
}

// filterWhere is f as a WHERE clause on the journal, with its arguments
// ($1, $2, … in order).
func filterWhere(f store.Filter) (string, []any) {
	var conds []string
	var args []any
	add := func(cond string, arg any) {
		args = append(args, arg)
		conds = append(conds, strings.Replace(cond, "?", "$"+strconv.Itoa(len(args)), 1))
	}
	if f.SessionKey != "" {
		add("session_key = ?", f.SessionKey)
	}
	if f.RunID != "" {
		add("run_id = ?", f.RunID)
	}
	if !f.Since.IsZero() {
		add("at >= ?", f.Since)
	}
	if !f.Until.IsZero() {
		add("at < ?", f.Until)
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// StallHistory returns the stall episodes of the turns matching f, computed
// from the journal; see store.SQLite.StallHistory.
func (s *Store) StallHistory(ctx context.Context, f store.Filter) ([]store.Episode, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	where, args := filterWhere(f)
	if where == "" {
		where = " WHERE kind IN " + store.StallOpeners
	} else {
		where += " AND kind IN " + store.StallOpeners
	}
	rows, err := s.pool.Query(ctx, `SELECT run_id, session_key, kind, stop_reason, step_kind, step_name, step_seq, at
		FROM journal
		WHERE kind IN `+store.StallKinds+`
			AND run_id IN (SELECT run_id FROM journal`+where+`)
		ORDER BY run_id, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("stall history: %w", err)
	}
	defer rows.Close()
	var b store.EpisodeBuilder
	for rows.Next() {
		var r store.StallRow
		var kind string
		var seq int64
		if err := rows.Scan(&r.RunID, &r.SessionKey, &kind, &r.StopReason, &r.Step.Kind, &r.Step.Name, &seq, &r.At); err != nil {
			return nil, fmt.Errorf("stall history: %w", err)
		}
		r.Kind, r.Step.Seq, r.At = store.KindOf(kind), uint32(seq), r.At.UTC()
		b.Add(r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("stall history: %w", err)
	}
	return b.Episodes(f), nil
}
