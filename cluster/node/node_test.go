package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnguard/turnguard/cluster/busauth"
	"github.com/turnguard/turnguard/cluster/clustertest"
	"github.com/turnguard/turnguard/cluster/pgcoord"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/internal/natstest"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/testwait"
	"github.com/turnguard/turnguard/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func notice(t store.Turn) string { return "⚠️ interrupted: " + t.RunID }

func testContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// testSecret is the tests' cluster secret.
var testSecret = []byte("node-tests-cluster-secret-of-32-bytes-at-least")

// key is replica id's signing key under testSecret.
func key(t testing.TB, id string) *busauth.Key {
	t.Helper()
	k, err := busauth.New(testSecret, id)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// replicaUser is replica id's NATS user on a natstest.StartAuth cluster.
func replicaUser(id string) busauth.User { return busauth.ReplicaUser(id, "pw-of-"+id) }

// start makes replica id on the database url and the NATS cluster c; it
// closes at the test's end. On a cluster that authenticates, it connects
// as replicaUser(id).
func start(t testing.TB, dbURL string, c *natstest.Cluster, id string, edit ...func(*Options)) *Node {
	t.Helper()
	o := Options{DatabaseURL: dbURL, NATSURLs: c.URLs(), ReplicaID: id, Auth: key(t, id),
		Lease: 3 * time.Second, Notice: notice, Logger: quiet, OutboxChannels: []string{"telegram"}}
	if c.Admin().Name != "" {
		u := replicaUser(id)
		o.NATS = NATSAuth{User: u.Name, Password: u.Password}
	}
	for _, e := range edit {
		e(&o)
	}
	n, err := Start(testContext(t, 30*time.Second), o)
	if err != nil {
		t.Fatalf("Start %s: %v", id, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			t.Errorf("Close %s: %v", id, err)
		}
	})
	return n
}

// kill stops n as a SIGKILL would: no more lease renewals, nothing
// written, no more NATS traffic.
func kill(n *Node) {
	n.coord.Load().Abandon()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = n.closeExporters(ctx)
	n.nc.Close()
}

// conformance runs the suite with both replicas on the NATS cluster of
// size nodes.
//
// The replicas connect as their own users, with busauth.ReplicaUser's
// rights and no more: what a replica does fits them.
func conformance(t *testing.T, nodes int) {
	var users []busauth.User
	for i := 1; i <= 64; i++ {
		users = append(users, replicaUser(fmt.Sprintf("a%d.example.org", i)), replicaUser(fmt.Sprintf("b%d", i)))
	}
	c := natstest.StartAuth(t, nodes, users)
	var pairs atomic.Int64
	clustertest.Run(t, func(t *testing.T) clustertest.Pair {
		dbURL := pgtest.New(t)
		i := pairs.Add(1)
		a, b := start(t, dbURL, c, fmt.Sprintf("a%d.example.org", i)), start(t, dbURL, c, fmt.Sprintf("b%d", i))
		return clustertest.Pair{A: a, B: b,
			ServeA: func(h clustertest.Handler) { a.Serve(h) },
			ServeB: func(h clustertest.Handler) { b.Serve(h) },
			KillA:  func() { kill(a) }}
	}, clustertest.Options{})
}

// The conformance suite on a real PostgreSQL and real nats-server
// processes: one node, and a three-node JetStream cluster.
func TestConformance(t *testing.T)                 { conformance(t, 1) }
func TestConformanceOnThreeNATSNodes(t *testing.T) { conformance(t, 3) }

// threeReplicas starts replicas a and b on one PostgreSQL and one NATS
// server, and w, whose imports seen records.
func threeReplicas(t *testing.T) (a, b, w *Node, seen *clustertest.Imported) {
	c := natstest.Start(t, 1)
	dbURL := pgtest.New(t)
	a, b, w = start(t, dbURL, c, "a"), start(t, dbURL, c, "b"), start(t, dbURL, c, "w")
	return a, b, w, clustertest.ImportWatching(t, w, a, b)
}

// turnEvents are the kept events of a short turn run in session key.
func turnEvents(key, run string) []event.Event {
	return []event.Event{
		{Kind: event.TurnStarted, RunID: run, SessionKey: key, Seq: 1},
		{Kind: event.StepCompleted, RunID: run, SessionKey: key, Seq: 2},
		{Kind: event.Finished, RunID: run, SessionKey: key, Seq: 3, StopReason: event.ReasonStop, FullText: "done"},
	}
}

