package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/turnguard/turnguard/event"
)

// History returns the last limit messages of the session since its last
// reset (/new), oldest first (what chat.history returns). An unknown session has an empty history. Messages
// still in the recorder's queue are not included; see Flush.
//
// The reply of a turn that started before the reset is not the new
// conversation's even when it was written after the reset point (/new
// during a running turn: the turn ends afterwards): an assistant message
// whose run's user message is at or before the reset point is left out
// (issue 20, defect 4). The run's user message is looked up backwards from
// the reply along messages_by_session, so it is found in a step or two: on
// a reset session of 20,000 messages a 200-message history takes 0.8 ms
// (4.6 ms with a max() over the session's messages of the run).
func (s *SQLite) History(ctx context.Context, sessionKey string, limit int) ([]Message, error) {
	release, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer release()
	rows, err := s.r.QueryContext(ctx, `SELECT run_id, role, text, stop_reason, created_at FROM (
			SELECT m.id, m.run_id, m.role, m.text, m.stop_reason, m.created_at FROM messages m,
				(SELECT coalesce((SELECT reset_after FROM sessions WHERE key = ?1), 0) AS after) r
			WHERE m.session_key = ?1 AND m.id > r.after
			AND (r.after = 0 OR m.role <> 'assistant' OR m.run_id = ''
				OR coalesce((SELECT u.id FROM messages u
					WHERE u.session_key = ?1 AND u.id < m.id AND u.run_id = m.run_id AND u.role = 'user'
					ORDER BY u.id DESC LIMIT 1), r.after + 1) > r.after)
			ORDER BY m.id DESC LIMIT ?2
		) ORDER BY id`, sessionKey, ClampLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("history of %q: %w", sessionKey, err)
	}
	defer rows.Close()
	var out []Message
	for rows.Next() {
		var m Message
		var at int64
		if err := rows.Scan(&m.RunID, &m.Role, &m.Text, &m.StopReason, &at); err != nil {
			return nil, fmt.Errorf("history of %q: %w", sessionKey, err)
		}
		m.Time = fromNanos(at)
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("history of %q: %w", sessionKey, err)
	}
	return out, nil
}

// Sessions returns up to limit sessions, most recently updated first.
func (s *SQLite) Sessions(ctx context.Context, limit int) ([]Session, error) {
	release, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer release()
	rows, err := s.r.QueryContext(ctx, `SELECT s.key, s.created_at, s.updated_at,
			(SELECT count(*) FROM messages m WHERE m.session_key = s.key)
		FROM sessions s ORDER BY s.updated_at DESC, s.key LIMIT ?`, ClampLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("sessions: %w", err)
	}
	defer rows.Close()
	var out []Session
	for rows.Next() {
		var ss Session
		var created, updated int64
		if err := rows.Scan(&ss.Key, &created, &updated, &ss.Messages); err != nil {
			return nil, fmt.Errorf("sessions: %w", err)
		}
		ss.CreatedAt, ss.UpdatedAt = fromNanos(created), fromNanos(updated)
		out = append(out, ss)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sessions: %w", err)
	}
	return out, nil
}

const turnColumns = `run_id, session_key, channel, chat_ref, state, stop_reason, started_at, updated_at,
	ended_at, step_kind, step_name, step_seq, last_step_kind, last_step_name, last_step_seq,
	deadline_at, ceiling_at, step_timeout_ns, sender`

type scanner interface{ Scan(dest ...any) error }

func scanTurn(sc scanner) (Turn, error) {
	var t Turn
	var started, updated int64
	var ended, deadline, ceiling, stepTimeout sql.NullInt64
	var cur, last nullStep
	err := sc.Scan(&t.RunID, &t.SessionKey, &t.Channel, &t.ChatRef, &t.State, &t.StopReason, &started, &updated,
		&ended, &cur.kind, &cur.name, &cur.seq, &last.kind, &last.name, &last.seq,
		&deadline, &ceiling, &stepTimeout, &t.Sender)
	if err != nil {
		return Turn{}, err
	}
	t.StartedAt, t.UpdatedAt, t.EndedAt = fromNanos(started), fromNanos(updated), fromNullNanos(ended)
	t.CurrentStep, t.LastStep = cur.step(), last.step()
	t.Deadline, t.Ceiling = fromNullNanos(deadline), fromNullNanos(ceiling)
	t.StepTimeout = time.Duration(stepTimeout.Int64)
	return t, nil
}

type nullStep struct {
	kind, name sql.NullString
	seq        sql.NullInt64
}

func (n nullStep) step() event.Step {
	return event.Step{Kind: n.kind.String, Name: n.name.String, Seq: uint32(n.seq.Int64)}
}

// Turn returns the recorded turn with runID, or an error wrapping
// ErrNotFound.
func (s *SQLite) Turn(ctx context.Context, runID string) (Turn, error) {
	release, err := s.acquire()
	if err != nil {
		return Turn{}, err
	}
	defer release()
	t, err := scanTurn(s.r.QueryRowContext(ctx, `SELECT `+turnColumns+` FROM turns WHERE run_id = ?`, runID))
	if errors.Is(err, sql.ErrNoRows) {
		return Turn{}, fmt.Errorf("turn %q: %w", runID, ErrNotFound)
	}
	if err != nil {
		return Turn{}, fmt.Errorf("turn %q: %w", runID, err)
	}
	return t, nil
}

