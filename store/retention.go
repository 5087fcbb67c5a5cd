package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Retention is what Prune deletes. A zero age or count keeps those rows.
type Retention struct {
	// History: chat messages and ended turns older than this (config
	// store.retention.historyDays), and the approvals of those turns.
	// Sessions left with no message and no turn go too.
	History time.Duration
	// MaxMessagesPerSession: beyond the newest this many messages of a
	// session, older ones are deleted (store.retention.maxMessagesPerSession).
	MaxMessagesPerSession int
	// Journal: journal entries — and so the stall history computed from
	// them — older than this (store.retention.journalDays).
	Journal time.Duration
	// Outbox: outbox rows delivered or given up longer ago than this
	// (store.retention.outboxDays). A pending row is never deleted.
	Outbox time.Duration
	// Interval: how often the store prunes by itself; 0 never (call Prune).
	Interval time.Duration
	// BatchRows: rows deleted per transaction; 0 means 500. Small batches
	// keep each write transaction short, so turn events are never held up
	// for long behind a prune.
	BatchRows int
}

const defaultBatchRows = 500

func (r Retention) withDefaults() Retention {
	if r.BatchRows <= 0 {
		r.BatchRows = defaultBatchRows
	}
	return r
}

// Enabled reports whether r has the store prune by itself: an interval and
// at least one bound.
func (r Retention) Enabled() bool {
	return r.Interval > 0 && (r.History > 0 || r.MaxMessagesPerSession > 0 || r.Journal > 0 || r.Outbox > 0)
}

// PruneStats counts what one Prune deleted.
type PruneStats struct {
	Messages, Turns, Sessions, Journal, Outbox, Approvals, RetryTokens, Resumes int64
}

// notRunning excludes the rows of turns still running.
const notRunning = `run_id NOT IN (SELECT run_id FROM turns WHERE state = 'running')`

// pruneMessages deletes up to ?2 messages older than ?1 (not of a running
// turn), oldest first. It finds them through the index messages_created
// (migration 0004), in its order: by id, with no index on created_at, it
// scanned the whole table inside the write transaction.
const pruneMessages = `DELETE FROM messages WHERE id IN (SELECT id FROM messages
	WHERE created_at < ?1 AND ` + notRunning + ` ORDER BY created_at, id LIMIT ?2)`

// pruneApprovals deletes up to ?2 approvals created before ?1 whose turn
// is pruned in the same pass (ended before ?1) or is gone. It finds them
// through approvals_created, then each turn by its key.
const pruneApprovals = `DELETE FROM approvals WHERE id IN (SELECT a.id FROM approvals a
	WHERE a.created_at < ?1 AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.run_id = a.run_id
		AND (t.state = 'running' OR t.ended_at >= ?1))
	ORDER BY a.created_at LIMIT ?2)`

// pruneRetryTokens deletes up to ?2 Retry buttons' tokens created before
// ?1 whose turn is pruned in the same pass or is gone, as pruneApprovals.
const pruneRetryTokens = `DELETE FROM retry_tokens WHERE token_hash IN (SELECT r.token_hash FROM retry_tokens r
	WHERE r.created_at < ?1 AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.run_id = r.run_id
		AND (t.state = 'running' OR t.ended_at >= ?1))
	ORDER BY r.created_at LIMIT ?2)`

// pruneResumes deletes up to ?2 resumed attempts' records created before
// ?1 whose turn is pruned in the same pass or is gone, as pruneApprovals.
const pruneResumes = `DELETE FROM resumes WHERE run_id IN (SELECT r.run_id FROM resumes r
	WHERE r.created_at < ?1 AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.run_id = r.run_id
		AND (t.state = 'running' OR t.ended_at >= ?1))
	ORDER BY r.created_at LIMIT ?2)`

// Prune deletes, by the store's Retention measured back from now, old
// history, ended turns and their approvals, journal entries and finished
// outbox rows, in transactions of at most Retention.BatchRows rows each.
// It never deletes a running turn, its messages, journal entries or
// approvals, or an outbox row that is neither delivered nor given up. Deleted pages go to SQLite's freelist and
// are reused by later writes, so under a steady load the file stops
// growing; it is never VACUUMed (see docs/operations.md). It returns what
// it deleted; on an error, what it deleted so far.
func (s *SQLite) Prune(ctx context.Context, now time.Time) (PruneStats, error) {
	return RunPrune(ctx, s.retention, now, sqlitePrune{s})
}

// PruneBackend is what RunPrune needs of a backend. Queries are portable
// SQL with numbered parameters ?1, ?2, …; a time bound is passed as the
// time.Time itself.
type PruneBackend interface {
	// PruneExec runs one DELETE in its own short transaction and returns
	// the rows it deleted.
	PruneExec(ctx context.Context, query string, args ...any) (int64, error)
	// PruneKeys returns the strings (session keys) of a query's one column.
	PruneKeys(ctx context.Context, query string, args ...any) ([]string, error)
}

