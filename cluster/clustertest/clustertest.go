// Package clustertest owns the conformance suite of gateway.Cluster: what
// the engine and the channels may rely on from any implementation —
// cluster/inproc (in one process) and cluster/node (PostgreSQL and NATS) —
// asserted as a caller sees it: one winner per session, the holder's run id
// to every loser, idempotent run ids, ends only by the owner, forwarded
// requests that reach the other replica's engine with their errors' types
// and words intact, and events that cross to the other replica in order
// and never come back to their own.
package clustertest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/internal/faketime"
	"github.com/turnguard/turnguard/internal/testwait"
)

// Handler is a replica's local engine as the forwarded requests reach it
// (*gateway.Engine satisfies it; so do node.Handler and inproc.Handler).
type Handler interface {
	Send(ctx context.Context, req gateway.SendRequest) (gateway.Ack, error)
	Abort(ctx context.Context, sessionKey, runID string, reason event.StopReason, requester string, operator bool) (gateway.AbortResult, error)
	Resolve(ctx context.Context, req gateway.ResolveRequest) (gateway.ResolveResult, error)
	StopWith(ctx context.Context, req gateway.StopRequest) (gateway.StopResult, error)
	Status(sessionKey string) gateway.TurnStatus
}

// Pair is two replicas of one fresh cluster.
type Pair struct {
	A, B gateway.Cluster
	// ServeA and ServeB make h the engine the other replica's Forward and
	// ForwardAbort reach.
	ServeA, ServeB func(h Handler)
	// KillA, when set, makes A die as a SIGKILLed replica does (no clean
	// leave): the takeover case runs only with it.
	KillA func()
}

// Options say how the suite runs.
type Options struct {
	// Bubble runs each case (newPair included) inside a testing/synctest
	// bubble, for an implementation with no real network: asynchronous
	// deliveries are awaited with synctest.Wait, and every goroutine the
	// implementation started must have ended with the case.
	Bubble bool
	// Within bounds each wait for an asynchronous delivery outside a
	// bubble (real servers); 0 means 15 s.
	Within time.Duration
}

// Run runs every case against pairs from newPair, one pair per case.
func Run(t *testing.T, newPair func(t *testing.T) Pair, opt Options) {
	if opt.Within <= 0 {
		opt.Within = 15 * time.Second
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := func(t *testing.T) {
				s := &suite{t: t, opt: opt, key: "suite:" + strings.ReplaceAll(t.Name(), "/", ":")}
				c.run(s, newPair(t))
			}
			if opt.Bubble {
				synctest.Test(t, body)
				return
			}
			body(t)
		})
	}
}

var cases = []struct {
	name string
	run  func(*suite, Pair)
}{
	{"ClaimHeldAndRunExists", claimHeldAndRunExists},
	{"FinishByOwnerFreesTheSession", finishByOwnerFreesTheSession},
	{"FinishByOthersIsNotTurnOwner", finishByOthersIsNotTurnOwner},
	{"Holder", holder},
	{"ForwardReachesTheOtherEngine", forwardReachesTheOtherEngine},
	{"ForwardedErrorsKeepTypeAndWords", forwardedErrorsKeepTypeAndWords},
	{"ForwardsAreAnsweredConcurrently", forwardsAreAnsweredConcurrently},
	{"ForwardAbort", forwardAbort},
	{"ForwardResolve", forwardResolve},
	{"ForwardStop", forwardStop},
	{"ForwardStatus", forwardStatus},
	{"ForwardToAReplicaThatIsNotThere", forwardToAReplicaThatIsNotThere},
	{"ExportReachesOnlyTheOthers", exportReachesOnlyTheOthers},
	{"ConcurrentClaimsHaveOneWinner", concurrentClaimsHaveOneWinner},
	{"KilledReplicasTurnsAreTakenOver", killedReplicasTurnsAreTakenOver},
}

type suite struct {
	t   *testing.T
	opt Options
	key string // a session key of this case's own
}

func (s *suite) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.opt.Within)
	s.t.Cleanup(cancel)
	return ctx
}

