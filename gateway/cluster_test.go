package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
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
	"github.com/turnguard/turnguard/timeout"
)

// These tests run several engines in one synctest bubble, joined by the
// in-process cluster (cluster/inproc): what a user of one replica sees of
// a session whose turn another replica runs. The same engine code runs on
// PostgreSQL and NATS in production (cluster/node; e2e/cluster drives
// three real processes).

// replica is one engine of the test cluster and what its bus and its
// imported events showed.
type replica struct {
	e      *gateway.Engine
	member *inproc.Member
	mu     sync.Mutex
	local  []event.Event // its own bus
	remote []event.Event // imported from the others
	gaps   []string
}

func (r *replica) kinds(remote bool, runID string) []event.Kind {
	r.mu.Lock()
	defer r.mu.Unlock()
	evs := r.local
	if remote {
		evs = r.remote
	}
	var out []event.Kind
	for _, ev := range evs {
		if ev.RunID == runID && ev.Kind != event.Delta {
			out = append(out, ev.Kind)
		}
	}
	return out
}

func (r *replica) terminal(remote bool, runID string) (event.Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	evs := r.local
	if remote {
		evs = r.remote
	}
	for _, ev := range evs {
		if ev.RunID == runID && ev.Kind.Terminal() {
			return ev, true
		}
	}
	return event.Event{}, false
}

// startCluster starts n engines on the demo runner, joined by one hub.
func startCluster(t *testing.T, n int, adjust func(*config.Config)) []*replica {
	return startClusterWith(t, n, adjust, nil)
}

// startClusterWith is startCluster with a QueueStore the engines share (as
// replicas share the database's queued messages).
func startClusterWith(t *testing.T, n int, adjust func(*config.Config), q gateway.QueueStore) []*replica {
	t.Helper()
	c := config.Default()
	c.Agents.Defaults.AbortGraceSeconds = ptr(1.0)
	if adjust != nil {
		adjust(c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	hub := inproc.NewHub()
	var out []*replica
	for i := range n {
		d := demo.New()
		t.Cleanup(d.Release)
		r := &replica{member: hub.Join(string(rune('a' + i)))}
		e, err := gateway.New(gateway.Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": d},
			Cluster: r.member, Queue: q})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		e.Start(ctx)
		r.e = e
		r.member.Serve(e)
		unsub := e.Bus().Subscribe("", func(ev event.Event) { r.mu.Lock(); r.local = append(r.local, ev); r.mu.Unlock() })
		stop := e.Import(func(ev event.Event) { r.mu.Lock(); r.remote = append(r.remote, ev); r.mu.Unlock() },
			func(key string) { r.mu.Lock(); r.gaps = append(r.gaps, key); r.mu.Unlock() })
		t.Cleanup(func() {
			e.Shutdown(context.Background())
			stop()
			unsub()
			cancel()
		})
		out = append(out, r)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

func send(t *testing.T, e *gateway.Engine, runID, text string) (gateway.Ack, error) {
	t.Helper()
	return e.Send(context.Background(), gateway.SendRequest{SessionKey: "main", Channel: "ws", RunID: runID, Text: text, Owner: "u1"})
}

// A second replica answers a message for a session another replica runs
// as busy, with the running turn's run id (busy mode reject), and the turn
// ends once, on its own replica, seen by the other's watchers.
func TestClusterBusyAnswerNamesTheHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rs := startCluster(t, 3, func(c *config.Config) { c.Agents.Defaults.Busy.Mode = config.BusyReject })
		if ack, err := send(t, rs[0].e, "r1", "/steps shell:2s say:done"); err != nil || ack.Status != gateway.StatusStarted {
			t.Fatalf("first send: %+v %v", ack, err)
		}
		synctest.Wait()
		for i, r := range rs[1:] {
			_, err := send(t, r.e, "r"+string(rune('2'+i)), "hello")
			var busy *gateway.BusyError
			if !errors.As(err, &busy) || busy.RunID != "r1" {
				t.Fatalf("replica %d: %v, want busy with run r1", i+1, err)
			}
		}
		// The same run id on another replica is the same run.
		if ack, err := send(t, rs[2].e, "r1", "/steps shell:2s say:done"); err != nil || ack.Status != gateway.StatusInFlight {
			t.Fatalf("repeat on another replica: %+v %v", ack, err)
		}
		faketime.Advance(3 * time.Second)
		synctest.Wait()
		for i, r := range rs[1:] {
			ev, ok := r.terminal(true, "r1")
			if !ok || ev.Kind != event.Finished || ev.FullText != "done" {
				t.Fatalf("replica %d's watchers: %+v %v", i+1, ev, ok)
			}
		}
		if n := len(rs[0].kinds(false, "r1")); n == 0 || slices.Contains(rs[0].kinds(true, "r1"), event.Finished) {
			t.Fatalf("the owner's own events came back to it: %v", rs[0].kinds(true, "r1"))
		}
		// Free everywhere now.
		if ack, err := send(t, rs[1].e, "r9", "/steps say:next"); err != nil || ack.Status != gateway.StatusStarted {
			t.Fatalf("after the end: %+v %v", ack, err)
		}
	})
}