// RunPrune is Prune for any backend: the retention rules, their statements
// and the batching, with b running the SQL.
func RunPrune(ctx context.Context, r Retention, now time.Time, b PruneBackend) (PruneStats, error) {
	r = r.withDefaults()
	var ps PruneStats
	before := func(d time.Duration) time.Time { return now.Add(-d) }
	batches := func(count *int64, query string, args ...any) error {
		args = append(args, r.BatchRows)
		for {
			n, err := b.PruneExec(ctx, query, args...)
			*count += n
			if err != nil || n < int64(r.BatchRows) {
				return err
			}
		}
	}
	type step struct {
		on    bool
		count *int64
		what  string
		query string
		args  []any
	}
	steps := []step{
		{r.Journal > 0, &ps.Journal, "journal", `DELETE FROM journal WHERE id IN (SELECT id FROM journal
			WHERE at < ?1 AND ` + notRunning + ` ORDER BY at LIMIT ?2)`, []any{before(r.Journal)}},
		{r.History > 0, &ps.Messages, "messages", pruneMessages, []any{before(r.History)}},
		// Before the turns: an approval goes with its turn (or, its turn
		// gone, once it is as old), never one of a turn kept.
		{r.History > 0, &ps.Approvals, "approvals", pruneApprovals, []any{before(r.History)}},
		{r.History > 0, &ps.RetryTokens, "retry tokens", pruneRetryTokens, []any{before(r.History)}},
		{r.History > 0, &ps.Resumes, "resumes", pruneResumes, []any{before(r.History)}},
		{r.History > 0, &ps.Turns, "turns", `DELETE FROM turns WHERE run_id IN (SELECT run_id FROM turns
			WHERE state <> 'running' AND ended_at < ?1 LIMIT ?2)`, []any{before(r.History)}},
		{r.Outbox > 0, &ps.Outbox, "outbox", `DELETE FROM outbox WHERE id IN (SELECT id FROM outbox
			WHERE coalesce(delivered_at, failed_at) < ?1 LIMIT ?2)`, []any{before(r.Outbox)}},
	}
	for _, st := range steps {
		if !st.on {
			continue
		}
		if err := batches(st.count, st.query, st.args...); err != nil {
			return ps, fmt.Errorf("prune %s: %w", st.what, err)
		}
	}
	if limit := r.MaxMessagesPerSession; limit > 0 {
		long, err := b.PruneKeys(ctx, `SELECT session_key FROM messages GROUP BY session_key HAVING count(*) > ?1`, limit)
		if err != nil {
			return ps, fmt.Errorf("prune long sessions: %w", err)
		}
		for _, key := range long {
			// The oldest messages of the session beyond its newest limit
			// (never a running turn's).
			err := batches(&ps.Messages, `DELETE FROM messages WHERE id IN (SELECT id FROM messages
				WHERE session_key = ?1 AND `+notRunning+` AND id < (SELECT min(id) FROM (SELECT id FROM messages
					WHERE session_key = ?1 ORDER BY id DESC LIMIT ?2) AS newest)
				ORDER BY id LIMIT ?3)`, key, limit)
			if err != nil {
				return ps, fmt.Errorf("prune long sessions: %w", err)
			}
		}
	}
	if r.History > 0 {
		err := batches(&ps.Sessions, `DELETE FROM sessions WHERE key IN (SELECT key FROM sessions s
			WHERE updated_at < ?1
			AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.session_key = s.key)
			AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_key = s.key) LIMIT ?2)`, before(r.History))
		if err != nil {
			return ps, fmt.Errorf("prune sessions: %w", err)
		}
	}
	return ps, nil
}

// sqlitePrune runs Prune's statements on the SQLite store.
type sqlitePrune struct{ s *SQLite }

// args stores time bounds as Unix nanoseconds.
func (sqlitePrune) args(args []any) []any {
	for i, a := range args {
		if t, ok := a.(time.Time); ok {
			args[i] = nanos(t)
		}
	}
	return args
}

func (p sqlitePrune) PruneExec(ctx context.Context, query string, args ...any) (int64, error) {
	s := p.s
	release, err := s.acquire()
	if err != nil {
		return 0, err
	}
	defer release()
	var n int64
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, query, p.args(args)...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	s.rec.NoteWrite(err)
	return n, err
}

func (p sqlitePrune) PruneKeys(ctx context.Context, query string, args ...any) ([]string, error) {
	s := p.s
	release, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer release()
	rows, err := s.r.QueryContext(ctx, query, p.args(args)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}