// until waits for cond: in a bubble until every goroutine is blocked, else
// by polling the real clock.
func (s *suite) until(what string, cond func() bool) {
	s.t.Helper()
	if faketime.InBubble() {
		synctest.Wait()
		if !cond() {
			s.t.Fatalf("not once the bubble settled: %s", what)
		}
		return
	}
	testwait.Until(s.t, s.opt.Within, what, cond) // real time: deliveries through real servers
}

func (s *suite) claim(c gateway.Cluster, runID string) error {
	return c.Claim(s.ctx(), gateway.ClaimRequest{RunID: runID, SessionKey: s.key, Channel: "ws", Text: "message of " + runID})
}

func (s *suite) mustClaim(c gateway.Cluster, runID string) {
	s.t.Helper()
	if err := s.claim(c, runID); err != nil {
		s.t.Fatalf("claim %s on %s: %v", runID, c.Replica(), err)
	}
}

func finished(runID, text string) event.Event {
	return event.Event{Kind: event.Finished, RunID: runID, StopReason: event.ReasonStop, FullText: text, Time: time.Now()}
}

func claimHeldAndRunExists(s *suite, p Pair) {
	t := s.t
	s.mustClaim(p.A, "run-1")
	for _, c := range []gateway.Cluster{p.B, p.A} {
		he, ok := errors.AsType[*gateway.HeldError](s.claim(c, "run-2"))
		if !ok || he.RunID != "run-1" || he.Replica != p.A.Replica() || he.SessionKey != s.key {
			t.Errorf("a second run of the session on %s: %v; want *HeldError by run-1 on %s", c.Replica(), he, p.A.Replica())
		}
	}
	re, ok := errors.AsType[*gateway.RunExistsError](s.claim(p.B, "run-1"))
	if !ok || !re.Running || re.Replica != p.A.Replica() || re.RunID != "run-1" || re.StopReason != "" {
		t.Fatalf("the same run id on %s: %v; want *RunExistsError running on %s", p.B.Replica(), re, p.A.Replica())
	}
	if err := p.A.Finish(s.ctx(), finished("run-1", "done")); err != nil {
		t.Fatal(err)
	}
	re, ok = errors.AsType[*gateway.RunExistsError](s.claim(p.B, "run-1"))
	if !ok || re.Running || re.StopReason != event.ReasonStop {
		t.Errorf("the ended run id again: %v; want *RunExistsError ended (stop)", re)
	}
}

func finishByOwnerFreesTheSession(s *suite, p Pair) {
	s.mustClaim(p.A, "run-1")
	if err := p.A.Finish(s.ctx(), finished("run-1", "done")); err != nil {
		s.t.Fatalf("Finish by the owner: %v", err)
	}
	s.mustClaim(p.B, "run-2")
	if he, ok := errors.AsType[*gateway.HeldError](s.claim(p.A, "run-3")); !ok || he.RunID != "run-2" || he.Replica != p.B.Replica() {
		s.t.Errorf("the session after B claimed it: %v; want *HeldError by run-2 on %s", he, p.B.Replica())
	}
}

func finishByOthersIsNotTurnOwner(s *suite, p Pair) {
	t := s.t
	s.mustClaim(p.A, "run-1")
	if err := p.B.Finish(s.ctx(), finished("run-1", "not mine")); !errors.Is(err, gateway.ErrNotTurnOwner) {
		t.Errorf("Finish by the replica that does not own the turn: %v; want ErrNotTurnOwner", err)
	}
	if err := p.B.Finish(s.ctx(), finished("run-unknown", "?")); !errors.Is(err, gateway.ErrNotTurnOwner) {
		t.Errorf("Finish of a run never claimed: %v; want ErrNotTurnOwner", err)
	}
	if he, ok := errors.AsType[*gateway.HeldError](s.claim(p.B, "run-2")); !ok || he.RunID != "run-1" {
		t.Errorf("the session after a refused Finish: %v; want still held by run-1", he)
	}
	if err := p.A.Finish(s.ctx(), finished("run-1", "done")); err != nil {
		t.Fatalf("Finish by the owner: %v", err)
	}
	// The same ending again is the retry of an attempt whose answer was
	// lost (it committed): done, not refused — or the engine would never
	// publish an ending it recorded. Another ending is refused.
	if err := p.A.Finish(s.ctx(), finished("run-1", "done")); err != nil {
		t.Errorf("the same Finish again (a retry after a lost answer): %v; want nil", err)
	}
	other := event.Event{Kind: event.Aborted, RunID: "run-1", StopReason: event.ReasonUser, Time: time.Now()}
	if err := p.A.Finish(s.ctx(), other); !errors.Is(err, gateway.ErrNotTurnOwner) {
		t.Errorf("a different ending after the first: %v; want ErrNotTurnOwner", err)
	}
}

