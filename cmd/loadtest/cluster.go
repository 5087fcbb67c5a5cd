package main

// The cluster mode (-replicas N): the whole cluster of issue 12 on loopback,
// started from the project's own files by internal/clusterrig (three
// nats-server processes in a JetStream cluster, one PostgreSQL, N built
// gateway processes in cluster mode), driven through the WebSocket protocol
// (internal/wsclient). It measures, in phases, each on a fresh rig:
//
//   - scaling: closed-loop turns/s through one replica (a cluster of one)
//     and through three (the same client load spread over them);
//   - final: run end → `final` on the sender's connection (the owner) and on
//     a watcher attached to another replica, at an offered rate, with
//     step-timeout turns mixed in whose aborts the replicas' schedulers
//     fire; then every replica's turnguard_abort_late_seconds;
//   - busy: the busy answer's latency through the owner and through a
//     replica that forwards to it;
//   - takeover: SIGKILL of a replica running 1, 1,000, 10,000 hanging
//     turns → the interrupted ends committed, the notices at a watcher on a
//     survivor, the session taking a new message; the replica restarted
//     between kills.
//
// Every connection's events are checked as they arrive: a run's payload seq
// never goes backwards, nothing but the lifecycle end follows its terminal
// event, one terminal event per run; and the database is checked for
// writes a stale owner got in after a takeover.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/tb"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// clusterOptions are the flags of the cluster mode.
type clusterOptions struct {
	replicas    int
	lease       time.Duration
	phases      string         // comma-separated: scaling, final, busy, takeover
	sessions    int            // final/scaling: sessions (one turn at a time each)
	turns       int            // final/scaling: turns per session
	rate        float64        // final: offered turns/s over all replicas
	conns       int            // sender connections per replica (0: one per session; takeover: 64)
	abortEvery  int            // final: every abortEvery-th session runs step-timeout turns (0: none)
	noWatchers  bool           // final/scaling: no session is watched from another replica
	stepTimeout time.Duration  // final: the ws channel's stepTimeoutSeconds
	busySamples int            // busy: sends per path
	kills       []killSize     // takeover: turns on the killed replica × kills
	script      string         // final/scaling: the turn
	turnWait    time.Duration  // a turn's end not seen within this is lost
	max         time.Duration  // the whole run
	logf        func(string)   // progress (stderr)
	out         io.Writer      // the report
	deadline    time.Time      // start + max
	stopping    *atomic.Bool   // past the deadline: phases end early
	runName     string         // names the databases (tb.Run)
	counters    *checkCounters // shared by every phase
}

type killSize struct{ turns, kills int }

// parseKills parses "1:50,1000:10,10000:3".
func parseKills(s string) ([]killSize, error) {
	var out []killSize
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		a, b, ok := strings.Cut(f, ":")
		n, err1 := strconv.Atoi(a)
		k, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || n < 1 || k < 0 || n > 20000 || k > 500 {
			return nil, fmt.Errorf("-kills %q: want TURNS:KILLS,… (1–20000 turns, 0–500 kills)", f)
		}
		out = append(out, killSize{n, k})
	}
	return out, nil
}

// checkCounters are the figures that must stay 0.
type checkCounters struct {
	lostFinals      atomic.Int64 // a started turn whose end its sender (or watcher) never saw
	duplicateEnds   atomic.Int64 // a second terminal event of a run on one connection
	orderViolations atomic.Int64 // payload seq backwards, or an event after the run's end
	staleWrites     atomic.Int64 // a history entry of a taken-over run other than its one notice
	finalAfterKill  atomic.Int64 // a final (not the notice) of a run whose owner was killed
	lostNotices     atomic.Int64 // a taken-over run's end never reached the survivor's watcher

	// not a violation: a takeover's watcher told to reload (1012) instead
	// of getting the notice as an event
	takeoverReloads atomic.Int64
}

