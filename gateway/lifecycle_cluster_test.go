package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	"github.com/turnguard/turnguard/cluster/inproc"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/runner"
)

// The model-based test of the lifecycle on the in-process cluster (issue
// 20, beside TestLifecycleModel, which drives one engine): rapid draws
// random interleavings of sends through any replica, /stop, runner
// deltas, steps and returns, time passing, a hot reload of the timeouts,
// and the cluster's own events — a replica fenced (its lease lost; told
// at once or later), the survivor taking its sessions over, a claim and a
// finish that commit but whose answer is lost — runs each under
// testing/synctest, and after every step checks the invariants in
// clusterModel.check; at the end it lets every turn end and checks that
// each queued message ran exactly once unless /stop dropped it. A failure
// shrinks to a minimal interleaving. Busy mode is queue (the cluster's
// queue is the seam under test). The budget is rapid's default (100
// interleavings, about a second) in go test; make fuzz runs 10,000.
//
// It runs by default since the hang was found (issue 20): a terminal
// event's publish, retrying Cluster.Finish after a lost answer, held the
// run's lock, and a goroutine waiting on that mutex (a late delta, Text)
// is not durably blocked under synctest, so the fake clock never advanced
// to the retry. The run's lock is no longer held there (abort.Run.Publish).

// lossyMember is an inproc member whose next claim or finish, when armed,
// commits and then loses its answer (a client disconnect cancelling the
// request mid-COMMIT): the caller gets an error for what the cluster did.
type lossyMember struct {
	*inproc.Member
	mu                    sync.Mutex
	loseClaim, loseFinish bool
	lostClaims            []string // run ids whose claim committed with its answer lost
	lostFinish            int
}

var errAnswerLost = errors.New("the answer was lost after COMMIT")

func (l *lossyMember) Claim(ctx context.Context, c gateway.ClaimRequest) error {
	err := l.Member.Claim(ctx, c)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil && l.loseClaim {
		l.loseClaim = false
		l.lostClaims = append(l.lostClaims, c.RunID)
		return fmt.Errorf("claim run %q: %w: %w", c.RunID, errAnswerLost, context.Canceled)
	}
	return err
}

func (l *lossyMember) Finish(ctx context.Context, ev event.Event) error {
	err := l.Member.Finish(ctx, ev)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil && l.loseFinish {
		l.loseFinish = false
		l.lostFinish++
		return fmt.Errorf("finish run %q: %w: %w", ev.RunID, errAnswerLost, context.Canceled)
	}
	return err
}

// modelReplica is one engine of the model's cluster.
type modelReplica struct {
	name   string
	e      *gateway.Engine
	member *lossyMember
	p      *gateway.ModelPuppet
	src    *config.Source
	killed int // index in the log at which its lease was lost; -1 while it holds it
	told   int // index in the log at which Fenced was called; -1 before
}

// logged is one event in the order the cluster's subscribers saw it: what
// a replica's bus published (from "a", "b", …) or a turn the cluster
// ended as interrupted when its replica's lease was lost (from "hub").
type logged struct {
	from string
	ev   event.Event
}

type clusterModel struct {
	hub      *inproc.Hub
	store    *memQueue
	rs       []*modelReplica
	mu       sync.Mutex
	log      []logged
	sent     int
	queued   map[string]string // run id → session, of messages answered queued
	dropped  map[string]int    // by session: queued messages /stop said it dropped
	takeover bool              // a replica's lease was lost; no survivor has restored the stored queue since
	step     time.Duration     // the step timeout in force (hot reload)
	reloads  []int             // log indexes of the reloads
}

var clusterSessions = []string{"s1", "s2"}

// replicaConfig is the model replicas' configuration: busy mode queue (the
// cluster's queue is the seam under test).
func replicaConfig(step float64) *config.Config {
	c := gateway.ModelConfig(step)
	c.Agents.Defaults.Busy.Mode = config.BusyQueue
	return c
}

