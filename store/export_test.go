package store

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
)

// WithBeforeBatch returns o with a hook the writer goroutine calls before
// writing each batch; tests block in it to hold the writer.
func WithBeforeBatch(o Options, f func()) Options {
	o.beforeBatch = f
	return o
}

// CreateAtVersion creates the database at path with the schema migrated to
// version v only, as an older turnguard would have left it.
func CreateAtVersion(ctx context.Context, path string, v int) error {
	db, err := sql.Open("sqlite", dsn(path, false, url.Values{"_txlock": {"immediate"}}))
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = migrate(ctx, db, v)
	return err
}

// UserVersion reads the schema version of the database at path.
func UserVersion(ctx context.Context, path string) (int, error) {
	db, err := sql.Open("sqlite", dsn(path, false, url.Values{}))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	return userVersion(ctx, db)
}

// ExecFile runs SQL against the database at path (fixtures).
func ExecFile(ctx context.Context, path, query string) error {
	db, err := sql.Open("sqlite", dsn(path, false, url.Values{"_pragma": {"foreign_keys(1)"}}))
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, query)
	return err
}

// JournalMode reads the journal mode of the database at path.
func JournalMode(ctx context.Context, path string) (string, error) {
	db, err := sql.Open("sqlite", dsn(path, false, url.Values{}))
	if err != nil {
		return "", err
	}
	defer db.Close()
	var mode string
	err = db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode)
	return mode, err
}

// LimitPages sets SQLite's max_page_count on the store's write connection
// to the current page count plus extra, so writes that need more pages fail
// with SQLITE_FULL (a full disk, for tests); a large extra lifts the limit.
func LimitPages(s *SQLite, extra int64) (int64, error) {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	ctx := context.Background()
	var n int64
	if err := s.w.QueryRowContext(ctx, "PRAGMA page_count").Scan(&n); err != nil {
		return 0, err
	}
	var got int64
	err := s.w.QueryRowContext(ctx, fmt.Sprintf("PRAGMA max_page_count = %d", n+extra)).Scan(&got)
	return got, err
}

// Pages reports the database's page count and its free pages, as the write
// connection sees them.
func Pages(s *SQLite) (pages, free int64, err error) {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	ctx := context.Background()
	if err := s.w.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
		return 0, 0, err
	}
	err = s.w.QueryRowContext(ctx, "PRAGMA freelist_count").Scan(&free)
	return pages, free, err
}

// IntegrityCheck runs PRAGMA integrity_check on the database at path.
func IntegrityCheck(ctx context.Context, path string) (string, error) {
	db, err := sql.Open("sqlite", dsn(path, false, url.Values{}))
	if err != nil {
		return "", err
	}
	defer db.Close()
	var res string
	err = db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&res)
	return res, err
}

// PruneMessagesQuery is Prune's statement for old messages.
const PruneMessagesQuery = pruneMessages

// QueryPlan returns the details of EXPLAIN QUERY PLAN of query on the
// database at path, one line each.
func QueryPlan(ctx context.Context, path, query string, args ...any) ([]string, error) {
	db, err := sql.Open("sqlite", dsn(path, false, url.Values{}))
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, "EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			return nil, err
		}
		out = append(out, detail)
	}
	return out, rows.Err()
}

// WithCommitHooks returns o with hooks the writer goroutine calls inside a
// batch's transaction just before its commit and just after it; tests kill
// the process there to simulate a crash.
func WithCommitHooks(o Options, before, after func()) Options {
	o.beforeCommit, o.afterCommit = before, after
	return o
}