// runCluster is the cluster mode's entry: the phases in order, each on its
// own rig, then the report. The PostgreSQL server is stopped at the end.
func runCluster(co clusterOptions) error {
	want := map[string]bool{}
	for _, p := range strings.Split(co.phases, ",") {
		switch p = strings.TrimSpace(p); p {
		case "scaling", "final", "busy", "takeover":
			want[p] = true
		default:
			return fmt.Errorf("-phases: unknown phase %q (scaling, final, busy, takeover)", p)
		}
	}
	if co.replicas < 2 && (want["busy"] || want["takeover"]) {
		return fmt.Errorf("-phases busy and takeover need -replicas ≥ 2 (a replica to forward through, survivors)")
	}
	defer pgtest.Stop()
	co.deadline = time.Now().Add(co.max)
	co.stopping = new(atomic.Bool)
	co.counters = new(checkCounters)
	timer := time.AfterFunc(co.max, func() { co.stopping.Store(true) })
	defer timer.Stop()
	fmt.Fprintf(co.out, "loadtest -replicas %d: lease %v, phases %s, bounded by -max %v; loopback only\n",
		co.replicas, co.lease, co.phases, co.max)
	var errs []error
	phase := func(name string, f func(r *tb.Run) error) {
		if co.stopping.Load() {
			errs = append(errs, fmt.Errorf("phase %s not run: -max %v reached", name, co.max))
			return
		}
		co.logf("== phase " + name)
		err := tb.Do(co.runName+"_"+name, co.logf, f)
		if err != nil {
			errs = append(errs, fmt.Errorf("phase %s: %w", name, err))
		}
	}
	if want["scaling"] {
		phase("scaling", func(r *tb.Run) error { return scalingPhase(r, co) })
	}
	if want["final"] {
		phase("final", func(r *tb.Run) error { return finalPhase(r, co) })
	}
	if want["busy"] || want["takeover"] {
		phase("takeover", func(r *tb.Run) error {
			c := startRig(r, co, co.replicas, 0)
			if want["busy"] {
				if err := busyPhase(r, co, c); err != nil {
					return err
				}
			}
			if want["takeover"] {
				return takeoverPhase(r, co, c)
			}
			return nil
		})
	}
	k := co.counters
	fmt.Fprintf(co.out, "counters (must be 0): lost finals %d, duplicate terminal events %d, order violations %d, stale-owner writes %d, finals of killed runs %d, takeover notices lost at a watcher %d\n",
		k.lostFinals.Load(), k.duplicateEnds.Load(), k.orderViolations.Load(), k.staleWrites.Load(), k.finalAfterKill.Load(), k.lostNotices.Load())
	if n := k.lostFinals.Load() + k.duplicateEnds.Load() + k.orderViolations.Load() + k.staleWrites.Load() + k.finalAfterKill.Load() + k.lostNotices.Load(); n > 0 {
		errs = append(errs, fmt.Errorf("%d counted violations", n))
	}
	return errors.Join(errs...)
}

// startRig starts a cluster of n replicas for load: busy mode reject, room
// for many connections and requests, and (stepTimeout > 0) that step
// timeout on the ws channel.
func startRig(r *tb.Run, co clusterOptions, n int, stepTimeout time.Duration) *clusterrig.Cluster {
	t0 := time.Now()
	c := clusterrig.Start(r, clusterrig.Options{Replicas: n, Lease: co.lease, Config: func(_ int, cfg map[string]any) {
		clusterrig.Set(cfg, "channels.ws.busy.mode", "reject")
		clusterrig.Set(cfg, "server.maxConnsPerIP", 10000)
		clusterrig.Set(cfg, "server.requestsPerSecond", 10000)
		clusterrig.Set(cfg, "server.requestBurst", 100000)
		if stepTimeout > 0 {
			clusterrig.Set(cfg, "channels.ws.timeouts.stepTimeoutSeconds", stepTimeout.Seconds())
		}
	}})
	co.logf(fmt.Sprintf("rig of %d replicas up in %.1fs", n, time.Since(t0).Seconds()))
	return c
}

// tracker follows every run's events on the connections it is given and
// counts what must not happen.
type tracker struct {
	k  *checkCounters
	mu sync.Mutex
	// per connection (its index) and run
	seen map[trackKey]*runSeen
	// wait: run → closed when any connection saw its end
	ends map[trackKey]chan struct{}
}

type trackKey struct {
	conn int
	run  string
}

type runSeen struct {
	gen      int // the connection's generation that saw it (reconnects)
	lastSeq  int64
	ended    bool
	state    string
	endedAt  int64     // the payload's endedAt (unix ms)
	received time.Time // the terminal event's receipt
}

func newTracker(k *checkCounters) *tracker {
	return &tracker{k: k, seen: map[trackKey]*runSeen{}, ends: map[trackKey]chan struct{}{}}
}

