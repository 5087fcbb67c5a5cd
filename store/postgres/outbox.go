package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/store"
)

// Enqueue stores a terminal message before its channel tries to deliver
// it, committed with synchronous_commit on; see store.SQLite.Enqueue. A
// second Enqueue of the same (RunID, Kind) — from this process or another
// replica — stores nothing and returns the existing id with an error
// wrapping store.ErrDuplicate.
func (s *Store) Enqueue(ctx context.Context, m store.OutboxMessage) (int64, error) {
	if err := s.live(); err != nil {
		return 0, err
	}
	if err := store.CheckEnqueue(m); err != nil {
		return 0, err
	}
	var id int64
	dup := false
	err := s.inTx(ctx, true, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `INSERT INTO outbox (channel, chat_ref, run_id, kind, text, created_at)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (run_id, kind) DO NOTHING RETURNING id`,
			m.Channel, m.ChatRef, m.RunID, string(m.Kind), m.Text, time.Now()).Scan(&id)
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		dup = true
		return tx.QueryRow(ctx, `SELECT id FROM outbox WHERE run_id = $1 AND kind = $2`, m.RunID, string(m.Kind)).Scan(&id)
	})
	if err != nil {
		return 0, fmt.Errorf("enqueue %s message of run %q: %w", m.Kind, m.RunID, err)
	}
	if dup {
		return id, fmt.Errorf("enqueue %s message of run %q: %w", m.Kind, m.RunID, store.ErrDuplicate)
	}
	return id, nil
}

// MarkDelivered records that the channel delivered message id; Pending no
// longer lists it. Marking it again is harmless.
func (s *Store) MarkDelivered(ctx context.Context, id int64) error {
	return s.updateOutbox(ctx, "mark delivered", id,
		`UPDATE outbox SET delivered_at = coalesce(delivered_at, $1) WHERE id = $2`, time.Now(), id)
}

// MarkAttempt records a failed delivery attempt of message id (see
// store.SQLite.MarkAttempt: the error text is redacted and bounded).
func (s *Store) MarkAttempt(ctx context.Context, id int64, err error) error {
	return s.updateOutbox(ctx, "mark attempt", id,
		`UPDATE outbox SET attempts = attempts + 1, last_error = $1, last_attempt_at = $2 WHERE id = $3`,
		store.ErrorText(err), time.Now(), id)
}

// MarkFailed gives up on message id; see store.SQLite.MarkFailed.
func (s *Store) MarkFailed(ctx context.Context, id int64, reason string) error {
	return s.updateOutbox(ctx, "mark failed", id,
		`UPDATE outbox SET failed_at = coalesce(failed_at, $1), last_error = $2 WHERE id = $3 AND delivered_at IS NULL`,
		time.Now(), store.ErrorText(errors.New(reason)), id)
}

// MarkPartsSent records that the first n parts of message id reached the
// chat; n never goes down.
func (s *Store) MarkPartsSent(ctx context.Context, id int64, n int) error {
	if n < 0 {
		return fmt.Errorf("outbox mark parts sent %d: %d parts: %w", id, n, store.ErrInvalid)
	}
	return s.updateOutbox(ctx, "mark parts sent", id,
		`UPDATE outbox SET parts_sent = greatest(parts_sent, $1) WHERE id = $2`, n, id)
}

func (s *Store) updateOutbox(ctx context.Context, what string, id int64, query string, args ...any) error {
	if err := s.live(); err != nil {
		return err
	}
	err := s.inTx(ctx, false, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, query, args...)
		if err != nil || tag.RowsAffected() == 1 {
			return err
		}
		var one int
		if err := tx.QueryRow(ctx, `SELECT 1 FROM outbox WHERE id = $1`, id).Scan(&one); errors.Is(err, pgx.ErrNoRows) {
			return store.ErrNotFound
		} else if err != nil {
			return err
		}
		return nil // MarkFailed on a delivered message: delivered stands
	})
	if err != nil {
		return fmt.Errorf("outbox %s %d: %w", what, id, err)
	}
	return nil
}

