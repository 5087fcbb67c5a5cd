package pgcoord

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/testwait"
)

// PostgreSQL stops for longer than a lease and comes back. While it is
// down every replica fences itself within 2/3 of the lease (its runs must
// stop, publishing nothing), and a claim fails without a busy or duplicate
// answer. After the restart the fenced epochs stay fenced (their Finish is
// stale); the replicas join again with new epochs, a survey takes the old
// epochs over, and each turn that was running ends as interrupted exactly
// once; its session is free again.
func TestDatabaseRestartFencesAndEachTurnIsInterruptedOnce(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	const lease = time.Second
	a, b := join(t, url, "a", lease), join(t, url, "b", lease)
	turns := map[*Replica][]string{a: {"a-0", "a-1", "a-2"}, b: {"b-0", "b-1"}}
	for r, runs := range turns {
		for _, run := range runs {
			if err := r.Claim(ctx, Claim{RunID: run, SessionKey: "telegram:" + run, Channel: "telegram", ChatRef: run}); err != nil {
				t.Fatal(err)
			}
		}
	}
	pgtest.Restart(t, func() {
		down := time.Now()
		for _, r := range []*Replica{a, b} {
			if !fencedWithin(r, lease) {
				t.Errorf("%s not fenced within a lease of the server stopping", r.ID())
			}
		}
		t.Logf("fenced %s after the server stopped", time.Since(down).Round(time.Millisecond))
		err := a.Claim(ctx, Claim{RunID: "during", SessionKey: "telegram:new"})
		var be *BusyError
		var de *DuplicateError
		if err == nil || errors.As(err, &be) || errors.As(err, &de) {
			t.Errorf("a claim while the server is down: %v, want a plain failure", err)
		}
		time.Sleep(time.Until(down.Add(lease))) // real time: the server stays down for a whole lease
	})
	if err := a.Finish(ctx, finished("a-0", "late")); !errors.Is(err, ErrStale) {
		t.Errorf("a fenced replica's Finish after the restart: %v, want ErrStale", err)
	}
	var seen takeovers
	var again []*Replica
	for _, id := range []string{"a", "b"} {
		var r *Replica
		testwait.Until(t, 10*time.Second, "joining again after the restart", func() bool {
			var err error
			r, err = JoinURL(ctx, url, Options{ReplicaID: id, Lease: lease, Notice: notice, OutboxChannels: []string{"telegram"},
				Logger: quiet, OnTakeover: seen.add})
			return err == nil
		})
		t.Cleanup(func() { _ = r.Leave(context.Background()) })
		again = append(again, r)
	}
	p := db(t, url)
	for _, r := range []*Replica{a, b} {
		testwait.Until(t, lease+time.Second, "the old epoch of "+r.ID()+" is taken over", func() bool {
			n, _, _ := seen.of(r.Epoch())
			return n == 1
		})
		if _, _, taken := seen.of(r.Epoch()); len(taken) != len(turns[r]) {
			t.Errorf("%s's old epoch: %d turns taken over, want %d", r.ID(), len(taken), len(turns[r]))
		}
	}
	for _, runs := range turns {
		for _, run := range runs {
			if n := count(t, p, `SELECT count(*) FROM messages WHERE run_id = $1 AND stop_reason = 'interrupted'`, run); n != 1 {
				t.Errorf("%s: %d interrupted notices in the history, want 1", run, n)
			}
			if n := count(t, p, `SELECT count(*) FROM outbox WHERE run_id = $1`, run); n != 1 {
				t.Errorf("%s: %d outbox rows, want its notice", run, n)
			}
			if err := again[0].Claim(ctx, Claim{RunID: run + "-next", SessionKey: "telegram:" + run}); err != nil {
				t.Errorf("%s's session after the takeover: %v", run, err)
			}
		}
	}
}