func (m *clusterModel) join(t *rapid.T) {
	name := string(rune('a' + len(m.rs)))
	c := replicaConfig(m.step.Seconds())
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	r := &modelReplica{name: name, member: &lossyMember{Member: m.hub.Join(name)}, src: config.NewSource(c),
		p: gateway.NewModelPuppet(false), killed: -1, told: -1}
	e, err := gateway.New(gateway.Options{Config: r.src, Runners: map[string]runner.Runner{config.RunnerDemo: r.p},
		Cluster: r.member, Queue: m.store})
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	r.e = e
	r.member.Serve(e)
	e.Bus().Subscribe("", func(ev event.Event) {
		m.mu.Lock()
		m.log = append(m.log, logged{from: name, ev: ev})
		m.mu.Unlock()
	})
	m.rs = append(m.rs, r)
}

func (m *clusterModel) live() []*modelReplica {
	var out []*modelReplica
	for _, r := range m.rs {
		if r.killed < 0 {
			out = append(out, r)
		}
	}
	return out
}

func (m *clusterModel) mark() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.log)
}

// running returns the puppet turn of session key's active run on r.
func (r *modelReplica) running(key string) (string, *gateway.ModelTurn) { return r.p.Active(r.e, key) }

func (m *clusterModel) fence(r *modelReplica, tell bool) {
	taken := r.member.Kill()
	m.mu.Lock()
	r.killed = len(m.log)
	for _, tt := range taken {
		m.log = append(m.log, logged{from: "hub", ev: event.Event{Kind: event.Aborted, RunID: tt.RunID,
			SessionKey: tt.SessionKey, StopReason: event.ReasonInterrupted}})
	}
	m.takeover = true
	m.mu.Unlock()
	if tell {
		m.tell(r)
	}
}

func (m *clusterModel) tell(r *modelReplica) {
	r.told = m.mark()
	r.e.Fenced()
}

// restore has a live replica take the fenced replicas' queues over, as
// cmd/gateway does after a takeover: it runs the stored queued messages.
func (m *clusterModel) restore(r *modelReplica) {
	m.takeover = false
	_ = r.e.RestoreQueued(context.Background())
}

func (m *clusterModel) doStep(t *rapid.T) string {
	ctx := context.Background()
	live := m.live()
	r := m.rs[rapid.IntRange(0, len(m.rs)-1).Draw(t, "replica")]
	key := rapid.SampledFrom(clusterSessions).Draw(t, "session")
	action := rapid.SampledFrom([]string{"send", "send", "send", "stop", "delta", "stepStart", "return", "return", "fail",
		"ignoreCancel", "elapse", "elapse", "reload", "fence", "tell", "takeover", "join", "loseClaim", "loseFinish"}).Draw(t, "action")
	switch action {
	case "send", "stop":
		if r.killed >= 0 {
			return "skip"
		}
		if action == "stop" {
			if res, err := r.e.Stop(ctx, key, "", true); err == nil {
				m.dropped[key] += res.Dropped
			}
			break
		}
		m.sent++
		id := fmt.Sprintf("r%d", m.sent)
		ack, err := r.e.Send(ctx, gateway.SendRequest{SessionKey: key, Channel: "ws", RunID: id, Text: "m" + id})
		if err == nil && ack.Status == gateway.StatusQueued {
			m.queued[id] = key
		}
		return fmt.Sprintf("send %s %s via %s: %v %v", id, key, r.name, ack.Status, err)
	case "delta", "stepStart", "return", "fail", "ignoreCancel":
		_, ct := r.running(key)
		if ct == nil {
			return "skip"
		}
		r.p.Do(ct, action)
	case "elapse":
		return gateway.ModelElapse(t, 500*time.Millisecond, 2500*time.Millisecond, 6*time.Second)
	case "reload":
		step := rapid.SampledFrom([]float64{2, 5}).Draw(t, "stepTimeout")
		c := replicaConfig(step)
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		m.step = time.Duration(step) * time.Second
		m.reloads = append(m.reloads, m.mark())
		for _, x := range m.rs {
			x.src.Swap(c)
		}
		return fmt.Sprintf("reload stepTimeout %v", m.step)
	case "fence":
		if r.killed >= 0 || len(live) < 2 {
			return "skip"
		}
		tell := rapid.Bool().Draw(t, "told")
		m.fence(r, tell)
		return fmt.Sprintf("fence %s (told %v)", r.name, tell)
	case "tell":
		if r.killed < 0 || r.told >= 0 {
			return "skip"
		}
		m.tell(r)
	case "takeover":
		if r.killed >= 0 || !m.takeover {
			return "skip"
		}
		m.restore(r)
	case "join":
		if len(live) >= 3 || len(m.rs) >= 5 {
			return "skip"
		}
		m.join(t)
		return "join " + m.rs[len(m.rs)-1].name
	case "loseClaim", "loseFinish":
		r.member.mu.Lock()
		if action == "loseClaim" {
			r.member.loseClaim = true
		} else {
			r.member.loseFinish = true
		}
		r.member.mu.Unlock()
		return action + " " + r.name
	}
	return action + " " + key + " on " + r.name
}

