package pgtest_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func connect(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// Each test gets its own empty database on a loopback server that checks
// the password, with commits as durable as in production.
func TestNewGivesAFreshDatabase(t *testing.T) {
	ctx := context.Background()
	a, b := pgtest.New(t), pgtest.New(t)
	if a == b {
		t.Fatalf("two databases share a URL: %s", a)
	}
	u, err := url.Parse(a)
	if err != nil {
		t.Fatal(err)
	}
	if h := u.Hostname(); h != "127.0.0.1" {
		t.Errorf("host %q, want loopback", h)
	}
	ca := connect(t, a)
	if _, err := ca.Exec(ctx, `CREATE TABLE t (x int)`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := connect(t, b).QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 't'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the second database sees the first's table: n=%d err=%v", n, err)
	}
	var sc string
	if err := ca.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sc); err != nil || sc != "on" {
		t.Errorf("synchronous_commit = %q (%v), want on", sc, err)
	}

	wrong := *u
	wrong.User = url.UserPassword(u.User.Username(), "not-the-password")
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if c, err := pgx.Connect(cctx, wrong.String()); err == nil {
		c.Close(ctx)
		t.Error("a wrong password was accepted")
	}
}

// A test's database is gone after its cleanup.
func TestDatabaseDroppedAtCleanup(t *testing.T) {
	var name string
	t.Run("inner", func(t *testing.T) {
		u, _ := url.Parse(pgtest.New(t))
		name = strings.TrimPrefix(u.Path, "/")
	})
	admin := pgtest.New(t)
	var n int
	if err := connect(t, admin).QueryRow(context.Background(),
		`SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("database %s still exists after its test ended", name)
	}
}

// Restart stops the server (connections fail meanwhile) and starts it
// again on the same port with its data.
func TestRestartKeepsTheData(t *testing.T) {
	ctx := context.Background()
	u := pgtest.New(t)
	if _, err := connect(t, u).Exec(ctx, `CREATE TABLE t (x int); INSERT INTO t VALUES (42)`); err != nil {
		t.Fatal(err)
	}
	pgtest.Restart(t, func() {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if c, err := pgx.Connect(cctx, u); err == nil {
			c.Close(ctx)
			t.Error("connected to a stopped server")
		}
	})
	var x int
	if err := connect(t, u).QueryRow(ctx, `SELECT x FROM t`).Scan(&x); err != nil || x != 42 {
		t.Fatalf("after the restart: x=%d err=%v, want 42", x, err)
	}
}