// Busy mode queue: a message sent to another replica is forwarded to the
// replica that runs the session and queued there: it runs next, once.
func TestClusterForwardedMessageQueuesOnTheOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rs := startCluster(t, 2, nil) // default busy mode: queue
		send(t, rs[0].e, "r1", "/steps shell:2s say:one")
		synctest.Wait()
		ack, err := send(t, rs[1].e, "r2", "/steps say:two")
		if err != nil || ack.Status != gateway.StatusQueued {
			t.Fatalf("forwarded send: %+v %v", ack, err)
		}
		faketime.Advance(3 * time.Second)
		synctest.Wait()
		out, ok := rs[0].e.Wait(context.Background(), "r2")
		if !ok || out.Status != gateway.StatusOK || out.Text != "two" {
			t.Fatalf("queued turn on the owner: %+v %v", out, ok)
		}
		if ev, ok := rs[1].terminal(true, "r2"); !ok || ev.FullText != "two" {
			t.Fatalf("the sender's replica did not see the queued turn end: %+v %v", ev, ok)
		}
	})
}

// TestClusterIgnoresDebounce: busy.debounceMs is ignored in cluster mode
// (`-check` warns of it: config.Warnings) — a message to an idle session
// claims it and starts its turn at once, and /queue shows no debounce —
// since a burst held on one replica could not hold a message another
// replica takes.
func TestClusterIgnoresDebounce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rs := startCluster(t, 2, func(c *config.Config) { c.Agents.Defaults.Busy.DebounceMs = ptr(500) })
		if ack, err := send(t, rs[0].e, "r1", "/steps shell:2s say:one"); err != nil || ack.Status != gateway.StatusStarted {
			t.Fatalf("first send: %+v %v", ack, err)
		}
		synctest.Wait()
		if st, err := rs[1].e.StatusOf(context.Background(), "main"); err != nil || !st.Running || st.Turn.RunID != "r1" {
			t.Fatalf("right after the send, before any debounce: %+v %v; want r1 running", st, err)
		}
		info, err := rs[1].e.QueueInfo(context.Background(), "main", "ws")
		if err != nil || info.Debounce != 0 {
			t.Fatalf("/queue in cluster mode: debounce %v, %v; want none", info.Debounce, err)
		}
	})
}