// IsPending reports whether message id is neither delivered nor failed;
// store.ErrNotFound if there is no such message.
func (s *Store) IsPending(ctx context.Context, id int64) (bool, error) {
	if err := s.live(); err != nil {
		return false, err
	}
	var pending bool
	err := s.pool.QueryRow(ctx, `SELECT delivered_at IS NULL AND failed_at IS NULL FROM outbox WHERE id = $1`, id).Scan(&pending)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, fmt.Errorf("outbox message %d: %w", id, store.ErrNotFound)
	case err != nil:
		return false, fmt.Errorf("outbox message %d: %w", id, err)
	}
	return pending, nil
}

// Pending returns up to limit messages neither delivered nor failed, oldest
// first, for channel ("" for every channel).
func (s *Store) Pending(ctx context.Context, channel string, limit int) ([]store.OutboxMessage, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT `+OutboxColumns+`
		FROM outbox WHERE delivered_at IS NULL AND failed_at IS NULL AND ($1 = '' OR channel = $1)
		ORDER BY id LIMIT $2`, channel, store.ClampLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("pending outbox of %q: %w", channel, err)
	}
	out, err := pgx.CollectRows(rows, ScanOutbox)
	if err != nil {
		return nil, fmt.Errorf("pending outbox of %q: %w", channel, err)
	}
	return out, nil
}

// OutboxColumns are the outbox columns ScanOutbox reads, in its order: for
// the packages that read outbox rows on the same schema (cluster/pgcoord).
const OutboxColumns = `id, channel, chat_ref, run_id, kind, text, created_at, attempts, last_error, last_attempt_at, parts_sent`

// ScanOutbox reads a row of OutboxColumns (times in UTC).
func ScanOutbox(row pgx.CollectableRow) (store.OutboxMessage, error) {
	var m store.OutboxMessage
	var attempted *time.Time
	err := row.Scan(&m.ID, &m.Channel, &m.ChatRef, &m.RunID, &m.Kind, &m.Text, &m.CreatedAt,
		&m.Attempts, &m.LastError, &attempted, &m.PartsSent)
	m.CreatedAt, m.LastAttemptAt = m.CreatedAt.UTC(), timeOf(attempted)
	return m, err
}

// Counts counts outbox messages by status.
func (s *Store) Counts(ctx context.Context) (store.OutboxCounts, error) {
	if err := s.live(); err != nil {
		return store.OutboxCounts{}, err
	}
	var c store.OutboxCounts
	err := s.pool.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE delivered_at IS NULL AND failed_at IS NULL),
			count(*) FILTER (WHERE delivered_at IS NOT NULL),
			count(*) FILTER (WHERE delivered_at IS NULL AND failed_at IS NOT NULL)
		FROM outbox`).Scan(&c.Pending, &c.Delivered, &c.Failed)
	if err != nil {
		return store.OutboxCounts{}, fmt.Errorf("outbox counts: %w", err)
	}
	return c, nil
}

// UserText returns the message the user sent to start run runID (the
// latest, if the run id was reused); store.ErrNotFound if the history has
// none.
func (s *Store) UserText(ctx context.Context, runID string) (string, error) {
	if err := s.live(); err != nil {
		return "", err
	}
	return ReadUserText(ctx, s.pool, runID)
}

// ReadUserText is UserText through q (a takeover's transaction).
func ReadUserText(ctx context.Context, q Querier, runID string) (string, error) {
	var text string
	err := q.QueryRow(ctx, `SELECT text FROM messages
		WHERE session_key = (SELECT session_key FROM turns WHERE run_id = $1) AND run_id = $1 AND role = 'user'
		ORDER BY id DESC LIMIT 1`, runID).Scan(&text)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", fmt.Errorf("user text of run %q: %w", runID, store.ErrNotFound)
	case err != nil:
		return "", fmt.Errorf("user text of run %q: %w", runID, err)
	}
	return text, nil
}
