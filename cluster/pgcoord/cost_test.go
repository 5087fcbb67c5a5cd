package pgcoord

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store/postgres"
	"github.com/turnguard/turnguard/store/storetest"
)

// dbCost is what the database did for a piece of work: commits
// (pg_stat_database.xact_commit) and statements (pg_stat_statements calls,
// all of them, and those that are not BEGIN, COMMIT or SET).
type dbCost struct{ commits, calls, work float64 }

func (c dbCost) per(n int) dbCost {
	return dbCost{c.commits / float64(n), c.calls / float64(n), c.work / float64(n)}
}

func (c dbCost) String() string {
	return fmt.Sprintf("%.2f commits, %.2f statements (%.2f without BEGIN/COMMIT/SET)", c.commits, c.calls, c.work)
}

// measureDB runs work with every connection of its database its own (the
// pools work opens, closed again before it returns) and returns what the
// database did meanwhile. A backend reports its commits to
// pg_stat_database when it exits (or idles a while): measureDB waits until
// work's connections are gone before it reads.
func measureDB(t *testing.T, p *pgxpool.Pool, work func()) dbCost {
	t.Helper()
	ctx := context.Background()
	read := func() (c dbCost) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for count(t, p, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`) > 0 {
			if time.Now().After(deadline) {
				t.Fatal("the measured connections did not close")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if _, err := p.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			t.Fatal(err)
		}
		err := p.QueryRow(ctx, `SELECT xact_commit::float8 FROM pg_stat_database WHERE datname = current_database()`).Scan(&c.commits)
		if err == nil {
			err = p.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::float8,
				coalesce(sum(calls) FILTER (WHERE query !~* '^\s*(begin|commit|set|select pg_stat|select xact_commit|select count)'), 0)::float8
				FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&c.calls, &c.work)
		}
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	p.Reset() // the test's own pool holds no connection while work runs
	before := read()
	p.Reset()
	work()
	p.Reset()
	after := read()
	return dbCost{after.commits - before.commits, after.calls - before.calls, after.work - before.work}
}

// TestTurnDatabaseCost counts what one claimed turn costs the database:
// the coordination (Claim and Finish) alone, and the whole turn as a
// replica writes it (Claim, the recorder's TurnStarted, three steps and
// ending, Finish). Its figures are docs/performance.md's ("Cluster cost
// per turn"); it fails when the coordination takes more than one commit and
// one statement for the claim, and the same for the finish.
//
//	TURNGUARD_REQUIRE_POSTGRES=1 go test -count=1 -run TestTurnDatabaseCost -v ./cluster/pgcoord/
func TestTurnDatabaseCost(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	p := db(t, url)
	if _, err := p.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		t.Skipf("no pg_stat_statements in the test server: %v", err)
	}
	const turns = 200
	seq := 0
	run := func(withRecorder bool) {
		s, err := postgres.Open(ctx, url, postgres.Options{Shared: true, Logger: quiet, OutboxChannels: []string{"telegram"}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		r := join(t, url, "cost", 30*time.Second)
		defer func() { _ = r.Leave(ctx) }()
		for i := range turns {
			seq++
			tr := storetest.NewTurn(fmt.Sprintf("run-%d", seq), fmt.Sprintf("telegram:%d", i%20))
			if err := r.Claim(ctx, Claim{RunID: tr.Run, SessionKey: tr.Session, Channel: tr.Channel, ChatRef: tr.Chat, Text: "hi"}); err != nil {
				t.Fatal(err)
			}
			if withRecorder {
				s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "hi" }))
				for k := range uint32(3) {
					st := storetest.Step("tool", "shell", k+1, time.Duration(k)*time.Second)
					s.Handle(tr.Ev(event.StepStarted, time.Duration(k)*time.Second, func(e *event.Event) { e.Step = st }))
					s.Handle(tr.Ev(event.StepCompleted, time.Duration(k)*time.Second+time.Millisecond, func(e *event.Event) { e.Step = st }))
				}
			}
			end := tr.Ev(event.Finished, 4*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "done" })
			if err := r.Finish(ctx, end); err != nil {
				t.Fatal(err)
			}
			if withRecorder {
				s.Handle(end)
			}
		}
		if err := s.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	run(true) // warm-up: the schema, the first sessions
	coord := measureDB(t, p, func() { run(false) }).per(turns)
	whole := measureDB(t, p, func() { run(true) }).per(turns)
	t.Logf("per turn, claim + finish: %s", coord)
	t.Logf("per turn, whole turn with the recorder (3 steps): %s", whole)
	if coord.commits > 2.1 || coord.work > 2.1 {
		t.Errorf("claim + finish cost %s per turn; want ≤ 2 commits and ≤ 2 statements", coord)
	}
}
