package gateway_test

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/cluster/inproc"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/internal/faketime"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
)

// Queued messages in the cluster, as TestLifecycleModelCluster found them
// lost or stuck (issue 20): each test is one of its counterexamples, made
// deterministic.

// TestClusterAmbiguousClaimOfAQueuedMessageIsReadBack: the claim of a
// queued message commits but its answer is lost (a request cancelled
// mid-COMMIT). The engine reads the claim back through the cluster
// (Holder) and runs the message. Guessed "not claimed", it published
// turn_started and an error ending ("could not be started … send it
// again") while the cluster held the session for that run, and every later
// message of the session failed the same way.
func TestClusterAmbiguousClaimOfAQueuedMessageIsReadBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := config.Default()
		c.Agents.Defaults.Busy.Mode = config.BusyQueue
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		d := demo.New()
		m := &lossyMember{Member: inproc.NewHub().Join("a")}
		e, err := gateway.New(gateway.Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": d}, Cluster: m})
		if err != nil {
			t.Fatal(err)
		}
		m.Serve(e)
		e.Start(t.Context())
		t.Cleanup(func() { d.Release(); e.Shutdown(context.Background()) })
		send(t, e, "r1", "/steps shell:5s say:first")
		synctest.Wait()
		for _, id := range []string{"r2", "r3"} {
			if ack, err := send(t, e, id, "/steps say:queued"); err != nil || ack.Status != gateway.StatusQueued {
				t.Fatalf("%s: %+v %v, want queued", id, ack, err)
			}
		}
		m.mu.Lock()
		m.loseClaim = true // r2's claim, once r1 ends
		m.mu.Unlock()
		faketime.Advance(10 * time.Second)
		for _, id := range []string{"r2", "r3"} {
			out, ok := e.Wait(context.Background(), id)
			if !ok || out.Status != gateway.StatusOK || out.Text != "queued" {
				t.Fatalf("%s after r2's claim lost its answer: %+v %v, want it run", id, out, ok)
			}
		}
		if !slices.Equal(m.lostClaims, []string{"r2"}) {
			t.Fatalf("claims that lost their answer: %v, want [r2]", m.lostClaims)
		}
		if run, _, held, _ := m.Holder(context.Background(), "main"); held {
			t.Fatalf("the session is still held for %s with nothing running", run)
		}
	})
}

// TestClusterStoredQueueMergesIntoAHeldSession: replica a runs r1 with r2
// queued (stored) and loses its lease; before the survivor b restores a's
// queue, a new message r3 starts the session on b, and r4 queues behind
// it. The restore merges r2 into b's queue, ahead of r4 (it was sent
// first). Skipping a held session (assumed to hold its queue), it left r2
// stored and never run.
func TestClusterStoredQueueMergesIntoAHeldSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rs := queuedBehind(t, "/steps shell:30s", 0, "/steps say:second")
		rs[0].member.Kill() // r1 is taken over; r2 waits in a's memory and the store
		rs[0].e.Fenced()
		synctest.Wait()
		if ack, err := send(t, rs[1].e, "r3", "/steps shell:5s say:third"); err != nil || ack.Status != gateway.StatusStarted {
			t.Fatalf("r3 through the survivor: %+v %v, want started", ack, err)
		}
		if ack, err := send(t, rs[1].e, "r4", "/steps say:fourth"); err != nil || ack.Status != gateway.StatusQueued {
			t.Fatalf("r4 through the survivor: %+v %v, want queued", ack, err)
		}
		if err := rs[1].e.RestoreQueuedOf(context.Background(), []string{"main"}); err != nil {
			t.Fatal(err)
		}
		faketime.Advance(10 * time.Second)
		for _, id := range []string{"r2", "r4"} {
			out, ok := rs[1].e.Wait(context.Background(), id)
			if !ok || out.Status != gateway.StatusOK {
				t.Fatalf("%s on the survivor: %+v %v, want it run", id, out, ok)
			}
		}
		var started []string
		rs[1].mu.Lock()
		for _, ev := range rs[1].local {
			if ev.Kind == event.TurnStarted {
				started = append(started, ev.RunID)
			}
		}
		rs[1].mu.Unlock()
		if want := []string{"r3", "r2", "r4"}; !slices.Equal(started, want) {
			t.Fatalf("turns started on the survivor: %v, want %v", started, want)
		}
	})
}
