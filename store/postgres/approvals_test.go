package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/turnguard/turnguard/cluster/pgcoord"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/testwait"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"
	"github.com/turnguard/turnguard/store/storetest"
)

// In cluster mode: a live replica's claimed turn keeps its pending question
// through a start-up sweep; its owner's ending cancels it (the recorder
// writes no ending of a claimed turn, but cancels its questions); a dead
// replica's question is expired by the survivor's takeover, in the
// transaction that ends its turn.
func TestApprovalsOfClaimedTurns(t *testing.T) {
	url := pgtest.New(t)
	ctx := context.Background()
	s := open(t, url, postgres.Options{Shared: true})
	join := func(id string) *pgcoord.Replica {
		r, err := pgcoord.JoinURL(ctx, url, pgcoord.Options{ReplicaID: id, Lease: 2 * time.Second,
			Notice: func(store.Turn) string { return "⚠️ interrupted" }, Logger: storetest.Quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Leave(context.Background()) })
		return r
	}
	a, b := join("a"), join("b")
	turns := map[string]*storetest.Turn{}
	for _, run := range []string{"run-ends", "run-dies"} {
		if err := a.Claim(ctx, pgcoord.Claim{RunID: run, SessionKey: "s-" + run, Channel: "ws", Text: "go"}); err != nil {
			t.Fatal(err)
		}
		tr := storetest.NewTurn(run, "s-"+run)
		tr.Channel, tr.Chat = "ws", ""
		turns[run] = tr
		storetest.HandleAll(s, tr.Ev(event.TurnStarted, 0, nil),
			tr.Ev(event.ApprovalRequested, time.Second, func(e *event.Event) { e.Approval = storetest.Approval("ap-" + run) }))
	}
	storetest.Flush(t, s)
	if n, err := s.ExpireOrphanApprovals(ctx); err != nil || n != 0 {
		t.Fatalf("ExpireOrphanApprovals with a live replica's turns = %d, %v; want 0", n, err)
	}

	end := turns["run-ends"].Ev(event.Finished, 2*time.Second, func(e *event.Event) { e.StopReason = event.ReasonStop })
	if err := a.Finish(ctx, end); err != nil {
		t.Fatal(err)
	}
	s.Handle(end)
	storetest.Flush(t, s)
	if got := storetest.MustApproval(t, s, "ap-run-ends"); got.Status != event.ApprovalCancelled {
		t.Errorf("the question of a claimed turn that ended is %s, want cancelled", got.Status)
	}

	a.Abandon() // dies: its lease runs out, b takes run-dies over
	var taken []pgcoord.Takeover
	testwait.NoError(t, 10*time.Second, func() error { // real time: the lease runs out on the database's clock
		got, err := b.Survey(ctx)
		taken = append(taken, got...)
		if len(taken) == 0 {
			return fmt.Errorf("nothing taken over yet (%v)", err)
		}
		return err
	})
	var runIDs []string
	for _, tk := range taken {
		for _, tt := range tk.Turns {
			runIDs = append(runIDs, tt.RunID)
		}
	}
	storetest.EqStrings(t, "runs taken over", runIDs, []string{"run-dies"})
	// The takeover's own transaction expired it (with the turn it ended):
	// ExpireApprovals afterwards finds nothing left to do.
	if n, err := s.ExpireApprovals(ctx, runIDs); err != nil || n != 0 {
		t.Errorf("ExpireApprovals(%v) after the takeover = %d, %v; want 0", runIDs, n, err)
	}
	if got := storetest.MustApproval(t, s, "ap-run-dies"); got.Status != event.ApprovalExpired || got.ResolvedAt.IsZero() {
		t.Errorf("the dead replica's question = %+v, want expired", storetest.StateOf(got))
	}
}
