package postgres

import (
	"context"
	"regexp"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/store"
)

// Prune deletes, by the store's Retention measured back from now, old
// history, ended turns, journal entries and finished outbox rows, in
// transactions of at most Retention.BatchRows rows each; see
// store.SQLite.Prune (the same rules and statements, store.RunPrune).
// PostgreSQL's autovacuum makes the space reusable.
func (s *Store) Prune(ctx context.Context, now time.Time) (store.PruneStats, error) {
	if err := s.live(); err != nil {
		return store.PruneStats{}, err
	}
	return store.RunPrune(ctx, s.retention, now, pruner{s})
}

// pruner runs store.RunPrune's statements, whose ?N parameters become $N.
type pruner struct{ s *Store }

var (
	numbered  = regexp.MustCompile(`\?([0-9]+)`)
	rewriteMu sync.Mutex
	rewritten = map[string]string{}
)

// dollar rewrites ?N parameters to $N (memoised: Prune's statements are few).
func dollar(q string) string {
	rewriteMu.Lock()
	defer rewriteMu.Unlock()
	if r, ok := rewritten[q]; ok {
		return r
	}
	r := numbered.ReplaceAllString(q, `$$$1`)
	rewritten[q] = r
	return r
}

func (p pruner) PruneExec(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := p.s.inTx(ctx, false, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, dollar(query), args...)
		n = tag.RowsAffected()
		return err
	})
	return n, err
}

func (p pruner) PruneKeys(ctx context.Context, query string, args ...any) ([]string, error) {
	rows, err := p.s.pool.Query(ctx, dollar(query), args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