// An abort sent to a replica that does not run the turn stops it on the
// replica that does; both see the stop.
func TestClusterAbortIsForwardedToTheOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rs := startCluster(t, 2, nil)
		send(t, rs[0].e, "r1", "/steps shell:30s")
		synctest.Wait()
		res, err := rs[1].e.Abort(context.Background(), "main", "", event.ReasonUser, "u1", false)
		if err != nil || !res.Aborted || !slices.Equal(res.RunIDs, []string{"r1"}) {
			t.Fatalf("abort through replica b: %+v %v", res, err)
		}
		synctest.Wait()
		for _, c := range []struct {
			r      *replica
			remote bool
		}{{rs[0], false}, {rs[1], true}} {
			ev, ok := c.r.terminal(c.remote, "r1")
			if !ok || ev.Kind != event.Aborted || ev.StopReason != event.ReasonUser {
				t.Fatalf("ending seen (remote %v): %+v %v", c.remote, ev, ok)
			}
		}
		// Someone else's abort is still refused, through any replica.
		send(t, rs[0].e, "r2", "/steps shell:30s")
		synctest.Wait()
		if _, err := rs[1].e.Abort(context.Background(), "main", "", event.ReasonUser, "intruder", false); !errors.Is(err, gateway.ErrNotOwner) {
			t.Fatalf("abort by another user: %v, want ErrNotOwner", err)
		}
	})
}

// A replica that lost its turns (killed from the cluster's view: a survivor
// took them over) publishes nothing of their endings, and the session is
// free for the others.
func TestClusterTakenOverTurnPublishesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rs := startCluster(t, 2, nil)
		send(t, rs[0].e, "r1", "/steps shell:5s say:late")
		synctest.Wait()
		rs[0].member.Kill() // its lease expired: its turns are taken over
		rs[0].e.Fenced()
		faketime.Advance(6 * time.Second)
		synctest.Wait()
		if ev, ok := rs[0].terminal(false, "r1"); ok {
			t.Fatalf("the stale owner published the ending: %+v", ev)
		}
		if ev, ok := rs[1].terminal(true, "r1"); ok && ev.FullText == "late" {
			t.Fatalf("the stale owner's final reached the other replica: %+v", ev)
		}
		if ack, err := send(t, rs[1].e, "r2", "/steps say:fresh"); err != nil || ack.Status != gateway.StatusStarted {
			t.Fatalf("after the takeover: %+v %v", ack, err)
		}
	})
}

// memQueue is a QueueStore in memory, shared by the test's engines.
type memQueue struct {
	mu   sync.Mutex
	msgs []gateway.QueuedMessage
}

func (q *memQueue) AddQueued(_ context.Context, m gateway.QueuedMessage) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !slices.ContainsFunc(q.msgs, func(x gateway.QueuedMessage) bool { return x.RunID == m.RunID }) {
		q.msgs = append(q.msgs, m)
	}
	return nil
}

func (q *memQueue) RemoveQueued(_ context.Context, ids ...string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.msgs = slices.DeleteFunc(q.msgs, func(m gateway.QueuedMessage) bool { return slices.Contains(ids, m.RunID) })
	return nil
}

func (q *memQueue) Queued(context.Context) ([]gateway.QueuedMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.msgs), nil
}

// queuedBehind starts two replicas sharing a QueueStore (busy mode queue),
// runs r1 (text first) on replica a and sends r2 (text second) through
// replica via, which must answer it queued (on a).
func queuedBehind(t *testing.T, first string, via int, second string) []*replica {
	t.Helper()
	rs := startClusterWith(t, 2, nil, &memQueue{})
	send(t, rs[0].e, "r1", first)
	synctest.Wait()
	if ack, err := send(t, rs[via].e, "r2", second); err != nil || ack.Status != gateway.StatusQueued {
		t.Fatalf("r2 sent through replica %d: %+v %v", via, ack, err)
	}
	return rs
}