// A session whose turns run on a, then b, then a again is seen by a third
// replica in order and without a gap: each replica's exporter continues
// after the other's events when it claims the session again.
func TestSessionMovingBetweenReplicasStaysInOrder(t *testing.T) {
	a, b, _, seen := threeReplicas(t)
	ctx := testContext(t, 30*time.Second)
	const key = "ws:moving"
	var want []string
	for i, owner := range []*Node{a, b, a, b} {
		run := fmt.Sprintf("run-%d", i)
		if err := owner.Claim(ctx, gateway.ClaimRequest{RunID: run, SessionKey: key, Channel: "ws", Text: "hi"}); err != nil {
			t.Fatalf("claim %s on %s: %v", run, owner.Replica(), err)
		}
		evs := turnEvents(key, run)
		for _, ev := range evs[:2] {
			owner.Export(ev)
		}
		if err := owner.Finish(ctx, evs[2]); err != nil {
			t.Fatalf("finish %s: %v", run, err)
		}
		owner.Export(evs[2])
		for _, ev := range evs {
			want = append(want, fmt.Sprintf("%s %s %d", ev.Kind, run, ev.Seq))
		}
		// The session moves on at once, its last event maybe still on its
		// way: the next owner's claim waits for it (Exporter.AwaitEnded).
	}
	testwait.Until(t, 15*time.Second, "the third replica imports every turn", func() bool { return len(seen.Snapshot()) >= len(want) })
	if got := seen.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Fatalf("imported %q\nwant %q", got, want)
	}
}

