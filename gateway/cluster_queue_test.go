package gateway_test

import (
	"context"
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
		m := &lossyMember{Member: inproc.NewHub().Join("a")}
		e := clusterEngine(t, clusterConfig(t, config.BusyQueue), m, nil)
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

// TestClusterAmbiguousClaimOfASendIsReadBack: the same for a message that
// starts a turn at once. Send's claim commits with its answer lost; read
// back, the turn starts. Answered "unavailable", the client's retry was
// "in flight" for a run nothing ran, and the session was busy for good.
func TestClusterAmbiguousClaimOfASendIsReadBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &lossyMember{Member: inproc.NewHub().Join("a"), loseClaim: true}
		e := clusterEngine(t, clusterConfig(t, config.BusyQueue), m, nil)
		if ack, err := send(t, e, "r1", "/steps say:hello"); err != nil || ack.Status != gateway.StatusStarted {
			t.Fatalf("r1, its claim's answer lost: %+v %v, want started", ack, err)
		}
		if out, ok := e.Wait(context.Background(), "r1"); !ok || out.Status != gateway.StatusOK || out.Text != "hello" {
			t.Fatalf("r1: %+v %v", out, ok)
		}
		if ack, err := send(t, e, "r2", "/steps say:next"); err != nil || ack.Status != gateway.StatusStarted {
			t.Fatalf("the next message: %+v %v, want started (the session free)", ack, err)
		}
	})
}

// TestClusterStoredQueueMergesIntoAHeldSession: replica a runs r1 with r2
// queued (stored) and loses its lease; before a survivor restores a's
// queue, a new message r3 starts the session on b, and r4 queues behind it
// (busy.maxQueued 1: b's queue is full). The restore merges r2 into b's
// queue ahead of r4 (it was sent first) — restored on b itself, or on c,
// which hands it to b — and no queue bound refuses it (it was accepted
// already). Skipping a session some replica ran (assumed to hold its
// queue), the restore left r2 stored and never run.
func TestClusterStoredQueueMergesIntoAHeldSession(t *testing.T) {
	for _, tc := range []struct {
		name     string
		restorer int
	}{{"restored by the holder", 1}, {"restored by another replica", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rs := startClusterWith(t, 3, func(c *config.Config) { c.Agents.Defaults.Busy.MaxQueued = ptr(1) }, &memQueue{})
				send(t, rs[0].e, "r1", "/steps shell:30s")
				synctest.Wait()
				if ack, err := send(t, rs[0].e, "r2", "/steps say:second"); err != nil || ack.Status != gateway.StatusQueued {
					t.Fatalf("r2: %+v %v, want queued", ack, err)
				}
				rs[0].member.Kill() // r1 is taken over; r2 waits in a's memory and the store
				rs[0].e.Fenced()
				synctest.Wait()
				if ack, err := send(t, rs[1].e, "r3", "/steps shell:5s say:third"); err != nil || ack.Status != gateway.StatusStarted {
					t.Fatalf("r3 through the survivor: %+v %v, want started", ack, err)
				}
				if ack, err := send(t, rs[1].e, "r4", "/steps say:fourth"); err != nil || ack.Status != gateway.StatusQueued {
					t.Fatalf("r4 through the survivor: %+v %v, want queued", ack, err)
				}
				if err := rs[tc.restorer].e.RestoreQueuedOf(context.Background(), []string{"main"}); err != nil {
					t.Fatal(err)
				}
				faketime.Advance(10 * time.Second)
				for _, id := range []string{"r2", "r4"} {
					out, ok := rs[1].e.Wait(context.Background(), id)
					if !ok || out.Status != gateway.StatusOK {
						t.Fatalf("%s on the survivor: %+v %v, want it run", id, out, ok)
					}
				}
				if got, want := startedOn(rs[1]), []string{"r3", "r2", "r4"}; tc.restorer == 1 && !slices.Equal(got, want) {
					t.Fatalf("turns started on the survivor: %v, want %v", got, want)
				}
			})
		})
	}
}

// startedOn returns the run ids of the turns r's bus started, in order.
func startedOn(r *replica) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for _, ev := range r.local {
		if ev.Kind == event.TurnStarted {
			ids = append(ids, ev.RunID)
		}
	}
	return ids
}

