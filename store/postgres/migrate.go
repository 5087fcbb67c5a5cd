package postgres

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/turnguard/turnguard/store"
)

// The schema is versioned in the table turnguard_schema (one row).
// migrations/NNNN_*.sql takes the schema from version NNNN-1 to NNNN; files
// are never edited once released, only added.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// SchemaVersion is the schema version this build writes: the number of
// migrations.
const SchemaVersion = 7

// migrationLock is the advisory lock key under which Open migrates
// ("turnguard" in ASCII, truncated to 64 bits), so replicas starting
// together take turns and the first does the work.
const migrationLock int64 = 0x7475726e67756172

// migrations is the ordered list, loaded once (a malformed embedded file
// panics at init).
var migrations = store.LoadMigrations(migrationFS, "migrations", SchemaVersion)

// migrate brings the database to SchemaVersion in one transaction, under
// the advisory lock: a replica that waited for it finds the work done.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrateTo(ctx, pool, SchemaVersion)
}

// Migrate brings the database behind pool to this build's schema, exactly
// as Open does (one transaction under the migration lock; a newer or a
// foreign database is refused untouched). It is for the packages that
// share the schema on a pool of their own (cluster/pgcoord); calling it
// with a store open on the same database is safe.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate(ctx, pool)
}

func migrateTo(ctx context.Context, pool *pgxpool.Pool, target int) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
			return fmt.Errorf("migrate: take the lock: %w", err)
		}
		v, err := schemaVersion(ctx, tx)
		if err != nil {
			return err
		}
		if v > SchemaVersion {
			return fmt.Errorf("schema version %d, this build knows up to %d: %w", v, SchemaVersion, store.ErrSchemaTooNew)
		}
		for _, m := range migrations[v:target] {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("migration %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, `UPDATE turnguard_schema SET version = $1`, m.Version); err != nil {
				return fmt.Errorf("migration %s: set schema version: %w", m.Name, err)
			}
		}
		return nil
	})
}

// schemaVersion reads the version, creating the version table in an empty
// database; a database with other tables and no version table is not
// ours.
func schemaVersion(ctx context.Context, tx pgx.Tx) (int, error) {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('turnguard_schema') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if !exists {
		var tables int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables); err != nil {
			return 0, fmt.Errorf("read schema: %w", err)
		}
		if tables > 0 {
			return 0, errNotOurs
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE turnguard_schema (version integer NOT NULL);
			INSERT INTO turnguard_schema (version) VALUES (0)`); err != nil {
			return 0, fmt.Errorf("create the schema version: %w", err)
		}
		return 0, nil
	}
	var v int
	if err := tx.QueryRow(ctx, `SELECT version FROM turnguard_schema`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}
