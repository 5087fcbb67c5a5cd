package node

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/natstest"
	"github.com/turnguard/turnguard/internal/pgtest"
)

// BenchmarkTakeoverNotices measures a dead replica's takeover end to end
// on real PostgreSQL and nats-server processes: replica "dead" holds turns
// running turns (inserted in bulk, one per session), stops as a SIGKILL
// would, and two survivors, each importing every session's events as a
// replica with watchers does, race to take it over. From the dead lease's
// expiry (read from the database) it reports when no turn of the dead
// epoch is running any more (committed: its lease row is gone, polled
// every 5 ms; the running turns are counted once after) and when both
// survivors' imports have every interrupted end (notices). One iteration
// is one death; run it with -benchtime=Nx:
//
//	go test -run '^$' -bench TakeoverNotices -benchtime=3x ./cluster/node/
func BenchmarkTakeoverNotices(b *testing.B) {
	for _, turns := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("turns=%d", turns), func(b *testing.B) {
			c := natstest.Start(b, 1)
			dbURL := pgtest.New(b)
			ctx := context.Background()
			const lease = time.Second
			withLease := func(o *Options) { o.Lease = lease }
			s1, s2 := start(b, dbURL, c, "s1", withLease), start(b, dbURL, c, "s2", withLease)
			var ends [2]atomic.Int64
			for i, s := range []*Node{s1, s2} {
				b.Cleanup(s.Import(func(ev event.Event) {
					if ev.Kind == event.Aborted && ev.StopReason == event.ReasonInterrupted {
						ends[i].Add(1)
					}
				}, func(key string) { b.Errorf("a gap in session %s", key) }))
			}
			conn, err := pgx.Connect(ctx, dbURL)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { conn.Close(context.Background()) })
			if _, err := conn.Exec(ctx, `INSERT INTO sessions (key, created_at, updated_at)
				SELECT 'ws:t-' || i, now(), now() FROM generate_series(0, $1 - 1) i`, turns); err != nil {
				b.Fatal(err)
			}
			committed, noticed := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
			for i := range b.N {
				dead := start(b, dbURL, c, fmt.Sprintf("dead-%d", i), withLease)
				r := dead.coord.Load()
				if _, err := conn.Exec(ctx, `INSERT INTO turns (run_id, session_key, channel, chat_ref, state, started_at,
						updated_at, owner_replica, owner_epoch, step_kind, step_name, step_seq)
					SELECT $1 || '-' || i, 'ws:t-' || i, 'ws', i::text, 'running', now(), now(), $2, $3, 'tool', 'shell', 1
					FROM generate_series(0, $4 - 1) i`, r.Owner(), r.ID(), r.Epoch(), turns); err != nil {
					b.Fatal(err)
				}
				before := [2]int64{ends[0].Load(), ends[1].Load()}
				kill(dead)
				var expires time.Time
				if err := conn.QueryRow(ctx, `SELECT expires_at FROM leases WHERE epoch = $1`, r.Epoch()).Scan(&expires); err != nil {
					b.Fatal(err)
				}
				deadline := time.Now().Add(lease + 60*time.Second)
				var done time.Duration
				for done == 0 {
					// The lease row, not the turns: the last batch deletes it
					// in the transaction that ends the epoch's last running
					// turns, and reading one row costs the server next to
					// nothing, where counting the running turns every 5 ms
					// (2–4 ms each at 10,000) took a fair part of a core from
					// the takeover it measured.
					var leases int
					if err := conn.QueryRow(ctx, `SELECT count(*) FROM leases WHERE epoch = $1`, r.Epoch()).Scan(&leases); err != nil {
						b.Fatal(err)
					}
					if leases == 0 {
						done = time.Since(expires)
					} else if time.Now().After(deadline) {
						b.Fatalf("death %d: the lease is still there", i)
					}
					time.Sleep(5 * time.Millisecond) // real time: polls the real PostgreSQL until the takeover committed
				}
				var running int
				if err := conn.QueryRow(ctx, `SELECT count(*) FROM turns WHERE owner_epoch = $1 AND state = 'running'`,
					r.Epoch()).Scan(&running); err != nil {
					b.Fatal(err)
				}
				if running != 0 {
					b.Fatalf("death %d: the lease is gone with %d turns still running", i, running)
				}
				committed = append(committed, done)
				for ends[0].Load()-before[0] < int64(turns) || ends[1].Load()-before[1] < int64(turns) {
					if time.Now().After(deadline) {
						b.Fatalf("death %d: the survivors imported %d and %d of %d ends", i,
							ends[0].Load()-before[0], ends[1].Load()-before[1], turns)
					}
					time.Sleep(5 * time.Millisecond) // real time: polls until the survivors imported the ends over the real NATS
				}
				noticed = append(noticed, time.Since(expires))
			}
			slices.Sort(committed)
			slices.Sort(noticed)
			b.ReportMetric(committed[len(committed)/2].Seconds(), "committed-p50-s")
			b.ReportMetric(committed[len(committed)-1].Seconds(), "committed-max-s")
			b.ReportMetric(noticed[len(noticed)/2].Seconds(), "notices-p50-s")
			b.ReportMetric(noticed[len(noticed)-1].Seconds(), "notices-max-s")
			b.ReportMetric(0, "ns/op")
		})
	}
}
