package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// The schema is versioned by PRAGMA user_version. migrations/NNNN_*.sql is
// the SQL that takes the schema from version NNNN-1 to NNNN; files are never
// edited once released, only added.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one step of a backend's schema: the SQL that takes it from
// Version-1 to Version.
type Migration struct {
	Version int
	Name    string // the file's name
	SQL     string
}

// SchemaVersion is the schema version this build writes: the number of
// migrations.
const SchemaVersion = 12

// migrations is the ordered list, loaded once.
var migrations = LoadMigrations(migrationFS, "migrations", SchemaVersion)

// LoadMigrations reads dir/NNNN_*.sql of fsys, ordered by version, and
// panics unless they are numbered 1 to want without a gap: a malformed or
// missing embedded file is a build defect, so it fails at init (and in
// every test).
func LoadMigrations(fsys fs.FS, dir string, want int) []Migration {
	names, err := fs.Glob(fsys, dir+"/*.sql")
	if err != nil {
		panic(err)
	}
	sort.Strings(names)
	out := make([]Migration, 0, len(names))
	for i, name := range names {
		base := path.Base(name)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v != i+1 {
			panic(fmt.Sprintf("migration %s: want version %04d", name, i+1))
		}
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			panic(err)
		}
		out = append(out, Migration{Version: v, Name: base, SQL: string(b)})
	}
	if len(out) != want {
		panic(fmt.Sprintf("%d migrations embedded in %s, the schema version is %d", len(out), dir, want))
	}
	return out
}

// userVersion reads the schema version.
func userVersion(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (int, error) {
	var v int
	if err := q.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return 0, err
	}
	return v, nil
}

// checkVersion returns the schema version of db, or an error if this build
// must not touch it: a newer schema (ErrSchemaTooNew), or tables without a
// version (another application's database).
func checkVersion(ctx context.Context, db *sql.DB) (int, error) {
	v, err := userVersion(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if v > SchemaVersion {
		return v, fmt.Errorf("schema version %d, this build knows up to %d: %w", v, SchemaVersion, ErrSchemaTooNew)
	}
	if v == 0 {
		// Version 0 is an empty file. One with tables belongs to something
		// else: do not add ours to it.
		var tables int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema`).Scan(&tables); err != nil {
			return 0, fmt.Errorf("read schema: %w", err)
		}
		if tables > 0 {
			return 0, errors.New("not a turnguard database: it has tables but no schema version")
		}
	}
	return v, nil
}

// migrate brings db to schema version target (0 < target <= SchemaVersion),
// one transaction per version, and returns the version it started from. It
// refuses what checkVersion refuses. Safe against a concurrent migrator:
// each step re-reads the version inside its write transaction.
func migrate(ctx context.Context, db *sql.DB, target int) (from int, err error) {
	if from, err = checkVersion(ctx, db); err != nil {
		return from, err
	}
	for _, m := range migrations[:target] {
		if err := applyMigration(ctx, db, m); err != nil {
			return from, err
		}
	}
	return from, nil
}

func applyMigration(ctx context.Context, db *sql.DB, m Migration) error {
	tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE (see the DSN)
	if err != nil {
		return fmt.Errorf("migration %s: begin: %w", m.Name, err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	cur, err := userVersion(ctx, tx)
	if err != nil {
		return fmt.Errorf("migration %s: read schema version: %w", m.Name, err)
	}
	if cur >= m.Version {
		return nil
	}
	if cur != m.Version-1 {
		return fmt.Errorf("migration %s: schema is at version %d, want %d", m.Name, cur, m.Version-1)
	}
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return fmt.Errorf("migration %s: %w", m.Name, err)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", m.Version)); err != nil {
		return fmt.Errorf("migration %s: set schema version: %w", m.Name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migration %s: commit: %w", m.Name, err)
	}
	return nil
}
