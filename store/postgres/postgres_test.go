package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"
	"github.com/turnguard/turnguard/store/storetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// factory opens PostgreSQL stores on fresh databases of the test server.
var factory = storetest.Factory{
	New: func(t *testing.T) string { return pgtest.New(t) },
	Open: func(ctx context.Context, url string, c storetest.Config) (store.Backend, error) {
		return postgres.Open(ctx, url, postgres.WithCommitHooks(postgres.Options{Logger: storetest.Quiet, Shared: c.SecondProcess,
			OutboxChannels: c.OutboxChannels, OnOutbox: c.OnOutbox, Retention: c.Retention, BatchSize: c.BatchSize},
			c.BeforeCommit, c.AfterCommit))
	},
}

// The PostgreSQL store passes the suite every store passes.
func TestConformance(t *testing.T) { storetest.Run(t, factory) }

func open(t *testing.T, url string, opts postgres.Options) *postgres.Store {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = storetest.Quiet
	}
	s, err := postgres.Open(context.Background(), url, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// Several replicas starting together on an empty database: each Open
// succeeds, the schema is created once, at this build's version.
func TestReplicasMigrateOnce(t *testing.T) {
	url := pgtest.New(t)
	const replicas = 4
	var wg sync.WaitGroup
	errs := make(chan error, replicas)
	for range replicas {
		wg.Go(func() {
			s, err := postgres.Open(context.Background(), url, postgres.Options{Logger: storetest.Quiet, Shared: true})
			if err != nil {
				errs <- err
				return
			}
			errs <- s.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Open: %v", err)
		}
	}
	var v, rows int
	if err := connect(t, url).QueryRow(context.Background(),
		`SELECT max(version), count(*) FROM turnguard_schema`).Scan(&v, &rows); err != nil {
		t.Fatal(err)
	}
	if v != postgres.SchemaVersion || rows != 1 {
		t.Errorf("schema version %d in %d rows, want %d in 1", v, rows, postgres.SchemaVersion)
	}
}

// Open refuses, and leaves alone, a database of a newer turnguard and one
// that belongs to another application.
func TestOpenRefusesForeignOrNewerDatabases(t *testing.T) {
	ctx := context.Background()
	newer := pgtest.New(t)
	open(t, newer, postgres.Options{}).Close()
	if _, err := connect(t, newer).Exec(ctx, `UPDATE turnguard_schema SET version = version + 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.Open(ctx, newer, postgres.Options{Logger: storetest.Quiet}); !errors.Is(err, store.ErrSchemaTooNew) {
		t.Errorf("Open of a newer schema = %v, want ErrSchemaTooNew", err)
	}

	foreign := pgtest.New(t)
	c := connect(t, foreign)
	if _, err := c.Exec(ctx, `CREATE TABLE invoices (id int)`); err != nil {
		t.Fatal(err)
	}
	_, err := postgres.Open(ctx, foreign, postgres.Options{Logger: storetest.Quiet})
	if err == nil || !strings.Contains(err.Error(), "not a turnguard database") {
		t.Errorf("Open of another application's database = %v", err)
	}
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&n); err != nil || n != 1 {
		t.Errorf("the foreign database has %d tables (%v), want its one table only", n, err)
	}
}

// A connection error names the database without its password, and so does
// every error of Open.
func TestOpenErrorHidesThePassword(t *testing.T) {
	good := pgtest.New(t)
	u, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	const secret = "s3cret-Pa55word"
	u.User = url.UserPassword(u.User.Username(), secret)
	_, err = postgres.Open(context.Background(), u.String(), postgres.Options{Logger: storetest.Quiet})
	if err == nil {
		t.Fatal("Open with a wrong password succeeded")
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error shows the password: %v", err)
	}
	if !strings.Contains(err.Error(), "[redacted]@"+u.Host) {
		t.Errorf("error %q does not name the database", err)
	}
	if got := postgres.Redact(good); strings.Contains(got, pgtest.Password()) || !strings.Contains(got, u.Host) {
		t.Errorf("Redact(%q) = %q", "…", got)
	}
}

// A database that stops taking writes (here: made read-only, as a standby
// is) makes the store unwritable — Health says why, events wait — until it
// takes writes again; then what waited is written.
func TestReadOnlyDatabaseIsUnwritableUntilWritable(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	var mu sync.Mutex
	var health []string
	s := open(t, url, postgres.Options{OnHealth: func(err error) {
		mu.Lock()
		defer mu.Unlock()
		health = append(health, fmt.Sprint(err))
	}})
	admin := connect(t, url)
	setReadOnly := func(on bool) {
		t.Helper()
		if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET default_transaction_read_only = %v`,
			pgx.Identifier{strings.TrimPrefix(mustURL(t, url).Path, "/")}.Sanitize(), on)); err != nil {
			t.Fatal(err)
		}
		// The store's connections pick the setting up when they reconnect.
		if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
			t.Fatal(err)
		}
	}
	setReadOnly(true)
	tr := storetest.NewTurn("run-1", "s")
	storetest.HandleAll(s, tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "q" }))
	deadline := time.Now().Add(20 * time.Second)
	for s.Health() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the store never reported that it cannot write")
		}
		time.Sleep(20 * time.Millisecond) // real time: the writer's retries run on real timers
	}
	if err := s.Health(); !errors.Is(err, store.ErrUnwritable) {
		t.Errorf("Health = %v, want ErrUnwritable", err)
	}
	setReadOnly(false)
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.Flush(fctx); err != nil {
		t.Fatalf("Flush after the database took writes again: %v", err)
	}
	for s.Health() != nil {
		if time.Now().After(deadline.Add(20 * time.Second)) {
			t.Fatalf("still unwritable: %v", s.Health())
		}
		time.Sleep(20 * time.Millisecond) // real time: the health probe runs on the writer's real timer
	}
	if got := storetest.Msgs(storetest.MustHistory(t, s, "s")); len(got) != 1 || got[0].Text != "q" {
		t.Errorf("history = %+v, want the question that waited", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(health) < 2 || health[len(health)-1] != "<nil>" {
		t.Errorf("OnHealth calls = %q, want an error, then nil", health)
	}
}

// A second gateway on a database another gateway uses is refused, saying
// so without the password; once the first closes its store, it opens.
func TestSecondGatewayIsRefused(t *testing.T) {
	url := pgtest.New(t)
	first, err := postgres.Open(context.Background(), url, postgres.Options{Logger: storetest.Quiet})
	if err != nil {
		t.Fatal(err)
	}
	_, err = postgres.Open(context.Background(), url, postgres.Options{Logger: storetest.Quiet})
	var inUse *postgres.InUseError
	if !errors.As(err, &inUse) {
		_ = first.Close()
		t.Fatalf("second Open: %v, want *InUseError", err)
	}
	for _, want := range []string{"another gateway is using the database", "connected from 127.0.0.1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), pgtest.Password()) {
		t.Errorf("error shows the password: %v", err)
	}
	// Replicas of a cluster share the database.
	shared, err := postgres.Open(context.Background(), url, postgres.Options{Logger: storetest.Quiet, Shared: true})
	if err != nil {
		t.Errorf("Open with Shared beside the first gateway: %v", err)
	} else {
		_ = shared.Close()
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	open(t, url, postgres.Options{}) // the database is free again
}

// The server drops the connection that holds the gateway's lock (here:
// terminated, as by a server restart or a network cut). The store takes
// the lock again; if another gateway took it first, the store refuses new
// turns (Health) until it has the lock back.
func TestLockLostToAnotherGatewayMakesTheStoreUnwritable(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	s := open(t, url, postgres.Options{})
	admin := connect(t, url)
	thief := connect(t, url)
	// Cut the store's connections; the thief takes the lock as soon as
	// the server has released it.
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND pid NOT IN (pg_backend_pid(), $1)`, thief.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var got bool
		if err := thief.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, postgres.OwnerLock).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the terminated store's lock was never released")
		}
		time.Sleep(20 * time.Millisecond) // real time: the server releases the lock when it sees the connection end
	}
	for s.Health() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the store never noticed that another gateway holds the database")
		}
		time.Sleep(20 * time.Millisecond) // real time: the writer checks its lock on a real timer
	}
	if err := s.Health(); !errors.Is(err, store.ErrUnwritable) || !strings.Contains(err.Error(), "another gateway is using the database") {
		t.Errorf("Health = %v, want unwritable because another gateway holds the database", err)
	}
	if _, err := thief.Exec(ctx, `SELECT pg_advisory_unlock($1)`, postgres.OwnerLock); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for s.Health() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("still unwritable after the lock was free again: %v", s.Health())
		}
		time.Sleep(20 * time.Millisecond) // real time: the writer checks its lock on a real timer
	}
	// The store holds the lock again: another gateway is refused.
	if _, err := postgres.Open(ctx, url, postgres.Options{Logger: storetest.Quiet}); !errors.As(err, new(*postgres.InUseError)) {
		t.Errorf("Open beside the store that took its lock back: %v, want *InUseError", err)
	}
}

func mustURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