// check returns the first invariant that does not hold, "" if all do.
func (m *clusterModel) check() string {
	m.mu.Lock()
	log := slices.Clone(m.log)
	m.mu.Unlock()
	byName := map[string]*modelReplica{}
	for _, r := range m.rs {
		byName[r.name] = r
	}
	order := gateway.TerminalOrder{}
	for i, l := range log {
		ev := l.ev
		if r := byName[l.from]; r != nil {
			// A lost lease publishes nothing: once told, nothing at all;
			// before, no turn starts and no ending (the survivor's
			// interrupted one stands).
			if r.told >= 0 && i >= r.told && ev.Kind != event.ForceFinalized {
				return fmt.Sprintf("replica %s published %s of %s after it was told its lease was lost", r.name, ev.Kind, ev.RunID)
			}
			if r.killed >= 0 && i >= r.killed && (ev.Kind == event.TurnStarted || ev.Kind.Terminal()) {
				return fmt.Sprintf("replica %s published %s of %s after its lease was lost", r.name, ev.Kind, ev.RunID)
			}
			if r.killed >= 0 && i >= r.killed {
				continue // a delta before it knows: no one else saw it (its Export carries nothing)
			}
		}
		// A turn started after a reload has the reloaded timeouts.
		if ev.Kind == event.TurnStarted && len(m.reloads) > 0 && i >= m.reloads[len(m.reloads)-1] && ev.StepTimeout != m.step {
			return fmt.Sprintf("run %s started with step timeout %v after the reload to %v", ev.RunID, ev.StepTimeout, m.step)
		}
		if v := order.See(l.from, ev); v != "" {
			return v
		}
	}
	// A queued message runs at most once, anywhere.
	started := map[string]int{}
	for _, l := range log {
		if l.ev.Kind == event.TurnStarted {
			started[l.ev.RunID]++
			if started[l.ev.RunID] > 1 {
				return fmt.Sprintf("run %s started twice (the second time on %s)", l.ev.RunID, l.from)
			}
		}
	}
	// The cluster's holder of a session runs it. (A replica may still be
	// busy with a run the cluster no longer holds: its ending committed
	// but the answer was lost, and it retries; settled checks that this
	// does not last.)
	return m.holdersRun(false)
}