// TestClaimWaitsForThePreviousOwnersLastEvent (issue 20: the exporter
// numbering race): a's turn ends — recorded first, so the session is free
// — and b claims the session before a exports the turn's Finished. b's
// claim waits until that event is in the stream; b's turn then continues
// after it, and a third replica imports both turns whole and in order.
// Renewed before it landed, b numbered its first event over a's Finished,
// and the watcher dropped one of the two.
func TestClaimWaitsForThePreviousOwnersLastEvent(t *testing.T) {
	a, b, w, seen := threeReplicas(t)
	ctx := testContext(t, 30*time.Second)
	const key = "ws:late-end"
	first, second := turnEvents(key, "run-a"), turnEvents(key, "run-b")
	if err := a.Claim(ctx, gateway.ClaimRequest{RunID: "run-a", SessionKey: key, Channel: "ws", Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	a.Export(first[0])
	a.Export(first[1])
	if err := a.Finish(ctx, first[2]); err != nil {
		t.Fatal(err)
	}
	claimed := make(chan error, 1)
	go func() {
		claimed <- b.Claim(ctx, gateway.ClaimRequest{RunID: "run-b", SessionKey: key, Channel: "ws", Text: "next"})
	}()
	testwait.Until(t, 10*time.Second, "b's claim commits", func() bool {
		run, _, ok, _ := w.Holder(ctx, key)
		return ok && run == "run-b"
	})
	a.Export(first[2]) // a's Finished, exported after b claimed the session
	if err := <-claimed; err != nil {
		t.Fatalf("b's claim: %v", err)
	}
	for _, ev := range second {
		b.Export(ev)
	}
	var want []string
	for _, ev := range append(first, second...) {
		want = append(want, fmt.Sprintf("%s %s %d", ev.Kind, ev.RunID, ev.Seq))
	}
	testwait.Until(t, 15*time.Second, "the third replica imports both turns", func() bool { return len(seen.Snapshot()) >= len(want) })
	if got := seen.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Fatalf("imported %q\nwant %q", got, want)
	}
}

// Start with a wrong password fails, and its error does not show the
// password it was given.
func TestStartErrorHidesThePassword(t *testing.T) {
	c := natstest.Start(t, 1)
	u, err := url.Parse(pgtest.New(t))
	if err != nil {
		t.Fatal(err)
	}
	const wrong = "not-the-password-7f3a"
	u.User = url.UserPassword(u.User.Username(), wrong)
	_, err = Start(testContext(t, 30*time.Second), Options{DatabaseURL: u.String(), NATSURLs: c.URLs(), ReplicaID: "a",
		Auth: key(t, "a"), Lease: time.Second, Notice: notice, Logger: quiet})
	if err == nil {
		t.Fatal("Start with a wrong password succeeded")
	}
	if strings.Contains(err.Error(), wrong) || strings.Contains(err.Error(), pgtest.Password()) {
		t.Errorf("the error shows a password: %v", err)
	}
}

// Two replicas Lead one duty: one runs it at a time; when the leader's
// Lead ends, the other takes over, without the two ever overlapping.
func TestLeadOneAtATime(t *testing.T) {
	c := natstest.Start(t, 1)
	dbURL := pgtest.New(t)
	nodes := []*Node{start(t, dbURL, c, "a"), start(t, dbURL, c, "b")}
	var running, overlaps atomic.Int32
	var mu sync.Mutex
	var leaders []string
	cancels := map[string]context.CancelFunc{}
	var wg sync.WaitGroup
	for _, n := range nodes {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[n.Replica()] = cancel
		wg.Go(func() {
			err := n.Lead(ctx, "poller", time.Second, func(ctx context.Context) {
				if running.Add(1) > 1 {
					overlaps.Add(1)
				}
				mu.Lock()
				leaders = append(leaders, n.Replica())
				mu.Unlock()
				<-ctx.Done()
				running.Add(-1)
			})
			if err != nil {
				t.Errorf("Lead on %s: %v", n.Replica(), err)
			}
		})
	}
	t.Cleanup(func() {
		for _, cancel := range cancels {
			cancel()
		}
		wg.Wait()
	})
	leader := func(n int) string {
		mu.Lock()
		defer mu.Unlock()
		if len(leaders) < n {
			return ""
		}
		return leaders[n-1]
	}
	testwait.Until(t, 10*time.Second, "a first leader", func() bool { return leader(1) != "" })
	first := leader(1)
	cancels[first]()
	testwait.Until(t, 10*time.Second, "a second leader", func() bool { return leader(2) != "" })
	if second := leader(2); second == first {
		t.Errorf("the leader after %s's Lead ended is %s again", first, second)
	}
	if overlaps.Load() != 0 {
		t.Errorf("%d times two replicas ran the duty at once", overlaps.Load())
	}
}

// A replica dies mid-turn: whichever survivor takes the turn over, both
// survivors' Imports deliver its interrupted end with the notice, and a
// turn the survivor starts in the session from OnTakeover (as the engine
// runs the queued messages) follows it in order, with no gap.
func TestTakeoverEndIsSeenEverywhereBeforeTheNextTurn(t *testing.T) {
	c := natstest.Start(t, 1)
	dbURL := pgtest.New(t)
	ctx := testContext(t, 30*time.Second)
	const key = "ws:taken"
	var survivors sync.Map // replica id → *Node
	var tookOver atomic.Int32
	var survivorID atomic.Value // set once OnTakeover has started the next turn
	next := func(id string) func(*Options) {
		return func(o *Options) {
			o.OnTakeover = func(tk pgcoord.Takeover) {
				tookOver.Add(1)
				defer survivorID.Store(id)
				v, _ := survivors.Load(id)
				n := v.(*Node)
				if err := n.Claim(ctx, gateway.ClaimRequest{RunID: "run-2", SessionKey: key, Channel: "ws", Text: "queued"}); err != nil {
					t.Errorf("claim the queued turn on %s: %v", id, err)
					return
				}
				n.Export(event.Event{Kind: event.TurnStarted, RunID: "run-2", SessionKey: key, Seq: 1})
			}
		}
	}
	a := start(t, dbURL, c, "a")
	b, d := start(t, dbURL, c, "b", next("b")), start(t, dbURL, c, "d", next("d"))
	survivors.Store("b", b)
	survivors.Store("d", d)
	fromB, fromD := clustertest.ImportWatching(t, b, a, d), clustertest.ImportWatching(t, d, a, b)
	if err := a.Claim(ctx, gateway.ClaimRequest{RunID: "run-1", SessionKey: key, Channel: "ws", Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	a.Export(event.Event{Kind: event.TurnStarted, RunID: "run-1", SessionKey: key, Seq: 1})
	testwait.Until(t, 10*time.Second, "both survivors see run-1 start", func() bool {
		return len(fromB.Snapshot()) == 1 && len(fromD.Snapshot()) == 1
	})
	kill(a)
	testwait.Until(t, 15*time.Second, "a survivor took run-1 over", func() bool { return survivorID.Load() != nil })
	if n := tookOver.Load(); n != 1 {
		t.Fatalf("%d takeovers; want 1", n)
	}
	survivor, other, fromOther := b, d, fromD
	if survivorID.Load() == "d" {
		survivor, other, fromOther = d, b, fromB
	}
	want := []string{fmt.Sprintf("%s run-1 1", event.TurnStarted), fmt.Sprintf("%s run-1 0", event.Aborted),
		fmt.Sprintf("%s run-2 1", event.TurnStarted)}
	testwait.NoError(t, 10*time.Second, func() error {
		if got := fromOther.Snapshot(); len(got) < 3 {
			return fmt.Errorf("the other survivor imported only %q", got)
		}
		return nil
	})

	if got := fromOther.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Errorf("%s (not the survivor) imported %q; want %q", other.Replica(), got, want)
	}
	fromSurvivor := fromB
	if survivor == d {
		fromSurvivor = fromD
	}
	testwait.Until(t, 10*time.Second, "the survivor sees the end", func() bool { return len(fromSurvivor.Snapshot()) >= 2 })
	if got := fromSurvivor.Snapshot(); !reflect.DeepEqual(got, want[:2]) {
		t.Errorf("%s (the survivor) imported %q; want %q (its own next turn is not imported)", survivor.Replica(), got, want[:2])
	}
	for _, imp := range []*clustertest.Imported{fromB, fromD} {
		if evs := imp.Events(); len(evs) < 2 || evs[1].Message != "⚠️ interrupted: run-1" || evs[1].StopReason != event.ReasonInterrupted {
			t.Errorf("the end of run-1 as imported: %+v; want interrupted, with the notice", evs)
		}
	}
}

// A replica whose lease the database no longer holds is fenced: it is
// told (OnFenced), its claims are refused as unavailable, its Finish as
// not the owner, and what it exports reaches no other replica; the
// survivor ends its turn.
func TestFencedReplicaClaimsFinishesAndExportsNothing(t *testing.T) {
	c := natstest.Start(t, 1)
	dbURL := pgtest.New(t)
	ctx := testContext(t, 30*time.Second)
	fenced := make(chan error, 1)
	a := start(t, dbURL, c, "a", func(o *Options) {
		o.OnFenced = func(err error) { fenced <- err }
		o.RejoinAfter = -1 // stays fenced
	})
	b := start(t, dbURL, c, "b")
	fromB := clustertest.Import(t, b)
	if err := a.Claim(ctx, gateway.ClaimRequest{RunID: "run-1", SessionKey: "ws:f", Channel: "ws"}); err != nil {
		t.Fatal(err)
	}
	expireLease(t, dbURL, a)
	select {
	case err := <-fenced:
		if !errors.Is(err, pgcoord.ErrFenced) {
			t.Errorf("OnFenced(%v); want ErrFenced", err)
		}
	case <-ctx.Done():
		t.Fatal("not fenced within 30 s of its lease's expiry")
	}
	if err := a.Claim(ctx, gateway.ClaimRequest{RunID: "run-2", SessionKey: "ws:g"}); !errors.Is(err, gateway.ErrClusterUnavailable) ||
		!errors.Is(err, gateway.ErrLeaseLost) {
		t.Errorf("a fenced replica's Claim: %v; want ErrClusterUnavailable and ErrLeaseLost", err)
	}
	if err := a.Finish(ctx, event.Event{Kind: event.Finished, RunID: "run-1", StopReason: event.ReasonStop}); !errors.Is(err, gateway.ErrNotTurnOwner) {
		t.Errorf("a fenced replica's Finish: %v; want ErrNotTurnOwner", err)
	}
	a.Export(event.Event{Kind: event.Finished, RunID: "run-1", SessionKey: "ws:f", Seq: 9})
	testwait.Until(t, 15*time.Second, "b imports run-1's interrupted end", func() bool { return len(fromB.Snapshot()) >= 1 })
	if got, want := fromB.Snapshot(), []string{fmt.Sprintf("%s run-1 0", event.Aborted)}; !reflect.DeepEqual(got, want) {
		t.Errorf("b imported %q; want only the survivor's %q", got, want)
	}
}

// expireLease ends n's lease now on the database's clock, as if it had not
// renewed in time.
func expireLease(t testing.TB, dbURL string, n *Node) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `UPDATE leases SET expires_at = now() WHERE epoch = $1`, n.coord.Load().Epoch()); err != nil {
		t.Fatal(err)
	}
}