// onEvent returns conn's OnEvent.
func (tr *tracker) onEvent(conn int) func(wsclient.Event) {
	return tr.onEventGen(conn, 0)
}

// onEventGen is onEvent for generation gen of conn's id: a watcher that
// reconnected (gen > 0) may get a run's events again from the replica's
// stream; what an earlier generation saw end is not checked again, and a
// run still open starts its sequence afresh.
func (tr *tracker) onEventGen(conn, gen int) func(wsclient.Event) {
	return func(e wsclient.Event) {
		if (e.Name != "chat" && e.Name != "agent") || e.RunID == "" {
			return
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		key := trackKey{conn, e.RunID}
		s := tr.seen[key]
		if s == nil {
			s = &runSeen{gen: gen}
			tr.seen[key] = s
		}
		if s.gen != gen {
			if s.ended {
				return
			}
			s.gen, s.lastSeq = gen, 0
		}
		lifecycleEnd := e.Name == "agent" && e.Stream == "lifecycle" && (e.Data.Phase == "end" || e.Data.Phase == "error")
		switch {
		case e.Terminal() && s.ended:
			tr.k.duplicateEnds.Add(1)
		case s.ended && !lifecycleEnd:
			tr.k.orderViolations.Add(1)
		}
		if e.Seq < s.lastSeq {
			tr.k.orderViolations.Add(1)
		}
		s.lastSeq = max(s.lastSeq, e.Seq)
		if e.Terminal() && !s.ended {
			s.ended, s.state, s.endedAt, s.received = true, e.State, e.EndedAt, e.At
			if ch, ok := tr.ends[key]; ok {
				close(ch)
				delete(tr.ends, key)
			}
		}
	}
}

// end returns what conn saw of run's end.
func (tr *tracker) end(conn int, run string) (runSeen, bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := tr.seen[trackKey{conn, run}]
	if s == nil || !s.ended {
		return runSeen{}, false
	}
	return *s, true
}

// endBy is end polled until it is there or deadline passed.
func (tr *tracker) endBy(conn int, run string, deadline time.Time) (runSeen, bool) {
	s, ok := tr.end(conn, run)
	for !ok && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // real time: polling another process's events
		s, ok = tr.end(conn, run)
	}
	return s, ok
}

// waitEnd returns a channel closed once connection conn saw run end.
func (tr *tracker) waitEnd(conn int, run string) <-chan struct{} {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	key := trackKey{conn, run}
	if s := tr.seen[key]; s != nil && s.ended {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	ch, ok := tr.ends[key]
	if !ok {
		ch = make(chan struct{})
		tr.ends[key] = ch
	}
	return ch
}

// dialer opens connections with tracker ids.
type dialer struct {
	c  *clusterrig.Cluster
	r  *tb.Run
	tr *tracker
	n  atomic.Int64
}

func (d *dialer) dial(replica int) (*wsclient.Client, int) {
	id := int(d.n.Add(1))
	g := d.c.Gateway(replica)
	cl := wsclient.Dial(d.r, g.URL(), wsclient.Options{Token: clusterrig.OperatorToken, Name: g.ID,
		OnEvent: d.tr.onEvent(id), Discard: true})
	return cl, id
}

// refusals counts sends refused as retryable (UNAVAILABLE, retryable:
// e.g. NOT_ACCEPTING_TURNS while a replica's store cannot write) and
// retried; the first refusal's text is kept.
type refusals struct {
	n     atomic.Int64
	first atomic.Value
}

// sendStarted sends one turn and reports whether it started. A retryable
// refusal is retried every 50 ms for at most within (counted in ref).
func sendStarted(cl *wsclient.Client, sess, text, run string, ref *refusals, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		a, err := cl.SendErr(sess, text, run)
		if err != nil {
			return fmt.Errorf("chat.send %s: %w", run, err)
		}
		if a.OK && a.Status == "started" && a.RunID == run {
			return nil
		}
		if ref != nil && !a.OK && a.Err != nil && a.Err.Retryable && time.Now().Before(deadline) {
			ref.n.Add(1)
			ref.first.CompareAndSwap(nil, a.Err.Error())
			time.Sleep(50 * time.Millisecond) // real time: the refusal asks for a retry shortly
			continue
		}
		return fmt.Errorf("chat.send %s: not started: ok=%v status=%q err=%v", run, a.OK, a.Status, a.Err)
	}
}