// TestClusterQueuedMessageOvertakenIsHandedToTheHolder: replica a's turn
// r1 ends, but the answer to its Finish is lost, so a retries while the
// session is already free in the cluster; a new message r3 starts it on b.
// a's queued r2 then finds the session held by b: it is handed to b, where
// it runs after r3. Ended on a with "another message started first … send
// it again", the user was told to resend a message a survivor's restore
// could run all the same (found by TestLifecycleModelCluster: a queued
// message started twice, once as an error).
func TestClusterQueuedMessageOvertakenIsHandedToTheHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, hub := clusterConfig(t, config.BusyQueue), inproc.NewHub()
		la := &lossyMember{Member: hub.Join("a")}
		a, b := clusterEngine(t, c, la, &memQueue{}), clusterEngine(t, c, hub.Join("b"), &memQueue{})
		send(t, a, "r1", "/steps shell:5s say:first")
		synctest.Wait()
		if ack, err := send(t, a, "r2", "/steps say:second"); err != nil || ack.Status != gateway.StatusQueued {
			t.Fatalf("r2: %+v %v, want queued", ack, err)
		}
		la.mu.Lock()
		la.loseFinish = true
		la.mu.Unlock()
		faketime.Advance(5*time.Second + 50*time.Millisecond) // r1 ends; its Finish committed, the answer lost: a retries 100 ms later
		if ack, err := send(t, b, "r3", "/steps shell:1s say:third"); err != nil || ack.Status != gateway.StatusStarted {
			t.Fatalf("r3 through b while a retries r1's ending: %+v %v, want started", ack, err)
		}
		faketime.Advance(10 * time.Second)
		out, ok := b.Wait(context.Background(), "r2")
		if !ok || out.Status != gateway.StatusOK || out.Text != "second" {
			t.Fatalf("r2 on b: %+v %v, want it run there", out, ok)
		}
		if out, ok := a.Wait(context.Background(), "r2"); ok {
			t.Fatalf("a answers r2 as %+v: it ran on b", out)
		}
	})
}

// TestClusterRestoreOfEveryStoredMessageRunsEachOnce: a takeover restores
// every stored queued message (cmd/gateway; a replica that died between a
// turn's recorded ending and its next queued message's claim ran no turn
// the takeover could name, and its stored queue was left to no one). The
// messages a live replica has queued are among them: each still runs once
// — whether that replica's turn runs (it answers them as queued), or its
// ending is being retried while the session is already free in the
// cluster (the restorer claims the first; the live replica forgets it and
// hands the next over). Before, the live replica ended the next one as
// "another message started first … send it again" while the restorer ran
// it too.
func TestClusterRestoreOfEveryStoredMessageRunsEachOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ending bool // a's Finish of r1 lost its answer: a retries as b restores
	}{{"the owner's turn runs", false}, {"the owner's ending is retried", true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, hub, store := clusterConfig(t, config.BusyQueue), inproc.NewHub(), &memQueue{}
				la := &lossyMember{Member: hub.Join("a")}
				var rs []*replica
				for _, m := range []servedMember{la, hub.Join("b")} {
					r := &replica{e: clusterEngine(t, c, m, store)}
					t.Cleanup(r.e.Bus().Subscribe("", func(ev event.Event) { r.mu.Lock(); r.local = append(r.local, ev); r.mu.Unlock() }))
					rs = append(rs, r)
				}
				send(t, rs[0].e, "r1", "/steps shell:5s say:first")
				synctest.Wait()
				for _, id := range []string{"r2", "r3"} {
					if ack, err := send(t, rs[0].e, id, "/steps shell:1s say:"+id); err != nil || ack.Status != gateway.StatusQueued {
						t.Fatalf("%s: %+v %v, want queued", id, ack, err)
					}
				}
				if tc.ending {
					la.mu.Lock()
					la.loseFinish = true
					la.mu.Unlock()
					faketime.Advance(5*time.Second + 50*time.Millisecond) // r1's Finish committed, its answer lost
				}
				if err := rs[1].e.RestoreQueued(context.Background()); err != nil {
					t.Fatal(err)
				}
				faketime.Advance(time.Minute)
				started := map[string]int{}
				for _, r := range rs {
					for _, id := range startedOn(r) {
						started[id]++
					}
				}
				for _, id := range []string{"r1", "r2", "r3"} {
					if started[id] != 1 {
						t.Errorf("%s started %d times across the replicas, want once (started: %v)", id, started[id], started)
					}
				}
				for _, r := range rs {
					r.mu.Lock()
					for _, ev := range r.local {
						if ev.Kind.Terminal() && ev.StopReason != event.ReasonStop {
							t.Errorf("%s ended %s: %q", ev.RunID, ev.StopReason, ev.Message)
						}
					}
					r.mu.Unlock()
				}
			})
		})
	}
}