// Close leaves at once: the replica's unfinished turn is ended (the other
// replicas see its interrupted end), its session is free for another
// replica without waiting for the lease, and a forward to it is
// unavailable.
func TestCloseLeavesAtOnce(t *testing.T) {
	c := natstest.Start(t, 1)
	dbURL := pgtest.New(t)
	ctx := testContext(t, 30*time.Second)
	a, b := start(t, dbURL, c, "a"), start(t, dbURL, c, "b")
	fromB := clustertest.Import(t, b)
	a.Serve(&echo{})
	if err := a.Claim(ctx, gateway.ClaimRequest{RunID: "run-1", SessionKey: "ws:c", Channel: "ws"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Forward(ctx, "a", gateway.SendRequest{SessionKey: "ws:c", RunID: "run-2"}); err != nil {
		t.Fatalf("forward to a serving replica: %v", err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := b.Holder(ctx, "ws:c"); err != nil || ok {
		t.Errorf("Holder right after a closed: ok %v, %v; want the session free", ok, err)
	}
	testwait.Until(t, 10*time.Second, "b imports run-1's end", func() bool { return len(fromB.Snapshot()) >= 1 })
	if evs := fromB.Events(); evs[0].Kind != event.Aborted || evs[0].RunID != "run-1" || evs[0].StopReason != event.ReasonInterrupted {
		t.Errorf("b imported %+v; want run-1's interrupted end", evs)
	}
	if err := b.Claim(ctx, gateway.ClaimRequest{RunID: "run-3", SessionKey: "ws:c", Channel: "ws"}); err != nil {
		t.Errorf("claim on b right after a closed: %v", err)
	}
	if _, err := b.Forward(ctx, "a", gateway.SendRequest{SessionKey: "ws:c", RunID: "run-4"}); !errors.Is(err, gateway.ErrClusterUnavailable) {
		t.Errorf("forward to a closed replica: %v; want ErrClusterUnavailable", err)
	}
	if err := a.Close(ctx); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

// echo is an engine that starts every message.
type echo struct{}

func (echo) Send(_ context.Context, req gateway.SendRequest) (gateway.Ack, error) {
	return gateway.Ack{RunID: req.RunID, Status: gateway.StatusStarted}, nil
}

func (echo) Abort(context.Context, string, string, event.StopReason, string, bool) (gateway.AbortResult, error) {
	return gateway.AbortResult{}, nil
}

func (echo) Resolve(context.Context, gateway.ResolveRequest) (gateway.ResolveResult, error) {
	return gateway.ResolveResult{}, gateway.ErrApprovalNotFound
}

func (echo) StopWith(context.Context, gateway.StopRequest) (gateway.StopResult, error) {
	return gateway.StopResult{}, nil
}

func (echo) Status(key string) gateway.TurnStatus { return gateway.TurnStatus{SessionKey: key} }

// A leader whose lease key is taken from it (here: deleted) sees fn's ctx
// end, and leads again once it wins the lease back.
func TestLeadEndsFnWhenTheLeaseIsLost(t *testing.T) {
	c := natstest.Start(t, 1)
	a := start(t, pgtest.New(t), c, "a")
	ctx, cancel := context.WithCancel(context.Background())
	terms := make(chan context.Context, 4)
	done := make(chan error, 1)
	go func() {
		done <- a.Lead(ctx, "duty", time.Second, func(ctx context.Context) {
			terms <- ctx
			<-ctx.Done()
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Lead: %v", err)
		}
	})
	wait := testContext(t, 15*time.Second)
	var first context.Context
	select {
	case first = <-terms:
	case <-wait.Done():
		t.Fatal("not leading within 15 s")
	}
	js, err := jetstream.New(c.Connect(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(wait, "TG_LEASE_duty")
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(wait, "duty"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.Done():
	case <-wait.Done():
		t.Fatal("fn's ctx did not end after the lease was lost")
	}
	select {
	case <-terms:
	case <-wait.Done():
		t.Fatal("not leading again")
	}
}

// A fenced replica joins again as a new epoch (RejoinAfter): the turn it
// ran before the fence stays ended (its late Finish is refused), and it
// claims and exports again.
func TestFencedReplicaJoinsAgain(t *testing.T) {
	c := natstest.Start(t, 1)
	dbURL := pgtest.New(t)
	ctx := testContext(t, 30*time.Second)
	var fences atomic.Int32
	a := start(t, dbURL, c, "a", func(o *Options) {
		o.OnFenced = func(error) { fences.Add(1) }
		o.RejoinAfter = 50 * time.Millisecond
	})
	b := start(t, dbURL, c, "b")
	fromB := clustertest.ImportWatching(t, b, a)
	if err := a.Claim(ctx, gateway.ClaimRequest{RunID: "run-1", SessionKey: "ws:r", Channel: "ws"}); err != nil {
		t.Fatal(err)
	}
	epoch := a.Coordinator().Epoch()
	expireLease(t, dbURL, a)
	testwait.Until(t, 15*time.Second, "a joined again as a new epoch", func() bool {
		return fences.Load() == 1 && a.Coordinator().Epoch() != epoch && a.Coordinator().Err() == nil
	})
	if err := a.Finish(ctx, event.Event{Kind: event.Finished, RunID: "run-1", StopReason: event.ReasonStop}); !errors.Is(err, gateway.ErrNotTurnOwner) {
		t.Errorf("Finish of the turn claimed before the fence: %v; want ErrNotTurnOwner", err)
	}
	testwait.NoError(t, 15*time.Second, func() error { // real time: the fenced epoch's turn is ended by a survey
		return a.Claim(ctx, gateway.ClaimRequest{RunID: "run-2", SessionKey: "ws:r", Channel: "ws"})
	})
	a.Export(event.Event{Kind: event.TurnStarted, RunID: "run-2", SessionKey: "ws:r", Seq: 1})
	testwait.Until(t, 10*time.Second, "b imports run-2's start", func() bool {
		for _, g := range fromB.Snapshot() {
			if g == fmt.Sprintf("%s run-2 1", event.TurnStarted) {
				return true
			}
		}
		return false
	})
}

// A takeover of more turns than the takeover exporter's buffer holds
// (4096 places, two per end) reaches every watcher whole: every end, no
// gap — it is exported in chunks, each stored before the next.
func TestLargeTakeoverReachesWatchersWhole(t *testing.T) {
	c := natstest.Start(t, 1)
	dbURL := pgtest.New(t)
	ctx := testContext(t, 60*time.Second)
	const turns = 3000 // 6,000 places
	a := start(t, dbURL, c, "a")
	b := start(t, dbURL, c, "b")
	seen := clustertest.Import(t, b)
	for i := range turns {
		if err := a.Claim(ctx, gateway.ClaimRequest{RunID: fmt.Sprint("run-", i), SessionKey: fmt.Sprint("ws:big-", i),
			Channel: "ws", Text: "hi"}); err != nil {
			t.Fatal(err)
		}
	}
	kill(a)
	testwait.Until(t, 40*time.Second, "every taken-over end imported", func() bool {
		n := 0
		for _, ev := range seen.Events() {
			if ev.Kind == event.Aborted && ev.StopReason == event.ReasonInterrupted {
				n++
			}
		}
		return n == turns
	})
	for _, s := range seen.Snapshot() {
		if strings.HasPrefix(s, "gap ") {
			t.Fatalf("a watcher saw a gap: %s", s)
		}
	}
}

// lockedBuffer is a log sink safe for the node's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A clean shutdown warns of nothing (issue 22: a SIGTERM logged "WARN
// cluster: NATS disconnected error=<nil>"). Close returns after the
// connection's last callbacks, so the log is complete when it is read.
func TestCleanCloseLogsNoDisconnect(t *testing.T) {
	c := natstest.Start(t, 1)
	dbURL := pgtest.New(t)
	var logs lockedBuffer
	n := start(t, dbURL, c, "a", func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	if err := n.Close(testContext(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := logs.String(); strings.Contains(s, "NATS disconnected") || strings.Contains(s, "level=WARN") {
		t.Fatalf("a clean close logged a warning:\n%s", s)
	}
}