// A message queued on a replica that then dies is not lost with its
// memory: the survivor that took the dead replica's turn over runs it
// (RestoreQueuedOf), once.
func TestClusterQueuedMessageOfADeadReplicaRunsOnTheSurvivor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rs := queuedBehind(t, "/steps shell:30s", 1, "/steps say:still_here") // sent through b: forwarded to a
		rs[0].member.Kill()                                                   // its turn r1 is taken over; r2 waited in its memory
		rs[0].e.Fenced()
		synctest.Wait()
		if err := rs[1].e.RestoreQueuedOf(context.Background(), []string{"main"}); err != nil {
			t.Fatal(err)
		}
		out, ok := rs[1].e.Wait(context.Background(), "r2")
		if !ok || out.Status != gateway.StatusOK || out.Text != "still here" {
			t.Fatalf("the queued message on the survivor: %+v %v", out, ok)
		}
		// Restoring again finds nothing to run twice.
		if err := rs[1].e.RestoreQueuedOf(context.Background(), []string{"main"}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if n := len(rs[1].kinds(false, "r2")); n == 0 {
			t.Fatal("no events of r2 on the survivor")
		}
		starts := 0
		for _, k := range rs[1].kinds(false, "r2") {
			if k == event.TurnStarted {
				starts++
			}
		}
		if starts != 1 {
			t.Fatalf("r2 started %d times on the survivor, want 1", starts)
		}
	})
}

// A question asked on one replica is answered through another (the person's
// web chat or Telegram update reached that one): the answer is passed to
// the replica that runs the turn, which goes on; the other replica's
// watchers saw the question and how it was settled. Another chat's answer
// is refused through any replica.
func TestClusterAnswerIsForwardedToTheQuestionsReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rs := startCluster(t, 2, nil)
		send(t, rs[0].e, "r1", "/steps ask:deploy say:Finished")
		synctest.Wait()
		open := rs[0].e.PendingApprovals("main")
		if len(open) != 1 || len(rs[1].e.PendingApprovals("")) != 0 {
			t.Fatalf("open questions: a %+v, b %+v", open, rs[1].e.PendingApprovals(""))
		}
		if _, err := rs[1].e.Resolve(context.Background(), gateway.ResolveRequest{ApprovalID: open[0].ID, OptionID: "allow",
			SessionKey: "other", By: "@mallory"}); !errors.Is(err, gateway.ErrApprovalNotFound) {
			// Routed by the answering chat's session, which runs nothing.
			t.Fatalf("another chat's answer through b: %v, want ErrApprovalNotFound", err)
		}
		// By the button's place (Telegram's callback data), not the option id.
		res, err := rs[1].e.Resolve(context.Background(), gateway.ResolveRequest{ApprovalID: open[0].ID, OptionNumber: 1,
			SessionKey: "main", By: "@alice"})
		if err != nil || res.Approval.By != "@alice" || res.Approval.Outcome != event.ApprovalSelected {
			t.Fatalf("answer through replica b: %+v, %v", res, err)
		}
		synctest.Wait()
		ev, ok := rs[0].terminal(false, "r1")
		if !ok || ev.FullText != "deploy ran (allowed). Finished" {
			t.Fatalf("the turn ended with %+v %v", ev, ok)
		}
		if got := rs[1].kinds(true, "r1"); !slices.Contains(got, event.ApprovalRequested) || !slices.Contains(got, event.ApprovalResolved) {
			t.Fatalf("replica b's watchers saw %v", got)
		}
	})
}

