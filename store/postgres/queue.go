package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/store"
)

// AddQueued stores m, committed with synchronous_commit on, before the
// sender is told "queued"; see store.SQLite.AddQueued. A run id already
// queued gets the new text and keeps its place.
func (s *Store) AddQueued(ctx context.Context, m store.QueuedMessage) error {
	if err := s.live(); err != nil {
		return err
	}
	m, err := store.CheckQueued(m)
	if err != nil {
		return err
	}
	err = s.inTx(ctx, true, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO queued (run_id, session_key, channel, chat_ref, owner, text, queued_at, timeout)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
			ON CONFLICT (run_id) DO UPDATE SET text = excluded.text`,
			m.RunID, m.SessionKey, m.Channel, m.ChatRef, m.Owner, m.Text, m.QueuedAt, int64(m.Timeout))
		return err
	})
	if err != nil {
		return fmt.Errorf("queue run %q of session %q: %w", m.RunID, m.SessionKey, err)
	}
	return nil
}

// RemoveQueued forgets the queued messages with these run ids, durably.
// A message whose turn starts needs no call: the transaction that records
// its TurnStarted deletes it.
func (s *Store) RemoveQueued(ctx context.Context, runIDs ...string) error {
	if len(runIDs) == 0 {
		return nil
	}
	if err := s.live(); err != nil {
		return err
	}
	err := s.inTx(ctx, true, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM queued WHERE run_id = ANY($1)`, runIDs)
		return err
	})
	if err != nil {
		return fmt.Errorf("remove %d queued messages: %w", len(runIDs), err)
	}
	return nil
}

// Queued lists every queued message, oldest first, except those whose run
// id already has a turn.
func (s *Store) Queued(ctx context.Context) ([]store.QueuedMessage, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT run_id, session_key, channel, chat_ref, owner, text, queued_at, timeout
		FROM queued q WHERE NOT EXISTS (SELECT 1 FROM turns t WHERE t.run_id = q.run_id) ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("queued messages: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.QueuedMessage, error) {
		var m store.QueuedMessage
		var timeout int64
		err := row.Scan(&m.RunID, &m.SessionKey, &m.Channel, &m.ChatRef, &m.Owner, &m.Text, &m.QueuedAt, &timeout)
		m.QueuedAt, m.Timeout = m.QueuedAt.UTC(), time.Duration(timeout)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("queued messages: %w", err)
	}
	return out, nil
}