func holder(s *suite, p Pair) {
	t := s.t
	if _, _, ok, err := p.B.Holder(s.ctx(), s.key); err != nil || ok {
		t.Fatalf("Holder of a free session: ok %v, %v", ok, err)
	}
	s.mustClaim(p.A, "run-1")
	for _, c := range []gateway.Cluster{p.A, p.B} {
		run, rep, ok, err := c.Holder(s.ctx(), s.key)
		if err != nil || !ok || run != "run-1" || rep != p.A.Replica() {
			t.Errorf("Holder seen from %s: %q on %q (ok %v, %v); want run-1 on %s", c.Replica(), run, rep, ok, err, p.A.Replica())
		}
	}
	if err := p.A.Finish(s.ctx(), finished("run-1", "done")); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := p.B.Holder(s.ctx(), s.key); err != nil || ok {
		t.Errorf("Holder after Finish: ok %v, %v; want free", ok, err)
	}
}

// Imported records what an Import handler received: "<kind> <run> <seq>"
// for each event, "gap <session>" for each gap.
type Imported struct {
	mu     sync.Mutex
	got    []string
	events []event.Event
}

// Event is the Import handler.
func (l *Imported) Event(ev event.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, fmt.Sprintf("%s %s %d", ev.Kind, ev.RunID, ev.Seq))
	l.events = append(l.events, ev)
}

// Events are the events received so far, gaps left out.
func (l *Imported) Events() []event.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]event.Event(nil), l.events...)
}

// Gap is the Import gap callback.
func (l *Imported) Gap(sessionKey string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, "gap "+sessionKey)
}

// Snapshot is what was received so far.
func (l *Imported) Snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}

// Import records what c imports until the test's end.
func Import(t testing.TB, c gateway.Cluster) *Imported {
	l := &Imported{}
	t.Cleanup(c.Import(l.Event, l.Gap))
	return l
}

// ImportWatching is Import by a replica that shows every session (as a
// connection following all of them does: gateway.Watches.WatchingAll),
// returned once each of from knows it, when they tell (a cluster that
// publishes a turn's live events only to the replicas that watch it:
// cluster/node). Without Watches every event reaches every replica anyway.
func ImportWatching(t testing.TB, c gateway.Cluster, from ...gateway.Cluster) *Imported {
	t.Helper()
	l := Import(t, c)
	w, ok := c.(gateway.Watches)
	if !ok {
		return l
	}
	w.WatchingAll(true)
	t.Cleanup(func() { w.WatchingAll(false) })
	for _, f := range from {
		if k, ok := f.(interface{ WatchedElsewhere(string) bool }); ok {
			testwait.Until(t, 15*time.Second, f.Replica()+" knows that "+c.Replica()+" watches", func() bool { return k.WatchedElsewhere("any") })
		}
	}
	return l
}

func turnEvents(runID, sessionKey string, n int) []event.Event {
	var out []event.Event
	for i := 1; i <= n; i++ {
		k := event.StepCompleted
		switch i {
		case 1:
			k = event.TurnStarted
		case n:
			k = event.Finished
		}
		out = append(out, event.Event{Kind: k, RunID: runID, SessionKey: sessionKey, Channel: "ws", Seq: uint64(i),
			Text: fmt.Sprint(i), Time: time.Now()})
	}
	return out
}