// /stop through a replica that does not run the session's turn stops it
// where it runs, queue included: the message queued behind the turn (sent
// through that same replica, so queued on the owner) never runs. Another
// user's /stop is refused there, changing nothing.
func TestClusterStopDropsTheOwnersQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rs := startCluster(t, 2, nil) // default busy mode: queue
		send(t, rs[0].e, "r1", "/steps shell:30s say:one")
		synctest.Wait()
		if ack, err := send(t, rs[1].e, "r2", "/steps say:two"); err != nil || ack.Status != gateway.StatusQueued {
			t.Fatalf("forwarded send: %+v %v", ack, err)
		}
		if _, err := rs[1].e.Stop(context.Background(), "main", "intruder", false); !errors.Is(err, gateway.ErrNotOwner) {
			t.Fatalf("another user's /stop through b: %v, want ErrNotOwner", err)
		}
		res, err := rs[1].e.Stop(context.Background(), "main", "u1", false)
		if err != nil || !res.Aborted || res.Dropped != 1 || !slices.Equal(res.RunIDs, []string{"r1"}) {
			t.Fatalf("/stop through b: %+v %v; want r1 aborted and r2 dropped", res, err)
		}
		faketime.Advance(time.Minute)
		synctest.Wait()
		if ev, ok := rs[0].terminal(false, "r1"); !ok || ev.Kind != event.Aborted || ev.StopReason != event.ReasonUser {
			t.Fatalf("r1 on the owner: %+v %v", ev, ok)
		}
		if got := rs[0].kinds(false, "r2"); len(got) != 0 {
			t.Fatalf("the dropped message ran on the owner: %v", got)
		}
	})
}

// TestClusterLostTurnIsNotAnsweredAsCompleted (issue 20, defect 6): a
// replica loses its lease while its turn runs (a survivor takes the turn
// over as interrupted) and its runner then finishes: the ending is refused,
// and the replica must not answer from it — neither a re-send of the same
// run id nor Wait may say "ok" for a reply that exists nowhere.
func TestClusterLostTurnIsNotAnsweredAsCompleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rs := startCluster(t, 2, nil)
		if _, err := send(t, rs[0].e, "r1", "/steps shell:5s say:late"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		rs[0].member.Kill() // paused past its lease: taken over; Fenced not yet told
		waited := make(chan bool, 1)
		go func() {
			out, ok := rs[0].e.Wait(context.Background(), "r1")
			waited <- ok && out.Status == gateway.StatusOK
		}()
		faketime.Advance(6 * time.Second) // its runner finishes locally; the ending is refused
		synctest.Wait()
		if <-waited {
			t.Fatal("Wait on the replica that lost the turn answered ok")
		}
		if ack, err := send(t, rs[0].e, "r1", "/steps shell:5s say:late"); err == nil && ack.Status == gateway.StatusOK {
			t.Fatalf("a re-send through the replica that lost the turn answered %+v", ack)
		}
		if ack, err := send(t, rs[1].e, "r1", "/steps shell:5s say:late"); err != nil || ack.Status != gateway.StatusAborted {
			t.Fatalf("a re-send through the survivor answered %+v %v, want aborted (interrupted)", ack, err)
		}
	})
}

// TestClusterFencedReplicaDropsItsQueue (issue 20, defects 3 and 8): replica
// a runs r1 with r2 queued (stored); a loses its lease, b takes r1 over
// and runs r2 from the store. Everything a held under its lease is dropped:
// a neither starts r2 nor tells its user that r2 "could not be started"
// (it ran, on b) — whether a is told of the fence before its runner ends
// or its runner ends first (a SIGSTOPped replica resumed).
func TestClusterFencedReplicaDropsItsQueue(t *testing.T) {
	for _, tc := range []struct {
		name string
		told bool // Fenced is called (else: r1's runner ends first, its ending refused)
	}{{"told of the fence", true}, {"runner ends before the fence is known", false}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rs := queuedBehind(t, "/steps shell:5s", 0, "/steps say:queued")
				rs[0].member.Kill() // its turn r1 is taken over; r2 waits in its memory and the store
				if err := rs[1].e.RestoreQueuedOf(context.Background(), []string{"main"}); err != nil {
					t.Fatal(err)
				}
				out, ok := rs[1].e.Wait(context.Background(), "r2")
				if !ok || out.Status != gateway.StatusOK {
					t.Fatalf("r2 on the survivor: %+v %v", out, ok)
				}
				if tc.told {
					rs[0].e.Fenced()
				}
				faketime.Advance(time.Minute)
				synctest.Wait()
				if k := rs[0].kinds(false, "r2"); len(k) != 0 {
					t.Fatalf("the fenced replica published %v for r2, which ran on the survivor", k)
				}
				if ev, ok := rs[0].terminal(false, "r1"); ok {
					t.Fatalf("the fenced replica published r1's ending: %+v", ev)
				}
			})
		})
	}
}

