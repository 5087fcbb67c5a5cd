package postgres_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store/postgres"
)

// Two transactions that lock two rows in opposite orders deadlock on the
// real server: one of them is aborted (40P01). Under RetryConflicts both
// commit — the aborted one ran again — and each row holds both writes.
func TestRetryConflictsGetsThroughARealDeadlock(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.New(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE pair (id int PRIMARY KEY, n int NOT NULL); INSERT INTO pair VALUES (1, 0), (2, 0)`); err != nil {
		t.Fatal(err)
	}
	var first sync.WaitGroup // both hold their first row before either asks for its second
	first.Add(2)
	var conflicts atomic.Int32
	lockBoth := func(a, b int) func() error {
		attempt := 0
		return func() error {
			attempt++
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `UPDATE pair SET n = n + 1 WHERE id = $1`, a); err != nil {
					return err
				}
				if attempt == 1 {
					first.Done()
					first.Wait()
				}
				_, err := tx.Exec(ctx, `UPDATE pair SET n = n + 1 WHERE id = $1`, b)
				if postgres.IsConflict(err) {
					conflicts.Add(1)
				}
				return err
			})
		}
	}
	errs := make(chan error, 2)
	go func() { errs <- postgres.RetryConflicts(ctx, lockBoth(1, 2)) }()
	go func() { errs <- postgres.RetryConflicts(ctx, lockBoth(2, 1)) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("a transaction failed under RetryConflicts: %v", err)
		}
	}
	if conflicts.Load() == 0 {
		t.Fatal("the server reported no deadlock: the test did not make one")
	}
	var n1, n2 int
	if err := pool.QueryRow(ctx, `SELECT (SELECT n FROM pair WHERE id = 1), (SELECT n FROM pair WHERE id = 2)`).Scan(&n1, &n2); err != nil {
		t.Fatal(err)
	}
	if n1 != 2 || n2 != 2 {
		t.Fatalf("rows hold %d and %d writes, want 2 each (both transactions committed once)", n1, n2)
	}
}
