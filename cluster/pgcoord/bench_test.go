package pgcoord

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/turnguard/turnguard/internal/pgtest"
)

// report adds the p50, p99 and max of lat to b's metrics, in ns.
func report(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(lat[len(lat)-1].Nanoseconds()), "max-ns")
	b.ReportMetric(0, "ns/op") // the percentiles say it; ns/op would count the set-up
}

// BenchmarkClaim measures Claim against the real server, one call at a
// time: busy (another replica holds the session: the answer a second
// message anywhere in the cluster gets) and free (a new session: the
// durable claim transaction). The test server runs with fsync off unless
// TURNGUARD_PGTEST_FSYNC=on:
//
//	TURNGUARD_PGTEST_FSYNC=on go test -run '^$' -bench Claim -benchtime=2000x ./cluster/pgcoord/
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	url := pgtest.New(b)
	holder, r := join(b, url, "holder", 10*time.Second), join(b, url, "claimer", 10*time.Second)
	if err := holder.Claim(ctx, Claim{RunID: "held", SessionKey: "telegram:1", Channel: "telegram", ChatRef: "1", Text: "hi"}); err != nil {
		b.Fatal(err)
	}
	seq := 0 // run ids and free sessions stay new across b.N rounds
	for _, mode := range []string{"busy", "free"} {
		b.Run("session="+mode, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			for i := range b.N {
				seq++
				c := Claim{RunID: fmt.Sprintf("%s-%d", mode, seq), SessionKey: "telegram:1", Channel: "telegram", ChatRef: "1", Text: "hi"}
				if mode == "free" {
					c.SessionKey = fmt.Sprintf("telegram:free-%d", seq)
				}
				start := time.Now()
				err := r.Claim(ctx, c)
				lat = append(lat, time.Since(start))
				if (mode == "busy") != (err != nil) {
					b.Fatalf("claim %d on a %s session: %v", i, mode, err)
				}
			}
			report(b, lat)
		})
	}
}

// BenchmarkTakeover measures a dead replica's takeover: from its lease's
// expiry (its last renewal + the lease, read from the database) to the
// surviving replica's OnTakeover, after the commit that ended every one of
// its running turns as interrupted (history, journal, outbox for the half
// on Telegram) — with more than takeoverBatch turns, the commit of its
// last batch. Each iteration is one death of a replica holding turns
// running turns (inserted in bulk), with a 500 ms lease; run ≥ 50:
//
//	go test -run '^$' -bench Takeover -benchtime=50x -timeout 30m ./cluster/pgcoord/
func BenchmarkTakeover(b *testing.B) {
	for _, turns := range []int{1, 1000, 10000} {
		b.Run(fmt.Sprintf("turns=%d", turns), func(b *testing.B) {
			ctx := context.Background()
			url := pgtest.New(b)
			const lease = 500 * time.Millisecond
			taken := make(chan Takeover, 16)
			join(b, url, "survivor", lease, func(o *Options) { o.OnTakeover = func(t Takeover) { taken <- t } })
			p := db(b, url)
			if _, err := p.Exec(ctx, `INSERT INTO sessions (key, created_at, updated_at)
				SELECT 's-' || i, now(), now() FROM generate_series(0, $1 - 1) i`, turns); err != nil {
				b.Fatal(err)
			}
			lat, overdue := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
			for i := range b.N {
				dead := join(b, url, "dead", lease) // a new epoch each time

				if err := insertTurns(ctx, p, dead, turns); err != nil {
					b.Fatal(err)
				}
				die(dead)
				var expires time.Time
				if err := p.QueryRow(ctx, `SELECT expires_at FROM leases WHERE epoch = $1`, dead.Epoch()).Scan(&expires); err != nil {
					b.Fatal(err)
				}
				got := 0 // a takeover of more than takeoverBatch turns comes in batches
				for more := true; more; {
					select {
					case t := <-taken:
						if t.Epoch != dead.Epoch() {
							b.Fatalf("took over %s#%d, want %s", t.Replica, t.Epoch, dead.Owner())
						}
						got, more = got+len(t.Turns), t.More
						if !more {
							// The database and this process read the same
							// host clock: the difference is the takeover's
							// latency (to its last batch).
							lat = append(lat, time.Since(expires))
							overdue = append(overdue, t.Overdue)
						}
					case <-time.After(lease + 30*time.Second):
						b.Fatalf("death %d: no takeover", i)
					}
				}
				if got != turns {
					b.Fatalf("took %d turns over, want %d", got, turns)
				}
			}
			slices.Sort(overdue)
			b.ReportMetric(float64(overdue[len(overdue)/2].Nanoseconds()), "db-overdue-p50-ns")
			report(b, lat)
		})
	}
}

// insertTurns gives r n running turns, one per session s-0 … s-(n-1), half
// of them Telegram's, as n claims would.
func insertTurns(ctx context.Context, p *pgxpool.Pool, r *Replica, n int) error {
	_, err := p.Exec(ctx, `INSERT INTO turns (run_id, session_key, channel, chat_ref, state, started_at, updated_at,
			owner_replica, owner_epoch, step_kind, step_name, step_seq)
		SELECT $1 || '-' || i, 's-' || i, CASE WHEN i % 2 = 0 THEN 'telegram' ELSE 'ws' END, i::text, 'running',
			now(), now(), $2, $3, 'tool', 'shell', 1
		FROM generate_series(0, $4 - 1) i`, r.Owner(), r.ID(), r.Epoch(), n)
	return err
}