func exportReachesOnlyTheOthers(s *suite, p Pair) {
	t := s.t
	fromA, fromB := ImportWatching(t, p.A, p.B), ImportWatching(t, p.B, p.A)
	const n = 40
	var want []string
	for _, ev := range turnEvents("run-a", s.key, n) {
		p.A.Export(ev)
		want = append(want, fmt.Sprintf("%s %s %d", ev.Kind, ev.RunID, ev.Seq))
	}
	s.until(fmt.Sprintf("B imports A's %d events", n), func() bool { return len(fromB.Snapshot()) >= n })
	if got := fromB.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Fatalf("B imported %q; want A's events in order %q", got, want)
	}
	// B's own turn in another session: A hears it, after anything of its
	// own would have come back to it.
	marker := turnEvents("run-b", s.key+":b", 1)[0]
	p.B.Export(marker)
	s.until("A imports B's event", func() bool { return len(fromA.Snapshot()) >= 1 })
	if got := fromA.Snapshot(); !reflect.DeepEqual(got, []string{fmt.Sprintf("%s run-b 1", marker.Kind)}) {
		t.Errorf("A imported %q; want B's one event and none of its own", got)
	}
	if got := fromB.Snapshot(); len(got) != n {
		t.Errorf("B imported %d events after its own export; want A's %d only", len(got), n)
	}
}

func concurrentClaimsHaveOneWinner(s *suite, p Pair) {
	t := s.t
	const n = 50
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		c := p.A
		if i%2 == 1 {
			c = p.B
		}
		wg.Go(func() {
			<-start
			errs[i] = s.claim(c, fmt.Sprintf("run-%d", i))
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Fatalf("runs %d and %d both claimed the session", winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatalf("no claim won: %v", errs)
	}
	wantReplica := p.A.Replica()
	if winner%2 == 1 {
		wantReplica = p.B.Replica()
	}
	for i, err := range errs {
		if i == winner {
			continue
		}
		he, ok := errors.AsType[*gateway.HeldError](err)
		if !ok || he.RunID != fmt.Sprintf("run-%d", winner) || he.Replica != wantReplica {
			t.Errorf("claim %d: %v; want *HeldError by run-%d on %s", i, err, winner, wantReplica)
		}
	}
}

func killedReplicasTurnsAreTakenOver(s *suite, p Pair) {
	t := s.t
	if p.KillA == nil {
		t.Skip("the pair cannot kill A")
	}
	fromB := Import(t, p.B)
	s.mustClaim(p.A, "run-1")
	p.KillA()
	s.until("B imports run-1's interrupted end", func() bool {
		for _, g := range fromB.Snapshot() {
			if g == fmt.Sprintf("%s run-1 0", event.Aborted) {
				return true
			}
		}
		return false
	})
	for _, ev := range fromB.Events() {
		if ev.Kind == event.Aborted && ev.RunID == "run-1" &&
			(ev.StopReason != event.ReasonInterrupted || ev.Message == "" || ev.SessionKey != s.key) {
			t.Errorf("run-1's end: %+v; want aborted as interrupted in %s, with the notice", ev, s.key)
		}
	}
	s.until("the session is free", func() bool {
		_, _, ok, err := p.B.Holder(s.ctx(), s.key)
		return err == nil && !ok
	})
	re, ok := errors.AsType[*gateway.RunExistsError](s.claim(p.B, "run-1"))
	if !ok || re.Running || re.StopReason != event.ReasonInterrupted {
		t.Errorf("the killed replica's run id: %v; want *RunExistsError interrupted", re)
	}
	s.mustClaim(p.B, "run-2")
	if err := p.A.Finish(s.ctx(), finished("run-1", "late")); !errors.Is(err, gateway.ErrNotTurnOwner) {
		t.Errorf("the killed replica's late Finish: %v; want ErrNotTurnOwner", err)
	}
}