// TestClusterFailedForwardIsNotBusy (issue 20, defect 11 and the suspected
// "forwarding timeout answered as busy"): a message for a session whose
// turn a replica that does not answer holds is not refused as busy ("send
// /stop…") — its owner may have queued it, and a new message would then run
// twice — but answered as a temporary failure, to retry with the same id.
func TestClusterFailedForwardIsNotBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rs := startCluster(t, 2, nil) // busy mode queue
		send(t, rs[0].e, "r1", "/steps shell:30s")
		synctest.Wait()
		rs[0].member.Serve(nil) // a does not answer (stopped, or its answer lost); its turn is still held
		_, err := send(t, rs[1].e, "r2", "/steps say:hi")
		var unavail *gateway.UnavailableError
		if !errors.As(err, &unavail) || errors.Is(err, gateway.ErrBusy) {
			t.Fatalf("a message forwarded to a replica that does not answer: %v, want *UnavailableError (retry), not busy", err)
		}
	})
}

// fenceOnClaim is an inproc member whose lease is lost right after its
// next claim commits: the claim's answer comes back after Fenced ran.
type fenceOnClaim struct {
	*inproc.Member
	e     *gateway.Engine
	armed bool
}

func (f *fenceOnClaim) Claim(ctx context.Context, c gateway.ClaimRequest) error {
	err := f.Member.Claim(ctx, c)
	if err == nil && f.armed {
		f.armed = false
		f.Member.Kill() // the survivor takes the just-claimed turn over as interrupted
		f.e.Fenced()
	}
	return err
}

// TestClusterClaimCommittedAsTheLeaseIsLostDoesNotRun (issue 20, suspected:
// "a claim that commits just before fencing is missed by Fenced's
// snapshot"): the turn claimed under a lease lost before the claim's
// answer is not started here — it would run unaborted, its reply refused,
// while the survivor says interrupted. Send answers a temporary failure.
func TestClusterClaimCommittedAsTheLeaseIsLostDoesNotRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := config.Default()
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		d := demo.New()
		t.Cleanup(d.Release)
		m := &fenceOnClaim{Member: inproc.NewHub().Join("a"), armed: true}
		e, err := gateway.New(gateway.Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": d}, Cluster: m})
		if err != nil {
			t.Fatal(err)
		}
		m.e = e
		e.Start(t.Context())
		var kinds []event.Kind
		unsub := e.Bus().Subscribe("", func(ev event.Event) { kinds = append(kinds, ev.Kind) })
		t.Cleanup(func() { e.Shutdown(context.Background()); unsub() })
		_, err = send(t, e, "r1", "/steps shell:5s say:lost")
		if !errors.Is(err, gateway.ErrUnavailable) {
			t.Fatalf("Send whose claim committed as the lease was lost: %v, want *UnavailableError", err)
		}
		faketime.Advance(10 * time.Second)
		synctest.Wait()
		if len(kinds) != 0 {
			t.Fatalf("the replica that lost its lease published %v", kinds)
		}
	})
}

// holdClaim is an inproc member that, once armed with a run id, commits
// that run's claim and then holds the answer until released: a claim in
// flight.
type holdClaim struct {
	*inproc.Member
	mu      sync.Mutex
	runID   string
	release chan struct{}
}

func (h *holdClaim) Claim(ctx context.Context, c gateway.ClaimRequest) error {
	err := h.Member.Claim(ctx, c)
	h.mu.Lock()
	hold := c.RunID == h.runID
	h.mu.Unlock()
	if hold {
		<-h.release
	}
	return err
}

