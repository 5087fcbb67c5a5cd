package pgcoord

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain()) // a replica process of TestSIGSTOPedOwner…
	}
	pgtest.Main(m)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// notice is the tests' interrupted notice: the run id, so each turn's is
// its own.
func notice(t store.Turn) string { return "⚠️ interrupted: " + t.RunID }

// takeovers collects what a replica's own survey loop took over.
type takeovers struct {
	mu  sync.Mutex
	all []Takeover
	at  []time.Time
}

func (k *takeovers) add(t Takeover) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.all = append(k.all, t)
	k.at = append(k.at, time.Now())
}

func (k *takeovers) of(epoch int64) (n int, first time.Time, turns []TakenTurn) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, t := range k.all {
		if t.Epoch == epoch {
			if n == 0 {
				first = k.at[i]
			}
			n++
			turns = append(turns, t.Turns...)
		}
	}
	return n, first, turns
}

// lasts is how many of epoch's takeovers were its last (More false):
// exactly one once the epoch is taken over, whichever survivors ended
// its batches (an empty one when others' batches ended every turn).
func (k *takeovers) lasts(epoch int64) (n int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, t := range k.all {
		if t.Epoch == epoch && !t.More {
			n++
		}
	}
	return n
}

// join makes a replica on url that leaves at the test's end.
func join(t testing.TB, url, id string, lease time.Duration, edit ...func(*Options)) *Replica {
	t.Helper()
	o := Options{ReplicaID: id, Lease: lease, Notice: notice, OutboxChannels: []string{"telegram"}, Logger: quiet, MaxConns: 16}
	for _, e := range edit {
		e(&o)
	}
	r, err := JoinURL(context.Background(), url, o)
	if err != nil {
		t.Fatalf("Join %s: %v", id, err)
	}
	t.Cleanup(func() { _ = r.Leave(context.Background()) })
	return r
}

// die stops r as a SIGKILL would: no more renewals, nothing written.
func die(r *Replica) {
	r.stop()
	r.bg.Wait()
}

// db is a pool for the test's own checks.
func db(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func count(t testing.TB, p *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := p.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// texts is the query's one text column, row by row.
func texts(t testing.TB, p *pgxpool.Pool, query string, args ...any) []string {
	t.Helper()
	rows, err := p.Query(context.Background(), query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return out
}

// expire ends r's lease now on the database's clock, as if it had not
// renewed in time.
func expire(t testing.TB, p *pgxpool.Pool, r *Replica) {
	t.Helper()
	if _, err := p.Exec(context.Background(), `UPDATE leases SET expires_at = now() WHERE epoch = $1`, r.Epoch()); err != nil {
		t.Fatal(err)
	}
}

// killWithTurns gives r n running turns in new sessions s-0 … s-(n-1)
// (insertTurns), then stops it as a SIGKILL would (die).
func killWithTurns(t testing.TB, p *pgxpool.Pool, r *Replica, n int) {
	t.Helper()
	ctx := context.Background()
	if _, err := p.Exec(ctx, `INSERT INTO sessions (key, created_at, updated_at)
		SELECT 's-' || i, now(), now() FROM generate_series(0, $1 - 1) i`, n); err != nil {
		t.Fatal(err)
	}
	if err := insertTurns(ctx, p, r, n); err != nil {
		t.Fatal(err)
	}
	die(r)
}

func finished(runID, reply string) event.Event {
	return event.Event{Kind: event.Finished, RunID: runID, StopReason: event.ReasonStop, FullText: reply, Time: time.Now()}
}

func fencedWithin(r *Replica, d time.Duration) bool {
	select {
	case <-r.Fenced():
		return true
	case <-time.After(d):
		return false
	}
}
