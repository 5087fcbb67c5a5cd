package pgcoord

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store/storetest"
)

// Concurrent claims and finishes of different sessions share commits
// (group commit, issue 21): 40 turns claimed at once and finished at once
// take far fewer than a commit each, and each turn is claimed and ended
// once, its terminal message in the outbox once.
func TestConcurrentTurnsShareCommits(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	p := db(t, url)
	if _, err := p.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		t.Skipf("no pg_stat_statements in the test server: %v", err)
	}
	const turns = 40
	var cost dbCost
	cost = measureDB(t, p, func() {
		r := join(t, url, "group", 30*time.Second, func(o *Options) { o.OutboxChannels = []string{"telegram"} })
		defer func() { _ = r.Leave(ctx) }()
		trs := make([]*storetest.Turn, turns)
		for i := range trs {
			trs[i] = storetest.NewTurn(fmt.Sprintf("run-%d", i), fmt.Sprintf("telegram:%d", i))
		}
		all := func(do func(tr *storetest.Turn) error) {
			var wg sync.WaitGroup
			for _, tr := range trs {
				wg.Go(func() {
					if err := do(tr); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
		}
		all(func(tr *storetest.Turn) error {
			return r.Claim(ctx, Claim{RunID: tr.Run, SessionKey: tr.Session, Channel: tr.Channel, ChatRef: tr.Chat, Text: "hi"})
		})
		all(func(tr *storetest.Turn) error {
			return r.Finish(ctx, tr.Ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "done" }))
		})
	}).per(turns)
	t.Logf("per turn, %d turns claimed and finished at once: %s", turns, cost)
	if cost.commits > 1.5 {
		t.Errorf("claim + finish of concurrent turns cost %s per turn; want fewer than 1.5 commits (shared)", cost)
	}
	if n := count(t, p, `SELECT count(*) FROM turns WHERE state = 'finished'`); n != turns {
		t.Errorf("%d turns finished, want %d", n, turns)
	}
	if n := count(t, p, `SELECT count(*) FROM outbox`); n != turns {
		t.Errorf("%d outbox rows, want %d (one a turn)", n, turns)
	}
}

// A group one of whose statements fails commits nothing of it; the others
// run again alone and succeed, the failing one fails alone.
func TestGroupWithAFailingStatementRunsTheOthersAlone(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	p := db(t, url)
	if _, err := p.Exec(ctx, `CREATE TABLE g (v text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	g := &committer{pool: p, running: true} // no group is sent until run below
	const n = 5
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			v := fmt.Sprint(i)
			if i == 2 {
				v = "\x00" // not valid text: the statement fails
			}
			var got string
			errs[i] = g.queryRow(ctx, `WITH w AS (INSERT INTO g VALUES ($1)) SELECT $1::text`, []any{v}, &got)
		})
	}
	sendGroup(g, n)
	wg.Wait()
	for i, err := range errs {
		_, isPg := errors.AsType[*pgconn.PgError](err)
		if i == 2 && !isPg || i != 2 && err != nil {
			t.Errorf("statement %d: %v", i, err)
		}
	}
	if got := count(t, p, `SELECT count(*) FROM g`); got != n-1 {
		t.Errorf("%d rows written, want %d", got, n-1)
	}
}

// A group's statements wait at most groupLockTimeout for a lock; alone, a
// statement waits as the server's setting says.
func TestGroupBoundsItsLockWaits(t *testing.T) {
	ctx := context.Background()
	p := db(t, pgtest.New(t))
	g := &committer{pool: p, running: true} // no group is sent until run below
	const n = 3
	got := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if err := g.queryRow(ctx, `SELECT current_setting('lock_timeout')`, nil, &got[i]); err != nil {
				t.Error(err)
			}
		})
	}
	sendGroup(g, n)
	wg.Wait()
	var alone string
	if err := g.queryRow(ctx, `SELECT current_setting('lock_timeout')`, nil, &alone); err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != "50ms" {
			t.Errorf("statement %d of a group: lock_timeout %q, want 50ms", i, v)
		}
	}
	if alone != "0" {
		t.Errorf("a statement alone: lock_timeout %q, want the server's 0", alone)
	}
}

// sendGroup sends g's queue as one group once n statements are queued (g
// made with running set, so nothing is sent before).
func sendGroup(g *committer, n int) {
	for {
		g.mu.Lock()
		queued := len(g.queue)
		g.mu.Unlock()
		if queued == n {
			break
		}
		time.Sleep(time.Millisecond) // real time: polls until the real goroutines have queued; no timer under test
	}
	g.run()
}

// Under contention a group starts no sooner than the pace after the last
// one (issue 21: at 300 turns/s offered, statements that came a few
// milliseconds apart each found no group in flight and went alone — 3.1
// commits and 1.5 WAL flushes a turn). A statement's transaction id tells
// its commit: a group's statements share one. A is in flight when B comes
// (contention); C and D come after A's answer, well inside the pace: B, C
// and D go as one group, where without the pace each went alone.
func TestPacedGroupsShareCommits(t *testing.T) {
	ctx := context.Background()
	p := db(t, pgtest.New(t))
	const pace = 400 * time.Millisecond
	g := &committer{pool: p, pace: pace}
	var a, b, c, d int64
	var wg sync.WaitGroup
	start := time.Now()
	run := func(at time.Duration, sql string, x *int64) {
		time.Sleep(time.Until(start.Add(at))) // real time: the statements arrive apart, as a loaded replica's claims and finishes do
		wg.Go(func() {
			if err := g.queryRow(ctx, sql, nil, x); err != nil {
				t.Error(err)
			}
		})
	}
	run(0, `SELECT txid_current() FROM pg_sleep(0.1)`, &a) // in flight for 100 ms
	run(20*time.Millisecond, `SELECT txid_current()`, &b)  // while A is pending
	run(200*time.Millisecond, `SELECT txid_current()`, &c) // after A's answer
	run(300*time.Millisecond, `SELECT txid_current()`, &d)
	wg.Wait()
	if took := time.Since(start); took >= pace+300*time.Millisecond {
		t.Skipf("the machine stalled: %s for what takes %s", took, pace)
	}
	if a == b || b != c || c != d {
		t.Errorf("transactions A %d, B %d, C %d, D %d: want A alone and B, C, D in one group (paced %s)", a, b, c, d, pace)
	}
}

// One caller's statements one after another — one turn at a time, a
// restore claiming queued messages in turn — are never contended and go
// at once: the pace costs them nothing.
func TestStatementsOneAfterAnotherAreNotPaced(t *testing.T) {
	ctx := context.Background()
	p := db(t, pgtest.New(t))
	g := &committer{pool: p, pace: time.Hour}
	done := make(chan error, 1)
	go func() {
		for range 20 {
			var x int64
			if err := g.queryRow(ctx, `SELECT txid_current()`, nil, &x); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("20 statements one after another waited for the pace (1 h)")
	}
}