// TestClusterQueueWaitsForTheClaimInFlight (issue 20, suspected: "the
// queue pump starts a turn while Send's claim is in flight"): a message
// steered into a turn that was force-finalized is queued when its runner
// finally returns — while a new message's claim is in flight. The pump
// must wait for that claim: starting the queued message then made it lose
// the session's claim to the new one and end in an error ("another message
// started first"), with two turns registered in one session.
func TestClusterQueueWaitsForTheClaimInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := config.Default()
		c.Agents.Defaults.Busy.Mode = config.BusySteer
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		d := demo.New()
		m := &holdClaim{Member: inproc.NewHub().Join("a"), release: make(chan struct{})}
		e, err := gateway.New(gateway.Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": d}, Cluster: m})
		if err != nil {
			t.Fatal(err)
		}
		m.Serve(e)
		e.Start(t.Context())
		t.Cleanup(func() { d.Release(); e.Shutdown(context.Background()) })
		send(t, e, "r1", "/steps shell:stuck")
		synctest.Wait()
		if ack, err := send(t, e, "r2", "/steps say:second"); err != nil || ack.Status != gateway.StatusSteered {
			t.Fatalf("r2: %+v %v, want steered into r1", ack, err)
		}
		if _, err := e.Abort(context.Background(), "main", "r1", event.ReasonUser, "u1", false); err != nil {
			t.Fatal(err)
		}
		faketime.Advance(timeout.DefaultAbortGraceSeconds*time.Second + time.Second) // r1 force-finalized: the session is free
		m.mu.Lock()
		m.runID = "r3"
		m.mu.Unlock()
		sent := make(chan error, 1)
		go func() {
			_, err := send(t, e, "r3", "/steps say:third")
			sent <- err
		}()
		synctest.Wait()                        // r3's claim is committed, its answer held
		faketime.Advance(demo.DefaultStuckFor) // r1's runner returns: r2 is queued
		close(m.release)
		if err := <-sent; err != nil {
			t.Fatalf("r3: %v", err)
		}
		out, ok := e.Wait(context.Background(), "r2")
		if !ok || out.Status != gateway.StatusOK {
			t.Fatalf("r2 (queued behind r3's claim): %+v %v, want it run after r3", out, ok)
		}
	})
}

// One view from every replica (issue 20): a session's running turn, its
// reply so far, its queue and its open question read the same through the
// replica that runs the turn and through one that does not (StatusOf, what
// chat.history's re-attach, approval.list and /status answer from).
func TestClusterStatusReadsTheSameFromEveryReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rs := startClusterWith(t, 2, nil, &memQueue{}) // default busy mode: queue
		send(t, rs[0].e, "r1", "/steps ask:deploy say:Finished")
		synctest.Wait()
		if ack, err := send(t, rs[1].e, "r2", "/steps say:next"); err != nil || ack.Status != gateway.StatusQueued {
			t.Fatalf("r2 through b: %+v %v", ack, err)
		}
		ctx := context.Background()
		owner, err := rs[0].e.StatusOf(ctx, "main")
		if err != nil || !owner.Running || owner.Turn.RunID != "r1" || len(owner.Queue) != 1 || len(owner.Approvals) != 1 {
			t.Fatalf("status on the owner: %+v, %v", owner, err)
		}
		if local := rs[1].e.Status("main"); local.Running || len(local.Queue) != 0 {
			t.Fatalf("replica b runs nothing of the session itself: %+v", local)
		}
		other, err := rs[1].e.StatusOf(ctx, "main")
		if err != nil || !reflect.DeepEqual(other, owner) {
			t.Fatalf("status through replica b: %+v, %v;\nwant the owner's %+v", other, err, owner)
		}
		// A session that runs nowhere reads idle everywhere.
		if st, err := rs[1].e.StatusOf(ctx, "idle"); err != nil || st.Running || len(st.Queue) != 0 {
			t.Fatalf("an idle session through b: %+v, %v", st, err)
		}
	})
}

