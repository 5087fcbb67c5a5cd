package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/store"
)

var _ store.Resumes = (*Store)(nil)

// QueueResume records r and queues m at the head of the queue, committed
// with synchronous_commit on; see store.Resumes.
func (s *Store) QueueResume(ctx context.Context, r store.Resume, m store.QueuedMessage) error {
	if err := s.live(); err != nil {
		return err
	}
	r, m, err := store.CheckResume(r, m)
	if err != nil {
		return err
	}
	err = s.inTx(ctx, true, func(tx pgx.Tx) error { return QueueResumeTx(ctx, tx, r, m) })
	if err != nil {
		return fmt.Errorf("queue attempt %d (%q) of run %q: %w", r.Attempt, r.RunID, r.OriginRunID, err)
	}
	return nil
}

// Resumed reports whether an attempt replaces the turn runID; see
// store.Resumes.
func (s *Store) Resumed(ctx context.Context, runID string) (bool, error) {
	if err := s.live(); err != nil {
		return false, err
	}
	var yes bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM resumes WHERE prev_run_id = $1)`, runID).Scan(&yes); err != nil {
		return false, fmt.Errorf("resumed run %q: %w", runID, err)
	}
	return yes, nil
}

// Resume returns the record of the attempt runID; see store.Resumes.
func (s *Store) Resume(ctx context.Context, runID string) (store.Resume, error) {
	if err := s.live(); err != nil {
		return store.Resume{}, err
	}
	return ReadResume(ctx, s.pool, runID)
}

// QueueResumeTx is QueueResume inside tx (a cluster takeover's, which ends
// the cut-off attempt in the same transaction); r and m are checked
// (store.CheckResume).
func QueueResumeTx(ctx context.Context, tx pgx.Tx, r store.Resume, m store.QueuedMessage) error {
	tag, err := tx.Exec(ctx, `INSERT INTO resumes (run_id, prev_run_id, origin_run_id, session_key, attempt, step_kind,
			step_name, confirm, origin_started_at, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (run_id) DO NOTHING`,
		r.RunID, r.PrevRunID, r.OriginRunID, r.SessionKey, r.Attempt, r.Step.Kind, r.Step.Name, r.Confirm, r.OriginStartedAt, r.CreatedAt)
	if err != nil || tag.RowsAffected() == 0 {
		return err // recorded (and queued) by an earlier call
	}
	// At the head: the attempt runs before the messages queued behind the
	// attempt it replaces. The table lock keeps two heads apart.
	if _, err := tx.Exec(ctx, `LOCK TABLE queued IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO queued (run_id, seq, session_key, channel, chat_ref, owner, text, queued_at, timeout)
		OVERRIDING SYSTEM VALUE
		VALUES ($1, (SELECT coalesce(min(seq), 1) - 1 FROM queued), $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (run_id) DO NOTHING`,
		m.RunID, m.SessionKey, m.Channel, m.ChatRef, m.Owner, m.Text, m.QueuedAt, int64(m.Timeout))
	return err
}

// Querier reads one row: a pool or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReadResume is Resume through q (a takeover's transaction).
func ReadResume(ctx context.Context, q Querier, runID string) (store.Resume, error) {
	var r store.Resume
	err := q.QueryRow(ctx, `SELECT run_id, prev_run_id, origin_run_id, session_key, attempt, step_kind, step_name,
			confirm, origin_started_at, created_at FROM resumes WHERE run_id = $1`, runID).
		Scan(&r.RunID, &r.PrevRunID, &r.OriginRunID, &r.SessionKey, &r.Attempt, &r.Step.Kind, &r.Step.Name, &r.Confirm,
			&r.OriginStartedAt, &r.CreatedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return store.Resume{}, fmt.Errorf("resume of run %q: %w", runID, store.ErrNotFound)
	case err != nil:
		return store.Resume{}, fmt.Errorf("resume of run %q: %w", runID, err)
	}
	r.OriginStartedAt, r.CreatedAt = r.OriginStartedAt.UTC(), r.CreatedAt.UTC()
	return r, nil
}
