package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// QueuedMessage is a person's message waiting for its session's running
// turn to end (busy mode queue or collect). RunID is the run id its turn
// will have.
type QueuedMessage struct {
	RunID      string    `json:"runId"`
	SessionKey string    `json:"sessionKey"`
	Channel    string    `json:"channel,omitempty"`
	ChatRef    string    `json:"chatRef,omitempty"`
	Owner      string    `json:"-"`
	Text       string    `json:"text"`
	QueuedAt   time.Time `json:"queuedAt"`
	// Timeout is the message's per-request wall clock (0: configured).
	Timeout time.Duration `json:"-"`
}

// Queue keeps queued messages across restarts. SQLite and the PostgreSQL
// store (store/postgres) implement it.
type Queue interface {
	AddQueued(ctx context.Context, m QueuedMessage) error
	RemoveQueued(ctx context.Context, runIDs ...string) error
	Queued(ctx context.Context) ([]QueuedMessage, error)
}

var _ Queue = (*SQLite)(nil)

// maxRemoveBatch bounds the run ids one DELETE names (SQLite's limit on
// host parameters is far above it).
const maxRemoveBatch = 500

// AddQueued stores m. It is durable on return: the row is committed with a
// full sync, so it survives a crash or a power loss, and Queued lists it
// after a restart until RemoveQueued. The gateway tells the sender
// "queued" only after it returned nil.
//
// Adding a run id that is already queued replaces its text (a collect
// turn that another message joined) and keeps its place in the order and
// its QueuedAt. RunID, SessionKey and Text are required (ErrInvalid); a
// zero QueuedAt is the time of the call.
func (s *SQLite) AddQueued(ctx context.Context, m QueuedMessage) error {
	release, err := s.acquire()
	if err != nil {
		return err
	}
	defer release()
	if m, err = CheckQueued(m); err != nil {
		return err
	}
	err = s.durably(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO queued (run_id, seq, session_key, channel, chat_ref, owner, text, queued_at, timeout)
			VALUES (?1, (SELECT coalesce(max(seq), 0) + 1 FROM queued), ?2, ?3, ?4, ?5, ?6, ?7, ?8)
			ON CONFLICT (run_id) DO UPDATE SET text = excluded.text`,
			m.RunID, m.SessionKey, m.Channel, m.ChatRef, m.Owner, m.Text, nanos(m.QueuedAt), int64(m.Timeout))
		return err
	})
	if err != nil {
		return fmt.Errorf("queue run %q of session %q: %w", m.RunID, m.SessionKey, err)
	}
	return nil
}

// CheckQueued refuses (ErrInvalid) a queued message that AddQueued must
// not store — no run id, session key or text, a negative timeout — and
// returns m with a zero QueuedAt set to now.
func CheckQueued(m QueuedMessage) (QueuedMessage, error) {
	switch {
	case m.RunID == "":
		return m, fmt.Errorf("queue: no run id: %w", ErrInvalid)
	case m.SessionKey == "":
		return m, fmt.Errorf("queue run %q: no session key: %w", m.RunID, ErrInvalid)
	case m.Text == "":
		return m, fmt.Errorf("queue run %q: empty text: %w", m.RunID, ErrInvalid)
	case m.Timeout < 0:
		return m, fmt.Errorf("queue run %q: negative timeout %v: %w", m.RunID, m.Timeout, ErrInvalid)
	}
	if m.QueuedAt.IsZero() {
		m.QueuedAt = time.Now()
	}
	return m, nil
}

// RemoveQueued forgets the queued messages with these run ids (they were
// dropped), durably. Unknown ids are ignored; no ids is a no-op. A message
// whose turn starts needs no call: the transaction that records the turn's
// TurnStarted deletes its row (and those of the messages joined into it),
// so across a crash it runs exactly once.
func (s *SQLite) RemoveQueued(ctx context.Context, runIDs ...string) error {
	if len(runIDs) == 0 {
		return nil
	}
	release, err := s.acquire()
	if err != nil {
		return err
	}
	defer release()
	err = s.durably(ctx, func(tx *sql.Tx) error { return forgetQueued(ctx, tx, runIDs) })
	if err != nil {
		return fmt.Errorf("remove %d queued messages: %w", len(runIDs), err)
	}
	return nil
}

// forgetQueued deletes the queued rows of runIDs in tx.
func forgetQueued(ctx context.Context, tx *sql.Tx, runIDs []string) error {
	for ids := runIDs; len(ids) > 0; {
		n := min(len(ids), maxRemoveBatch)
		args := make([]any, n)
		for i, id := range ids[:n] {
			args[i] = id
		}
		q := `DELETE FROM queued WHERE run_id IN (?` + strings.Repeat(`, ?`, n-1) + `)`
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return err
		}
		ids = ids[n:]
	}
	return nil
}

// Queued lists every queued message, oldest first (the order AddQueued
// stored them in, across sessions), except those whose run id already has
// a turn (its start was recorded: it must not run twice).
func (s *SQLite) Queued(ctx context.Context) ([]QueuedMessage, error) {
	release, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer release()
	rows, err := s.r.QueryContext(ctx, `SELECT run_id, session_key, channel, chat_ref, owner, text, queued_at, timeout
		FROM queued q WHERE NOT EXISTS (SELECT 1 FROM turns t WHERE t.run_id = q.run_id) ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("queued messages: %w", err)
	}
	defer rows.Close()
	var out []QueuedMessage
	for rows.Next() {
		var m QueuedMessage
		var at, timeout int64
		if err := rows.Scan(&m.RunID, &m.SessionKey, &m.Channel, &m.ChatRef, &m.Owner, &m.Text, &at, &timeout); err != nil {
			return nil, fmt.Errorf("queued messages: %w", err)
		}
		m.QueuedAt = fromNanos(at)
		m.Timeout = time.Duration(timeout)
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("queued messages: %w", err)
	}
	return out, nil
}