// stoppedOwner is an inproc member whose ForwardStatus finds the owner
// not answering (SIGSTOPped): it waits until the caller gives up.
type stoppedOwner struct{ *inproc.Member }

func (s stoppedOwner) ForwardStatus(ctx context.Context, replica, key string) (gateway.TurnStatus, error) {
	<-ctx.Done()
	return gateway.TurnStatus{}, fmt.Errorf("replica %s: %w: %w", replica, gateway.ErrClusterUnavailable, ctx.Err())
}

// A replica that cannot ask the owner of a session's running turn answers
// StatusOf as unavailable within statusPatience (3 s), not as idle: an
// empty approval list or "nothing is running" would be a lie.
func TestClusterStatusOfAnOwnerThatDoesNotAnswerIsUnavailable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub := inproc.NewHub()
		var engines []*gateway.Engine
		for _, m := range []gateway.Cluster{hub.Join("a"), stoppedOwner{hub.Join("b")}} {
			d := demo.New()
			t.Cleanup(d.Release)
			e, err := gateway.New(gateway.Options{Config: config.NewSource(config.Default()), Runners: map[string]runner.Runner{"demo": d}, Cluster: m})
			if err != nil {
				t.Fatal(err)
			}
			e.Start(context.Background())
			t.Cleanup(func() { e.Shutdown(context.Background()) })
			engines = append(engines, e)
		}
		send(t, engines[0], "r1", "/steps ask:deploy say:Finished")
		synctest.Wait()
		start := time.Now()
		st, err := engines[1].StatusOf(context.Background(), "main")
		if !errors.As(err, new(*gateway.UnavailableError)) || st.Running {
			t.Fatalf("status through b with the owner stopped: %+v, %v; want *UnavailableError", st, err)
		}
		if waited := time.Since(start); waited != 3*time.Second {
			t.Errorf("waited %v for the owner, want 3s", waited)
		}
	})
}

// TestClusterCancelQueuedThroughAnyReplica (issue 23): a message queued on
// the owner is cancelled through another replica (the Cancel button of a
// chat handled there, chat.abort of its runId): it leaves the owner's
// queue and never runs; CancelQueued of the running turn's id stops
// nothing, through any replica.
func TestClusterCancelQueuedThroughAnyReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rs := queuedBehind(t, "/steps shell:30s say:one", 1, "/steps say:two")
		ctx := context.Background()
		if res, err := rs[1].e.CancelQueued(ctx, "main", "r1", "u1", false); err != nil || res.Aborted {
			t.Fatalf("CancelQueued of the running r1 through b: %+v %v; want nothing stopped", res, err)
		}
		if _, err := rs[1].e.CancelQueued(ctx, "main", "r2", "intruder", false); !errors.Is(err, gateway.ErrNotOwner) {
			t.Fatalf("another user's cancel through b: %v, want ErrNotOwner", err)
		}
		res, err := rs[1].e.CancelQueued(ctx, "main", "r2", "u1", false)
		if err != nil || !res.Aborted || !res.Dequeued || !slices.Equal(res.RunIDs, []string{"r2"}) || res.Text != "/steps say:two" {
			t.Fatalf("CancelQueued of r2 through b: %+v %v", res, err)
		}
		if st := rs[0].e.Status("main"); !st.Running || len(st.Queue) != 0 {
			t.Fatalf("the owner's session after the cancel: %+v; want r1 running, nothing queued", st)
		}
		faketime.Advance(time.Minute)
		synctest.Wait()
		if ev, ok := rs[0].terminal(false, "r1"); !ok || ev.Kind != event.Finished {
			t.Fatalf("r1 on the owner: %+v %v; want finished", ev, ok)
		}
		if got := rs[0].kinds(false, "r2"); len(got) != 0 {
			t.Fatalf("the cancelled message ran on the owner: %v", got)
		}
	})
}