func (r *refusals) String() string {
	if r.n.Load() == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (first: %v)", r.n.Load(), r.first.Load())
}

// scalingPhase: closed-loop turns/s through one replica (a cluster of one)
// and through three, the same sessions and turns.
func scalingPhase(r *tb.Run, co clusterOptions) error {
	var figures []string
	for _, n := range slices.Compact([]int{1, co.replicas}) {
		var tps float64
		err := tb.Do(fmt.Sprintf("%s_scaling%d", co.runName, n), co.logf, func(r *tb.Run) error {
			c := startRig(r, co, n, 0)
			cost := startCost(r, c)
			cpu := startCPU(c)
			res, err := driveCluster(r, co, c, 0, 0)
			if err != nil {
				return err
			}
			fmt.Fprintf(co.out, "scaling, %d replica(s): CPU %s\n", n, cpu)
			cost.finish(co.out, fmt.Sprintf("scaling, %d replica(s)", n), res.turns)
			tps = res.turnsPerSecond
			fmt.Fprintf(co.out, "scaling, %d replica(s): %d sessions × %d turns of %q, closed loop: %.0f turns/s (%d turns in %.2fs), sender p50/p99 run end → final %s / %s; sends refused and retried: %s; watcher closes: %s (%d ends missed meanwhile); sender closes: %d\n",
				n, co.sessions, co.turns, co.script, res.turnsPerSecond, res.turns, res.elapsed.Seconds(),
				ms(res.same.q(0.5)), ms(res.same.q(0.99)), res.refused, res.reloads, res.missedInReload, res.senderCloses)
			return nil
		})
		if err != nil {
			return err
		}
		figures = append(figures, fmt.Sprintf("%d: %.0f", n, tps))
	}
	fmt.Fprintf(co.out, "scaling: turns/s by replicas %s\n", strings.Join(figures, ", "))
	return nil
}

// finalPhase: open loop at co.rate over every replica; each session's turns
// are sent through replica s%N and watched from replica (s+1)%N; every
// co.abortEvery-th session runs hanging turns that the step timeout
// aborts. Then every replica's abort lateness.
func finalPhase(r *tb.Run, co clusterOptions) error {
	c := startRig(r, co, co.replicas, co.stepTimeout)
	cost := startCost(r, c)
	cpu := startCPU(c)
	res, err := driveCluster(r, co, c, co.rate, co.abortEvery)
	if err != nil {
		return err
	}
	fmt.Fprintf(co.out, "final: CPU %s\n", cpu)
	cost.finish(co.out, "final", res.turns)
	fmt.Fprintf(co.out, "final: %d sessions × %d turns of %q, offered %.0f turns/s over %d replicas: achieved %.0f turns/s (%d turns in %.2fs, %d sends late by > 100 ms)\n",
		co.sessions, co.turns, co.script, co.rate, co.replicas, res.turnsPerSecond, res.turns, res.elapsed.Seconds(), res.lateSends)
	fmt.Fprintf(co.out, "final: run end → final, same replica (the sender, on the owner): p50 %s  p99 %s  max %s  (%d)\n",
		ms(res.same.q(0.5)), ms(res.same.q(0.99)), ms(res.same.q(1)), len(res.same))
	fmt.Fprintf(co.out, "final: run end → final, other replica (a watcher):              p50 %s  p99 %s  max %s  (%d)\n",
		ms(res.cross.q(0.5)), ms(res.cross.q(0.99)), ms(res.cross.q(1)), len(res.cross))
	fmt.Fprintf(co.out, "final: watcher connections closed by their replica: %s; ends missed meanwhile or only replayed after the reconnection (not in the figures): %d; sender connections closed by the owner (their session stopped): %d\n",
		res.reloads, res.missedInReload, res.senderCloses)
	fmt.Fprintf(co.out, "final: step-timeout aborts seen by their senders: %d (step timeout %v); sends refused and retried: %s\n", res.aborts, co.stepTimeout, res.refused)
	for _, g := range c.Gateways() {
		p99, count, err := abortLateP99(g)
		if err != nil {
			return fmt.Errorf("%s /metrics: %w", g.ID, err)
		}
		fmt.Fprintf(co.out, "abort lateness %s: p99 ≤ %s over %d deadline aborts\n", g.ID, p99, count)
	}
	return nil
}