// holdersRun checks that each session the cluster holds is busy on its
// replica with the held run — whose runner runs, once settled — and, once
// settled, that no live replica is busy or keeps messages waiting.
func (m *clusterModel) holdersRun(settled bool) string {
	byName := map[string]*modelReplica{}
	for _, r := range m.rs {
		byName[r.name] = r
	}
	ctx := context.Background()
	for _, key := range clusterSessions {
		runID, replica, held, _ := m.rs[0].member.Holder(ctx, key)
		if held {
			if id, ct := byName[replica].running(key); id != runID || (settled && ct == nil) {
				return fmt.Sprintf("session %s is held for run %s on %s, which runs %q there (runner alive %v)", key, runID, replica, id, ct != nil)
			}
		}
		if !settled {
			continue
		}
		for _, r := range m.live() {
			if id, ct := r.running(key); id != "" && (ct == nil || !held || id != runID) {
				return fmt.Sprintf("replica %s has session %s busy with run %s (runner alive %v; the cluster holds %q)", r.name, key, id, ct != nil, runID)
			}
			if q := r.e.Status(key).Queue; len(q) > 0 {
				st := r.e.Status(key)
				return fmt.Sprintf("session %s keeps %d messages waiting on %s with nothing left to run (status %+v; the cluster holds %q)", key, len(q), r.name, st, runID)
			}
		}
	}
	return ""
}

// settle lets every turn end: the fenced replicas' sessions are taken
// over, and every runner returns, until nothing runs.
func (m *clusterModel) settle() {
	for range 30 {
		if live := m.live(); m.takeover && len(live) > 0 {
			m.restore(live[0])
		}
		busy := false
		for _, r := range m.rs {
			busy = r.p.ReturnAll() || busy
		}
		time.Sleep(10 * time.Second) // real time: no — inside the synctest bubble this advances the fake clock
		synctest.Wait()
		// Settled once nothing ran before the sleep nor runs after it: a
		// turn may start during the sleep (the one queued behind an ending
		// that was retried).
		if !busy && !m.takeover && !m.busy() {
			return
		}
	}
}

// busy reports whether a runner runs or a session is busy on a live
// replica.
func (m *clusterModel) busy() bool {
	for _, r := range m.rs {
		if r.p.Running() > 0 {
			return true
		}
	}
	for _, r := range m.live() {
		for _, key := range clusterSessions {
			if _, ok := r.e.Active(key); ok {
				return true
			}
		}
	}
	return false
}

// finalCheck: each message answered queued ran exactly once, unless /stop
// dropped it and said so.
func (m *clusterModel) finalCheck() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	started := map[string]bool{}
	for _, l := range m.log {
		if l.ev.Kind == event.TurnStarted {
			started[l.ev.RunID] = true
		}
	}
	lost := map[string][]string{}
	for id, key := range m.queued {
		// Still stored counts as lost too: once everything settled, a
		// survivor ran every message a fenced replica left stored.
		if !started[id] {
			lost[key] = append(lost[key], id)
		}
	}
	for key, ids := range lost {
		if len(ids) > m.dropped[key] {
			slices.Sort(ids)
			return fmt.Sprintf("session %s: queued %v never ran; /stop said it dropped %d", key, ids, m.dropped[key])
		}
	}
	return ""
}

func (m *clusterModel) transcript() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	for _, l := range m.log {
		fmt.Fprintf(&b, "%s %s %s %s %s\n", l.from, l.ev.RunID, l.ev.SessionKey, l.ev.Kind, l.ev.StopReason)
	}
	return b.String()
}

func TestLifecycleModelCluster(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rapid.SyncTest(t, func(t *rapid.T) {
			m := &clusterModel{hub: inproc.NewHub(), store: &memQueue{}, queued: map[string]string{},
				dropped: map[string]int{}, step: 2 * time.Second}
			defer func() { // also when a draw ends the run early
				for _, r := range m.rs {
					r.p.Quit()
					r.e.Shutdown(context.Background())
					r.member.Close()
				}
			}()
			m.join(t)
			m.join(t)
			trail, violation := gateway.RunModel(t, 50, m.doStep, m.check)
			if violation == "" {
				m.settle()
				if violation = m.check(); violation == "" {
					if violation = m.holdersRun(true); violation == "" {
						violation = m.finalCheck()
					}
				}
			}
			if violation != "" {
				t.Fatalf("%s\nafter: %s\nlog:\n%s", violation, strings.Join(trail, "; "), m.transcript())
			}
		})
	})
}