// RunningTurns returns every turn recorded as running, oldest first. Called
// at start-up, before any turn starts, it lists the turns the previous
// process was cut off in: end each with MarkInterrupted.
func (s *SQLite) RunningTurns(ctx context.Context) ([]Turn, error) {
	release, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer release()
	rows, err := s.r.QueryContext(ctx, `SELECT `+turnColumns+` FROM turns
		WHERE state = 'running' ORDER BY started_at, run_id`)
	if err != nil {
		return nil, fmt.Errorf("running turns: %w", err)
	}
	defer rows.Close()
	var out []Turn
	for rows.Next() {
		t, err := scanTurn(rows)
		if err != nil {
			return nil, fmt.Errorf("running turns: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("running turns: %w", err)
	}
	return out, nil
}

// MarkInterrupted ends a running turn that the previous process was cut off
// in: state aborted, stop reason "interrupted", a journal entry (kind
// aborted), its pending approvals expired and, if message is not empty,
// message appended to the session's history as the turn's assistant
// message. It is exactly-once: the change
// is a single conditional update, so among any number of concurrent callers
// (in this process or another using the same file) exactly one gets true.
// It returns false if the turn had already ended, and an error wrapping
// ErrNotFound if there is no such turn.
func (s *SQLite) MarkInterrupted(ctx context.Context, runID, message string) (bool, error) {
	release, err := s.acquire()
	if err != nil {
		return false, err
	}
	defer release()
	now := time.Now()
	won := false
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var sessionKey string
		var started int64
		var cur nullStep
		var last sql.NullString
		err := tx.QueryRowContext(ctx, `UPDATE turns SET state = 'aborted', stop_reason = ?1, updated_at = ?2, ended_at = ?2
			WHERE run_id = ?3 AND state = 'running'
			RETURNING session_key, started_at, step_kind, step_name, step_seq, coalesce(last_step_name, last_step_kind)`,
			string(event.ReasonInterrupted), nanos(now), runID,
		).Scan(&sessionKey, &started, &cur.kind, &cur.name, &cur.seq, &last)
		if errors.Is(err, sql.ErrNoRows) {
			var one int
			if err := tx.QueryRowContext(ctx, `SELECT 1 FROM turns WHERE run_id = ?`, runID).Scan(&one); errors.Is(err, sql.ErrNoRows) {
				return ErrNotFound
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
		if _, err := tx.ExecContext(ctx, `UPDATE approvals SET status = 'expired', resolved_at = ?1
			WHERE run_id = ?2 AND status = 'pending'`, nanos(now), runID); err != nil {
			return fmt.Errorf("expire its approvals: %w", err)
		}
		step := cur.step()
		if _, err := tx.ExecContext(ctx, `INSERT INTO journal (run_id, session_key, kind, stop_reason,
				step_kind, step_name, step_seq, last_step, elapsed_ns, message, at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			runID, sessionKey, event.Aborted.String(), string(event.ReasonInterrupted),
			step.Kind, step.Name, int64(step.Seq), last.String, nanos(now)-started, message, nanos(now)); err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		if message == "" {
			return nil
		}
		if _, err := tx.StmtContext(ctx, s.st.insertMessage).ExecContext(ctx,
			sessionKey, runID, RoleAssistant, message, string(event.ReasonInterrupted), nanos(now)); err != nil {
			return fmt.Errorf("history: %w", err)
		}
		if _, err := tx.StmtContext(ctx, s.st.upsertSession).ExecContext(ctx, sessionKey, nanos(now)); err != nil {
			return fmt.Errorf("session: %w", err)
		}
		return nil
	})
	s.rec.NoteWrite(err)
	if err != nil {
		return false, fmt.Errorf("mark turn %q interrupted: %w", runID, err)
	}
	return won, nil
}

// Journal returns the journal entries matching f, oldest first (the most
// recent f.Limit of them).
func (s *SQLite) Journal(ctx context.Context, f Filter) ([]JournalEntry, error) {
	release, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer release()
	where, args := f.where()
	args = append(args, ClampLimit(f.Limit))
	rows, err := s.r.QueryContext(ctx, `SELECT id, run_id, session_key, seq, kind, stop_reason, step_kind, step_name,
			step_seq, last_step, elapsed_ns, message, at
		FROM journal`+where+` ORDER BY id DESC LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	defer rows.Close()
	var out []JournalEntry
	for rows.Next() {
		var e JournalEntry
		var seq, stepSeq, elapsed, at int64
		if err := rows.Scan(&e.ID, &e.RunID, &e.SessionKey, &seq, &e.KindName, &e.StopReason, &e.Step.Kind,
			&e.Step.Name, &stepSeq, &e.LastStep, &elapsed, &e.Message, &at); err != nil {
			return nil, fmt.Errorf("journal: %w", err)
		}
		e.Seq, e.Step.Seq, e.Elapsed, e.Time = uint64(seq), uint32(stepSeq), time.Duration(elapsed), fromNanos(at)
		e.Kind = KindOf(e.KindName)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	slices.Reverse(out)
	return out, nil
}

// where is f as a SQL WHERE clause on the journal, with its arguments.
func (f Filter) where() (string, []any) {
	var conds []string
	var args []any
	if f.SessionKey != "" {
		conds, args = append(conds, "session_key = ?"), append(args, f.SessionKey)
	}
	if f.RunID != "" {
		conds, args = append(conds, "run_id = ?"), append(args, f.RunID)
	}
	if !f.Since.IsZero() {
		conds, args = append(conds, "at >= ?"), append(args, nanos(f.Since))
	}
	if !f.Until.IsZero() {
		conds, args = append(conds, "at < ?"), append(args, nanos(f.Until))
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// KindOf is the event kind of a journal kind name (event.Kind's String);
// 0 for an unknown name.
func KindOf(name string) event.Kind { return kindByName[name] }

// kindByName maps journal kind names back to event kinds.
var kindByName = func() map[string]event.Kind {
	m := make(map[string]event.Kind)
	for k := event.TurnStarted; k.String() != "unknown"; k++ {
		m[k.String()] = k
	}
	return m
}()