// latencies is a sorted-on-demand sample.
type latencies []time.Duration

func (l latencies) q(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

type driveResult struct {
	turns          int
	elapsed        time.Duration
	turnsPerSecond float64
	same, cross    latencies
	refused        *refusals
	reloads        string // watcher connections closed by a replica, by close code
	senderCloses   int    // sender connections closed by their replica (the session stopped)
	lateSends      int
	aborts         int
	missedInReload int // ends a watcher missed while it reconnected after a close
}

// driveCluster runs co.sessions sessions of co.turns turns: session s sends
// through replica s%N on one of co.conns connections there and, with more
// than one replica and not co.noWatchers, is watched through replica
// (s+1)%N. rate 0 is a closed
// loop (the next turn as soon as the last ended); otherwise turn j of
// session s is due at start + (j·S + s)/rate (later if its last turn has
// not ended). Every abortEvery-th session (0: none) sends "/steps
// shell:hang" instead, ended by the step timeout.
func driveCluster(r *tb.Run, co clusterOptions, c *clusterrig.Cluster, rate float64, abortEvery int) (driveResult, error) {
	n := len(c.Gateways())
	watch := n > 1 && !co.noWatchers // each session watched from another replica
	tr := newTracker(co.counters)
	d := &dialer{c: c, r: r, tr: tr}
	senders := make([][]*wsclient.Client, n)
	senderIDs := make([][]int, n)
	// Watcher connections mirror the senders: session s, sent on
	// connection k of replica s%N, is watched on connection k of replica
	// (s+1)%N (chat.history makes a connection watch the session).
	watchers := make([][]*wsclient.Client, n)
	watcherIDs := make([][]int, n)
	conns := co.conns
	if conns <= 0 { // one connection per session, as real users have
		conns = (co.sessions + n - 1) / n
	}
	for i := range n {
		for range conns {
			cl, id := d.dial(i)
			senders[i] = append(senders[i], cl)
			senderIDs[i] = append(senderIDs[i], id)
			if watch {
				cl, id = d.dial(i)
				watchers[i] = append(watchers[i], cl)
				watcherIDs[i] = append(watcherIDs[i], id)
			}
		}
	}
	sess := func(s int) string { return fmt.Sprintf("agent:main:%s-s%d", strings.ReplaceAll(r.Name(), "_", "-"), s) }
	conn := func(s int) int { return (s / n) % conns }
	watched := make([][][]string, n) // replica → connection → sessions
	for i := range n {
		watched[i] = make([][]string, conns)
	}
	if watch {
		for s := range co.sessions {
			w := (s + 1) % n
			watched[w][conn(s)] = append(watched[w][conn(s)], sess(s))
		}
	}
	// A watcher closed by its replica (1012: it could not repair a gap in
	// a session's events; or as a slow client) reconnects and watches
	// again, as a client reloading would; the ends it missed meanwhile are
	// counted apart.
	reloads := new(reloadCounter)
	watchCtx, stopWatching := context.WithCancel(context.Background())
	var watchWG sync.WaitGroup
	defer func() { stopWatching(); watchWG.Wait() }()
	for i := range watchers {
		for k, cl := range watchers[i] {
			if len(watched[i][k]) == 0 {
				continue
			}
			if err := watchSessions(cl, watched[i][k]); err != nil {
				return driveResult{refused: new(refusals)}, fmt.Errorf("%s: %w", c.Gateway(i).ID, err)
			}
			watchWG.Add(1)
			go func() {
				defer watchWG.Done()
				reconnectWatcher(watchCtx, c.Gateway(i), cl, watcherIDs[i][k], tr, watched[i][k], reloads, co.logf)
			}()
		}
	}
	type turnRec struct {
		run        string
		session    int
		owner      int // replica
		sender     int // tracker id
		senderCl   *wsclient.Client
		watcher    int // tracker id, 0 with one replica
		abort      bool
		sent, late bool
	}
	recs := make([][]turnRec, co.sessions)
	res := driveResult{refused: new(refusals)}
	start := time.Now().Add(200 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), co.deadline)
	defer cancel()
	var wg sync.WaitGroup
	var firstErr atomic.Value
	var senderCloses atomic.Int64
	for s := range co.sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := s % n
			k := conn(s)
			cl, sender := senders[owner][k], senderIDs[owner][k]
			watcher := 0
			if watch {
				watcher = watcherIDs[(s+1)%n][k]
			}
			abort := abortEvery > 0 && (s/n)%abortEvery == abortEvery-1 // every replica gets some
			text := co.script
			if abort {
				text = "/steps shell:hang"
			}
			for j := range co.turns {
				if co.stopping.Load() || ctx.Err() != nil {
					return
				}
				rec := turnRec{run: fmt.Sprintf("%s-s%d-t%d", r.Name(), s, j), session: s, owner: owner, senderCl: cl, sender: sender, watcher: watcher, abort: abort}
				due := start
				if rate > 0 {
					due = start.Add(time.Duration(float64(j*co.sessions+s) / rate * float64(time.Second)))
				}
				if rate > 0 || j == 0 {
					if w := time.Until(due); w > 0 {
						select {
						case <-time.After(w): // real time: the offered rate's schedule
						case <-ctx.Done():
							return
						}
					} else if w < -100*time.Millisecond {
						rec.late = true
					}
				}
				ended := tr.waitEnd(sender, rec.run)
				if err := sendStarted(cl, sess(s), text, rec.run, res.refused, co.turnWait); err != nil {
					if code := cl.CloseCode(); code != 0 {
						// The owner closed the sender's own connection
						// (1012: reload): the session stops here.
						senderCloses.Add(1)
						co.logf(fmt.Sprintf("sender of %s on %s closed with %d; the session stops", sess(s), c.Gateway(owner).ID, code))
						return
					}
					firstErr.CompareAndSwap(nil, err)
					return
				}
				rec.sent = true
				recs[s] = append(recs[s], rec)
				select {
				case <-ended:
				case <-time.After(co.turnWait): // real time: a turn's end is lost past -turn-wait
					return
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	wg.Wait()
	// The watchers' copies of the last ends may trail the senders'.
	waitUntil := time.Now().Add(co.turnWait)
	var last time.Time
	for _, rs := range recs {
		for _, rec := range rs {
			if !rec.sent {
				continue
			}
			if rec.late {
				res.lateSends++
			}
			se, ok := tr.endBy(rec.sender, rec.run, waitUntil)
			if !ok && rec.senderCl.CloseCode() != 0 {
				res.missedInReload++ // its connection was closed by the owner
				continue
			}
			if !ok {
				co.counters.lostFinals.Add(1)
				co.logf(fmt.Sprintf("lost: no end of %s (session %s) at its sender on %s", rec.run, sess(rec.session), c.Gateway(rec.owner).ID))
				continue
			}
			if se.received.After(last) {
				last = se.received
			}
			res.turns++
			if rec.abort {
				res.aborts++
				continue
			}
			res.same = append(res.same, se.received.Sub(time.UnixMilli(se.endedAt)))
			if rec.watcher != 0 {
				we, ok := tr.endBy(rec.watcher, rec.run, waitUntil)
				if !ok {
					if reloads.missed(rec.watcher, se.received) {
						res.missedInReload++
						continue
					}
					co.counters.lostFinals.Add(1)
					co.logf(fmt.Sprintf("lost: no end of %s (session %s) at its watcher on %s", rec.run, sess(rec.session), c.Gateway((rec.owner+1)%n).ID))
					continue
				}
				if we.gen > 0 && time.UnixMilli(we.endedAt).Before(reloads.watchingSince(rec.watcher, we.gen)) {
					// The run ended before this reconnection watched:
					// a replay, not a delivery.
					res.missedInReload++
					continue
				}
				res.cross = append(res.cross, we.received.Sub(time.UnixMilli(we.endedAt)))
			}
		}
	}
	stopWatching()
	watchWG.Wait()
	res.reloads = reloads.String()
	res.senderCloses = int(senderCloses.Load())
	res.elapsed = last.Sub(start)
	if res.elapsed > 0 {
		res.turnsPerSecond = float64(res.turns) / res.elapsed.Seconds()
	}
	if err, _ := firstErr.Load().(error); err != nil {
		return res, err
	}
	return res, nil
}

// takeoverWatch is how many sessions one watcher connection watches in the
// takeover phase.
const takeoverWatch = 50
