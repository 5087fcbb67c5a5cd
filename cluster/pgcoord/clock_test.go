package pgcoord

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/testwait"
)

// argTracer records every statement a pool's connections send, with its
// arguments.
type argTracer struct {
	mu    sync.Mutex
	sent  []pgx.TraceQueryStartData
	times []string // the statements that carried a time, and which argument
}

func (a *argTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sent = append(a.sent, d)
	for i, arg := range d.Args {
		switch arg.(type) {
		case time.Time, *time.Time, pgtype.Timestamptz, pgtype.Timestamp, pgtype.Date:
			a.times = append(a.times, fmt.Sprintf("$%d of %s", i+1, strings.Join(strings.Fields(d.SQL), " ")))
		}
	}
	return ctx
}

func (a *argTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Wall-clock skew between replicas cannot matter, by construction: a
// replica never sends a time of its own. Every lease, expiry, hold and
// turn time is the database's now(); the replica sends only durations.
// Shown by tracing every statement of a replica's whole life — join,
// renewals, claims, a finish, a takeover of a dead replica, outbox claims,
// leave — and finding no time among the arguments.
func TestReplicasSendNoTimeOfTheirOwn(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	tr := &argTracer{}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// A lease long enough that a loaded machine (make test runs packages
	// in parallel under the race detector) renews it in time: a 300 ms one
	// fenced once at 200 ms without a renewal.
	const lease = time.Second
	var seen takeovers
	opts := func(id string) Options {
		return Options{ReplicaID: id, Lease: lease, Notice: notice, OutboxChannels: []string{"telegram"}, Logger: quiet,
			OnTakeover: seen.add}
	}
	a, err := Join(ctx, pool, opts("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Join(ctx, pool, opts("b"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := a.Claim(ctx, Claim{RunID: fmt.Sprint("run-", i), SessionKey: fmt.Sprint("telegram:", i), Channel: "telegram",
			ChatRef: "1", Text: "hi"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Claim(ctx, Claim{RunID: "run-x", SessionKey: "telegram:0"}); err == nil {
		t.Fatal("a busy session was claimed")
	}
	if err := a.Finish(ctx, finished("run-0", "done")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * lease) // real time: renewals go out on real timers
	die(a)
	testwait.Until(t, 2*lease+time.Second, "b takes a over", func() bool { n, _, _ := seen.of(a.Epoch()); return n == 1 })
	ms, err := b.ClaimOutbox(ctx, "telegram", 10, time.Minute)
	if err != nil || len(ms) != 3 {
		t.Fatalf("ClaimOutbox = %d rows, %v; want the final and 2 notices", len(ms), err)
	}
	if err := b.ReleaseOutbox(ctx, ms[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := b.Leave(ctx); err != nil {
		t.Fatal(err)
	}

	tr.mu.Lock()
	defer tr.mu.Unlock()
	renewals := 0
	for _, d := range tr.sent {
		if strings.Contains(d.SQL, "UPDATE leases SET renewed_at") {
			renewals++
		}
	}
	if renewals < 3 || len(tr.sent) < 20 {
		t.Fatalf("traced %d statements, %d renewals: the tracer saw too little", len(tr.sent), renewals)
	}
	for _, s := range tr.times {
		t.Errorf("a replica sent a time: %s", s)
	}
}
