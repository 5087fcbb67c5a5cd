package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Enqueue stores a terminal message before its channel tries to deliver it,
// and returns its id. It is durable on return: the row is committed with a
// full sync, so it survives a crash or a power loss, and Pending lists it
// after a restart until MarkDelivered or MarkFailed is called.
//
// A run has at most one message of each kind. Enqueueing the same
// (RunID, Kind) again stores nothing and returns the existing id with an
// error wrapping ErrDuplicate: the first enqueuer (or the restart resend)
// owns the delivery, so the caller must not deliver again.
//
// Channel, RunID, Text and a valid Kind are required (ErrInvalid); ChatRef
// may be empty for channels that need none.
func (s *SQLite) Enqueue(ctx context.Context, m OutboxMessage) (int64, error) {
	release, err := s.acquire()
	if err != nil {
		return 0, err
	}
	defer release()
	if err := CheckEnqueue(m); err != nil {
		return 0, err
	}
	var id int64
	dup := false
	err = s.durably(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO outbox (channel, chat_ref, run_id, kind, text, created_at)
			VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, kind) DO NOTHING`,
			m.Channel, m.ChatRef, m.RunID, string(m.Kind), m.Text, nanos(time.Now()))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 1 {
			id, err = res.LastInsertId()
			return err
		}
		dup = true
		return tx.QueryRowContext(ctx, `SELECT id FROM outbox WHERE run_id = ? AND kind = ?`,
			m.RunID, string(m.Kind)).Scan(&id)
	})
	if err != nil {
		return 0, fmt.Errorf("enqueue %s message of run %q: %w", m.Kind, m.RunID, err)
	}
	if dup {
		return id, fmt.Errorf("enqueue %s message of run %q: %w", m.Kind, m.RunID, ErrDuplicate)
	}
	return id, nil
}

// CheckEnqueue refuses (ErrInvalid) an outbox message that Enqueue must
// not store: no channel, no run id, an unknown kind or no text.
func CheckEnqueue(m OutboxMessage) error {
	switch {
	case m.Channel == "":
		return fmt.Errorf("enqueue: no channel: %w", ErrInvalid)
	case m.RunID == "":
		return fmt.Errorf("enqueue: no run id: %w", ErrInvalid)
	case m.Kind != OutboxFinal && m.Kind != OutboxNotice:
		return fmt.Errorf("enqueue: kind %q: %w", m.Kind, ErrInvalid)
	case m.Text == "":
		return fmt.Errorf("enqueue: empty text: %w", ErrInvalid)
	}
	return nil
}

// MarkDelivered records that the channel delivered message id; Pending no
// longer lists it. Marking it again is harmless.
func (s *SQLite) MarkDelivered(ctx context.Context, id int64) error {
	return s.updateOutbox(ctx, "mark delivered", id,
		`UPDATE outbox SET delivered_at = coalesce(delivered_at, ?) WHERE id = ?`, nanos(time.Now()), id)
}

// MarkAttempt records a failed delivery attempt of message id: the attempt
// count goes up and err's text is kept as the last error (see ErrorText:
// credentials are redacted and the text is bounded). The message stays
// pending; the caller decides when to give up with MarkFailed.
func (s *SQLite) MarkAttempt(ctx context.Context, id int64, err error) error {
	return s.updateOutbox(ctx, "mark attempt", id,
		`UPDATE outbox SET attempts = attempts + 1, last_error = ?, last_attempt_at = ? WHERE id = ?`,
		ErrorText(err), nanos(time.Now()), id)
}

// MarkFailed gives up on message id (a permanent failure, such as a chat
// that no longer exists): it is kept, counted in Counts, and no longer
// listed by Pending. reason is stored like an attempt's error.
func (s *SQLite) MarkFailed(ctx context.Context, id int64, reason string) error {
	return s.updateOutbox(ctx, "mark failed", id,
		`UPDATE outbox SET failed_at = coalesce(failed_at, ?1), last_error = ?2 WHERE id = ?3 AND delivered_at IS NULL`,
		nanos(time.Now()), ErrorText(errors.New(reason)), id)
}

func (s *SQLite) updateOutbox(ctx context.Context, what string, id int64, query string, args ...any) error {
	release, err := s.acquire()
	if err != nil {
		return err
	}
	defer release()
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, query, args...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 1 {
			return err
		}
		var one int
		if err := tx.QueryRowContext(ctx, `SELECT 1 FROM outbox WHERE id = ?`, id).Scan(&one); errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		} else if err != nil {
			return err
		}
		return nil // MarkFailed on a delivered message: delivered stands
	})
	s.rec.NoteWrite(err)
	if err != nil {
		return fmt.Errorf("outbox %s %d: %w", what, id, err)
	}
	return nil
}

// MarkPartsSent records that the first n parts of message id (a text sent
// as several messages) reached the chat; Pending reports it as PartsSent,
// so a resend starts after them. n never goes down.
func (s *SQLite) MarkPartsSent(ctx context.Context, id int64, n int) error {
	if n < 0 {
		return fmt.Errorf("outbox mark parts sent %d: %d parts: %w", id, n, ErrInvalid)
	}
	return s.updateOutbox(ctx, "mark parts sent", id,
		`UPDATE outbox SET parts_sent = max(parts_sent, ?) WHERE id = ?`, n, id)
}

// IsPending reports whether message id is still to be delivered: neither
// delivered nor failed. ErrNotFound if there is no such message.
func (s *SQLite) IsPending(ctx context.Context, id int64) (bool, error) {
	release, err := s.acquire()
	if err != nil {
		return false, err
	}
	defer release()
	var pending bool
	err = s.r.QueryRowContext(ctx, `SELECT delivered_at IS NULL AND failed_at IS NULL FROM outbox WHERE id = ?`, id).Scan(&pending)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, fmt.Errorf("outbox message %d: %w", id, ErrNotFound)
	case err != nil:
		return false, fmt.Errorf("outbox message %d: %w", id, err)
	}
	return pending, nil
}

// Pending returns up to limit messages neither delivered nor failed, oldest
// first, for channel ("" for every channel). A channel calls it at start-up
// to resend what the previous process could not deliver.
func (s *SQLite) Pending(ctx context.Context, channel string, limit int) ([]OutboxMessage, error) {
	release, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer release()
	const cols = `SELECT id, channel, chat_ref, run_id, kind, text, created_at, attempts, last_error, last_attempt_at, parts_sent
		FROM outbox WHERE delivered_at IS NULL AND failed_at IS NULL`
	var rows *sql.Rows
	if channel == "" {
		rows, err = s.r.QueryContext(ctx, cols+` ORDER BY id LIMIT ?`, ClampLimit(limit))
	} else {
		rows, err = s.r.QueryContext(ctx, cols+` AND channel = ? ORDER BY id LIMIT ?`, channel, ClampLimit(limit))
	}
	if err != nil {
		return nil, fmt.Errorf("pending outbox of %q: %w", channel, err)
	}
	defer rows.Close()
	var out []OutboxMessage
	for rows.Next() {
		var m OutboxMessage
		var created int64
		var attempted sql.NullInt64
		if err := rows.Scan(&m.ID, &m.Channel, &m.ChatRef, &m.RunID, &m.Kind, &m.Text, &created,
			&m.Attempts, &m.LastError, &attempted, &m.PartsSent); err != nil {
			return nil, fmt.Errorf("pending outbox of %q: %w", channel, err)
		}
		m.CreatedAt, m.LastAttemptAt = fromNanos(created), fromNullNanos(attempted)
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pending outbox of %q: %w", channel, err)
	}
	return out, nil
}

// Counts counts outbox messages by status.
func (s *SQLite) Counts(ctx context.Context) (OutboxCounts, error) {
	release, err := s.acquire()
	if err != nil {
		return OutboxCounts{}, err
	}
	defer release()
	var c OutboxCounts
	err = s.r.QueryRowContext(ctx, `SELECT
			count(*) FILTER (WHERE delivered_at IS NULL AND failed_at IS NULL),
			count(*) FILTER (WHERE delivered_at IS NOT NULL),
			count(*) FILTER (WHERE delivered_at IS NULL AND failed_at IS NOT NULL)
		FROM outbox`).Scan(&c.Pending, &c.Delivered, &c.Failed)
	if err != nil {
		return OutboxCounts{}, fmt.Errorf("outbox counts: %w", err)
	}
	return c, nil
}

// UserText returns the message the user sent to start run runID (the
// latest, if the run id was reused), for a Retry that sends it again.
// ErrNotFound if the history has none (never recorded, or pruned).
func (s *SQLite) UserText(ctx context.Context, runID string) (string, error) {
	release, err := s.acquire()
	if err != nil {
		return "", err
	}
	defer release()
	var text string
	// Through the turn's session: messages are indexed by session, not run.
	err = s.r.QueryRowContext(ctx, `SELECT text FROM messages
		WHERE session_key = (SELECT session_key FROM turns WHERE run_id = ?1) AND run_id = ?1 AND role = ?2
		ORDER BY id DESC LIMIT 1`, runID, string(RoleUser)).Scan(&text)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", fmt.Errorf("user text of run %q: %w", runID, ErrNotFound)
	case err != nil:
		return "", fmt.Errorf("user text of run %q: %w", runID, err)
	}
	return text, nil
}