// servedMember is an inproc member the test wraps: it serves its engine.
type servedMember interface {
	gateway.Cluster
	Serve(inproc.Handler)
}

// clusterEngine starts an engine on the demo runner as member m (serving
// its requests), with config c and QueueStore q (nil: none), stopped at
// the test's end.
func clusterEngine(t *testing.T, c *config.Config, m servedMember, q gateway.QueueStore) *gateway.Engine {
	t.Helper()
	d := demo.New()
	e, err := gateway.New(gateway.Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": d}, Cluster: m, Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	m.Serve(e)
	e.Start(t.Context())
	t.Cleanup(func() { d.Release(); e.Shutdown(context.Background()) })
	return e
}

// clusterConfig is the default configuration with busy mode mode.
func clusterConfig(t *testing.T, mode string) *config.Config {
	t.Helper()
	c := config.Default()
	c.Agents.Defaults.Busy.Mode = mode
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

// claimsSeen is an inproc member that keeps every claim's request, and
// takes 50 ms to answer: a claim's round trip.
type claimsSeen struct {
	*inproc.Member
	mu     sync.Mutex
	claims map[string]gateway.ClaimRequest
}

func (m *claimsSeen) Claim(ctx context.Context, c gateway.ClaimRequest) error {
	time.Sleep(50 * time.Millisecond) // real time: no — inside the synctest bubble: the claim's round trip on the fake clock
	m.mu.Lock()
	m.claims[c.RunID] = c
	m.mu.Unlock()
	return m.Member.Claim(ctx, c)
}

// TestClusterClaimCarriesTheTurnsLimits (issue 21): a claim carries the
// deadline, ceiling, step timeout and sender its turn's TurnStarted will
// carry — a new message's (whose turn starts before its claim, so the
// claim's round trip counts) and a queued message's — so the claim writes
// them with the turn's row and the store's recorder writes nothing for the
// start.
func TestClusterClaimCarriesTheTurnsLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := clusterConfig(t, config.BusyQueue)
		ceiling := 600.0
		c.Agents.Defaults.MaxTurnTimeSeconds = &ceiling
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		m := &claimsSeen{Member: inproc.NewHub().Join("a"), claims: map[string]gateway.ClaimRequest{}}
		e := clusterEngine(t, c, m, &memQueue{})
		var mu sync.Mutex
		started := map[string]event.Event{}
		unsub := e.Bus().Subscribe("", func(ev event.Event) {
			if ev.Kind == event.TurnStarted {
				mu.Lock()
				started[ev.RunID] = ev
				mu.Unlock()
			}
		})
		defer unsub()
		if ack, err := send(t, e, "r1", "/steps shell:1s say:first"); err != nil || ack.Status != gateway.StatusStarted {
			t.Fatalf("r1: %+v %v, want started", ack, err)
		}
		if ack, err := send(t, e, "r2", "/steps say:second"); err != nil || ack.Status != gateway.StatusQueued {
			t.Fatalf("r2: %+v %v, want queued", ack, err)
		}
		for _, id := range []string{"r1", "r2"} {
			if out, ok := e.Wait(context.Background(), id); !ok || out.Status != gateway.StatusOK {
				t.Fatalf("%s: %+v %v, want it run", id, out, ok)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for _, tc := range []struct{ name, run string }{{"a new message's claim", "r1"}, {"a queued message's claim", "r2"}} {
			cl, ev := m.claims[tc.run], started[tc.run]
			if ev.Deadline.IsZero() || ev.Ceiling.IsZero() || ev.StepTimeout <= 0 || ev.Sender != "u1" {
				t.Errorf("%s: TurnStarted %v %v %v %q: want every limit and the sender", tc.name, ev.Deadline, ev.Ceiling, ev.StepTimeout, ev.Sender)
			}
			if !cl.Deadline.Equal(ev.Deadline) || !cl.Ceiling.Equal(ev.Ceiling) || cl.StepTimeout != ev.StepTimeout || cl.Sender != ev.Sender {
				t.Errorf("%s: claimed with %v %v %v %q; its TurnStarted carries %v %v %v %q", tc.name,
					cl.Deadline, cl.Ceiling, cl.StepTimeout, cl.Sender, ev.Deadline, ev.Ceiling, ev.StepTimeout, ev.Sender)
			}
		}
	})
}
