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
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

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
}

// runCluster is the cluster mode's entry: the phases in order, each on its
// own rig, then the report. The PostgreSQL server is stopped at the end.
func runCluster(co clusterOptions) error {
	defer pgtest.Stop()
	co.deadline = time.Now().Add(co.max)
	co.stopping = new(atomic.Bool)
	co.counters = new(checkCounters)
	timer := time.AfterFunc(co.max, func() { co.stopping.Store(true) })
	defer timer.Stop()
	want := map[string]bool{}
	for _, p := range strings.Split(co.phases, ",") {
		want[strings.TrimSpace(p)] = true
	}
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
	fmt.Fprintf(co.out, "counters (must be 0): lost finals %d, duplicate terminal events %d, order violations %d, stale-owner writes %d, finals of killed runs %d\n",
		k.lostFinals.Load(), k.duplicateEnds.Load(), k.orderViolations.Load(), k.staleWrites.Load(), k.finalAfterKill.Load())
	if n := k.lostFinals.Load() + k.duplicateEnds.Load() + k.orderViolations.Load() + k.staleWrites.Load() + k.finalAfterKill.Load(); n > 0 {
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
	ends map[string]chan struct{}
}

type trackKey struct {
	conn int
	run  string
}

type runSeen struct {
	lastSeq  int64
	ended    bool
	state    string
	endedAt  int64     // the payload's endedAt (unix ms)
	received time.Time // the terminal event's receipt
}

func newTracker(k *checkCounters) *tracker {
	return &tracker{k: k, seen: map[trackKey]*runSeen{}, ends: map[string]chan struct{}{}}
}

// onEvent returns conn's OnEvent.
func (tr *tracker) onEvent(conn int) func(wsclient.Event) {
	return func(e wsclient.Event) {
		if (e.Name != "chat" && e.Name != "agent") || e.RunID == "" {
			return
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		key := trackKey{conn, e.RunID}
		s := tr.seen[key]
		if s == nil {
			s = &runSeen{}
			tr.seen[key] = s
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
			if ch, ok := tr.ends[e.RunID]; ok {
				close(ch)
				delete(tr.ends, e.RunID)
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

// waitEnd returns a channel closed once any connection saw run end.
func (tr *tracker) waitEnd(run string) <-chan struct{} {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for k, s := range tr.seen {
		if k.run == run && s.ended {
			ch := make(chan struct{})
			close(ch)
			return ch
		}
	}
	ch, ok := tr.ends[run]
	if !ok {
		ch = make(chan struct{})
		tr.ends[run] = ch
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
	for _, n := range []int{1, co.replicas} {
		var tps float64
		err := tb.Do(fmt.Sprintf("%s_scaling%d", co.runName, n), co.logf, func(r *tb.Run) error {
			c := startRig(r, co, n, 0)
			res, err := driveCluster(r, co, c, 0, 0)
			if err != nil {
				return err
			}
			tps = res.turnsPerSecond
			fmt.Fprintf(co.out, "scaling, %d replica(s): %d sessions × %d turns of %q, closed loop: %.0f turns/s (%d turns in %.2fs), sender p50/p99 run end → final %s / %s; sends refused and retried: %s\n",
				n, co.sessions, co.turns, co.script, res.turnsPerSecond, res.turns, res.elapsed.Seconds(),
				ms(res.same.q(0.5)), ms(res.same.q(0.99)), res.refused)
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
	res, err := driveCluster(r, co, c, co.rate, co.abortEvery)
	if err != nil {
		return err
	}
	fmt.Fprintf(co.out, "final: %d sessions × %d turns of %q, offered %.0f turns/s over %d replicas: achieved %.0f turns/s (%d turns in %.2fs, %d sends late by > 100 ms)\n",
		co.sessions, co.turns, co.script, co.rate, co.replicas, res.turnsPerSecond, res.turns, res.elapsed.Seconds(), res.lateSends)
	fmt.Fprintf(co.out, "final: run end → final, same replica (the sender, on the owner): p50 %s  p99 %s  max %s  (%d)\n",
		ms(res.same.q(0.5)), ms(res.same.q(0.99)), ms(res.same.q(1)), len(res.same))
	fmt.Fprintf(co.out, "final: run end → final, other replica (a watcher):              p50 %s  p99 %s  max %s  (%d)\n",
		ms(res.cross.q(0.5)), ms(res.cross.q(0.99)), ms(res.cross.q(1)), len(res.cross))
	fmt.Fprintf(co.out, "final: step-timeout aborts seen by their senders: %d (step timeout %v); sends refused and retried: %s\n", res.aborts, co.stepTimeout, res.refused)
	for _, g := range c.Gateways() {
		p99, count, err := abortLateP99(g)
		if err != nil {
			return fmt.Errorf("%s /metrics: %w", g.ID, err)
		}
		fmt.Fprintf(co.out, "abort lateness %s: p99 ≤ %s (bucket bound) over %d deadline aborts\n", g.ID, p99, count)
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
	lateSends      int
	aborts         int
}

// driveCluster runs co.sessions sessions of co.turns turns: session s sends
// through replica s%N on one of co.conns connections there and, with more
// than one replica, is watched through replica (s+1)%N. rate 0 is a closed
// loop (the next turn as soon as the last ended); otherwise turn j of
// session s is due at start + (j·S + s)/rate (later if its last turn has
// not ended). Every abortEvery-th session (0: none) sends "/steps
// shell:hang" instead, ended by the step timeout.
func driveCluster(r *tb.Run, co clusterOptions, c *clusterrig.Cluster, rate float64, abortEvery int) (driveResult, error) {
	n := len(c.Gateways())
	tr := newTracker(co.counters)
	d := &dialer{c: c, r: r, tr: tr}
	senders := make([][]*wsclient.Client, n)
	senderIDs := make([][]int, n)
	watchers := make([]*wsclient.Client, n)
	watcherIDs := make([]int, n)
	conns := co.conns
	if conns <= 0 { // one connection per session, as real users have
		conns = (co.sessions + n - 1) / n
	}
	for i := range n {
		for range conns {
			cl, id := d.dial(i)
			senders[i] = append(senders[i], cl)
			senderIDs[i] = append(senderIDs[i], id)
		}
		watchers[i], watcherIDs[i] = d.dial(i)
	}
	sess := func(s int) string { return fmt.Sprintf("agent:main:%s-s%d", strings.ReplaceAll(r.Name(), "_", "-"), s) }
	if n > 1 {
		// The watcher of session s is on replica (s+1)%N (chat.history
		// makes a connection watch the session).
		var wg sync.WaitGroup
		var werr atomic.Value
		sem := make(chan struct{}, 32)
		for s := range co.sessions {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				f, err := watchers[(s+1)%n].CallErr("chat.history", map[string]any{"sessionKey": sess(s), "limit": 1})
				if err == nil && !f.OK {
					err = fmt.Errorf("%v", f.Error)
				}
				if err != nil {
					werr.CompareAndSwap(nil, fmt.Errorf("watch %s: %w", sess(s), err))
				}
			}()
		}
		wg.Wait()
		if err, _ := werr.Load().(error); err != nil {
			return driveResult{refused: new(refusals)}, err
		}
	}
	type turnRec struct {
		run        string
		session    int
		owner      int // replica
		sender     int // tracker id
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
	for s := range co.sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := s % n
			k := (s / n) % conns
			cl, sender := senders[owner][k], senderIDs[owner][k]
			watcher := 0
			if n > 1 {
				watcher = watcherIDs[(s+1)%n]
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
				rec := turnRec{run: fmt.Sprintf("%s-s%d-t%d", r.Name(), s, j), session: s, owner: owner, sender: sender, watcher: watcher, abort: abort}
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
				ended := tr.waitEnd(rec.run)
				if err := sendStarted(cl, sess(s), text, rec.run, res.refused, co.turnWait); err != nil {
					firstErr.CompareAndSwap(nil, err)
					recs[s] = append(recs[s], rec)
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
					co.counters.lostFinals.Add(1)
					co.logf(fmt.Sprintf("lost: no end of %s (session %s) at its watcher on %s", rec.run, sess(rec.session), c.Gateway((rec.owner+1)%n).ID))
					continue
				}
				res.cross = append(res.cross, we.received.Sub(time.UnixMilli(we.endedAt)))
			}
		}
	}
	res.elapsed = last.Sub(start)
	if res.elapsed > 0 {
		res.turnsPerSecond = float64(res.turns) / res.elapsed.Seconds()
	}
	if err, _ := firstErr.Load().(error); err != nil {
		return res, err
	}
	return res, nil
}

// abortLateP99 reads g's turnguard_abort_late_seconds (every stop reason)
// and returns the upper bound of the bucket holding the 99th percentile.
func abortLateP99(g *clusterrig.Gateway) (string, int64, error) {
	req, err := http.NewRequest(http.MethodGet, g.HTTP()+"/metrics", nil)
	if err != nil {
		return "", 0, err
	}
	req.Header.Set("Authorization", "Bearer "+clusterrig.OperatorToken)
	cl := http.Client{Timeout: 10 * time.Second}
	res, err := cl.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return "", 0, err
	}
	if res.StatusCode != http.StatusOK {
		return "", 0, fmt.Errorf("status %d", res.StatusCode)
	}
	return lateP99(string(b))
}

// lateP99 sums the abort_late_seconds buckets over the stop reasons and
// returns the bound of the bucket the 99th percentile falls in.
func lateP99(metrics string) (string, int64, error) {
	buckets := map[string]int64{}
	var bounds []float64
	for _, line := range strings.Split(metrics, "\n") {
		if !strings.HasPrefix(line, "turnguard_abort_late_seconds_bucket{") {
			continue
		}
		i := strings.Index(line, `le="`)
		j := strings.LastIndexByte(line, ' ')
		if i < 0 || j < 0 {
			continue
		}
		le := line[i+4 : i+4+strings.IndexByte(line[i+4:], '"')]
		v, err := strconv.ParseFloat(line[j+1:], 64)
		if err != nil {
			return "", 0, fmt.Errorf("metrics line %q: %w", line, err)
		}
		if _, ok := buckets[le]; !ok {
			f, err := strconv.ParseFloat(le, 64) // "+Inf" parses
			if err != nil {
				return "", 0, fmt.Errorf("metrics bound %q: %w", le, err)
			}
			bounds = append(bounds, f)
		}
		buckets[le] += int64(v)
	}
	sort.Float64s(bounds)
	if len(bounds) == 0 {
		return "n/a (no histogram)", 0, nil
	}
	total := buckets[fmtBound(bounds[len(bounds)-1])]
	if total == 0 {
		return "n/a", 0, nil
	}
	for _, b := range bounds {
		if float64(buckets[fmtBound(b)]) >= 0.99*float64(total) {
			return time.Duration(b * float64(time.Second)).String(), total, nil
		}
	}
	return "+Inf", total, nil
}

func fmtBound(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// busyPhase: a session held by a hanging turn on replica 0; busy sends
// through replica 0 (the owner) and through replica 1 (claim → held
// elsewhere → forwarded → the owner's answer), one at a time.
func busyPhase(r *tb.Run, co clusterOptions, c *clusterrig.Cluster) error {
	tr := newTracker(co.counters)
	d := &dialer{c: c, r: r, tr: tr}
	own, _ := d.dial(0)
	sess := "agent:main:busy-check"
	if err := sendStarted(own, sess, "/steps shell:hang", "busy-holder", nil, 0); err != nil {
		return err
	}
	for _, via := range []int{0, 1} {
		cl := own
		if via != 0 {
			cl, _ = d.dial(via)
		}
		var lat latencies
		for k := range co.busySamples {
			if co.stopping.Load() {
				break
			}
			t0 := time.Now()
			a, err := cl.SendErr(sess, "are you busy", fmt.Sprintf("busy-%d-%d", via, k))
			took := time.Since(t0)
			if err != nil {
				return fmt.Errorf("busy send via %s: %w", c.Gateway(via).ID, err)
			}
			if a.OK || a.Err == nil || a.Err.Details["code"] != "SESSION_BUSY" || a.Err.Details["runId"] != "busy-holder" {
				return fmt.Errorf("busy send via %s: not the busy answer naming busy-holder: ok=%v err=%v", c.Gateway(via).ID, a.OK, a.Err)
			}
			lat = append(lat, took)
		}
		what := "the owner"
		if via != 0 {
			what = "another replica (forwarded)"
		}
		fmt.Fprintf(co.out, "busy answer through %s (%s): p50 %s  p99 %s  max %s  (%d sends, one at a time)\n",
			what, c.Gateway(via).ID, ms(lat.q(0.5)), ms(lat.q(0.99)), ms(lat.q(1)), len(lat))
	}
	// Free the session again.
	if f, err := own.CallErr("chat.abort", map[string]any{"sessionKey": sess}); err != nil || !f.OK {
		return fmt.Errorf("abort busy-holder: %v %v", err, f.Error)
	}
	return nil
}

// takeoverPhase kills replicas running N hanging turns, co.kills times
// per size; see takeoverOnce.
func takeoverPhase(r *tb.Run, co clusterOptions, c *clusterrig.Cluster) error {
	ctx := context.Background()
	db, err := pgx.Connect(ctx, c.DBURL())
	if err != nil {
		return fmt.Errorf("connect to the rig's database: %w", err) // the URL (with its password) is not printed
	}
	defer db.Close(ctx)
	kill := 0
	for _, ks := range co.kills {
		var committed, notified, free latencies
		for range ks.kills {
			if co.stopping.Load() {
				break
			}
			a, b, cc, err := takeoverOnce(r, co, c, db, kill, ks.turns)
			if err != nil {
				return fmt.Errorf("kill %d (%d turns): %w", kill, ks.turns, err)
			}
			committed, notified, free = append(committed, a), append(notified, b), append(free, cc)
			kill++
			co.logf(fmt.Sprintf("kill %d, %d turns: committed %s, notices %s, free %s", kill, ks.turns, ms(a), ms(b), ms(cc)))
		}
		bound := co.lease + time.Second
		fmt.Fprintf(co.out, "takeover, %d turns on the killed replica, %d kills (target p99 ≤ lease + 1 s = %v):\n", ks.turns, len(committed), bound)
		for _, row := range []struct {
			what string
			l    latencies
		}{
			{"(a) every interrupted end committed (database)", committed},
			{"(b) every notice at a watcher on a survivor", notified},
			{"(c) the session takes a new message (via a survivor)", free},
		} {
			fmt.Fprintf(co.out, "  %-56s p50 %s  p99 %s  max %s\n", row.what, ms(row.l.q(0.5)), ms(row.l.q(0.99)), ms(row.l.q(1)))
		}
	}
	return nil
}

// takeoverOnce: n hanging turns on the victim (kill%N), sent through it; a
// watcher on the next replica subscribed to every session; SIGKILL; then
// (a) the database has no running turn of the victim, (b) the watcher saw
// every run end (never a final), (c) a send to the first session through
// the third replica starts. The victim is restarted afterwards.
func takeoverOnce(r *tb.Run, co clusterOptions, c *clusterrig.Cluster, db *pgx.Conn, kill, n int) (committed, notified, free time.Duration, err error) {
	gws := c.Gateways()
	vi := kill % len(gws)
	victim := gws[vi]
	wi, ri := (vi+1)%len(gws), (vi+2)%len(gws)
	err = tb.Do(fmt.Sprintf("%s_kill%d", r.Name(), kill), co.logf, func(r *tb.Run) error {
		tr := newTracker(co.counters)
		d := &dialer{c: c, r: r, tr: tr}
		watcher, wid := d.dial(wi)
		if f, err := watcher.CallErr("sessions.subscribe", map[string]any{}); err != nil || !f.OK {
			return fmt.Errorf("sessions.subscribe: %v %v", err, f.Error)
		}
		reader, _ := d.dial(ri)
		conns := max(1, min(co.conns, n))
		if co.conns <= 0 {
			conns = max(1, min(n, 64))
		}
		senders := make([]*wsclient.Client, conns)
		for k := range senders {
			senders[k], _ = d.dial(vi)
		}
		runs := make([]string, n)
		sessions := make([]string, n)
		var ref refusals
		defer func() {
			if ref.n.Load() > 0 {
				co.logf(fmt.Sprintf("kill %d: sends refused and retried: %s", kill, &ref))
			}
		}()
		var wg sync.WaitGroup
		var serr atomic.Value
		sem := make(chan struct{}, 64)
		for i := range n {
			runs[i] = fmt.Sprintf("k%d-%d", kill, i)
			sessions[i] = fmt.Sprintf("agent:main:kill%d-s%d", kill, i)
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := sendStarted(senders[i%conns], sessions[i], "/steps shell:hang", runs[i], &ref, 10*time.Second); err != nil {
					serr.CompareAndSwap(nil, err)
				}
			}()
		}
		wg.Wait()
		if err, _ := serr.Load().(error); err != nil {
			return err
		}
		// Every turn runs on the victim, and the database says so.
		if err := pollDB(db, 30*time.Second, func(running int) bool { return running == n }, victim.ID); err != nil {
			return fmt.Errorf("the %d turns running on %s: %w", n, victim.ID, err)
		}
		killed := victim.Kill()
		var a, b, cc time.Duration
		var wg2 sync.WaitGroup
		var perr atomic.Value
		wg2.Add(3)
		limit := co.lease + 30*time.Second
		go func() { // (a)
			defer wg2.Done()
			if err := pollDB(db, limit, func(running int) bool { return running == 0 }, victim.ID); err != nil {
				perr.CompareAndSwap(nil, fmt.Errorf("(a) %w", err))
				return
			}
			a = time.Since(killed)
		}()
		go func() { // (b)
			defer wg2.Done()
			var latest time.Time
			for _, run := range runs {
				select {
				case <-tr.waitEnd(run):
				case <-time.After(time.Until(killed.Add(limit))): // real time: bounded wait for another process
					perr.CompareAndSwap(nil, fmt.Errorf("(b) the watcher on %s saw no end of %s within %v", gws[wi].ID, run, limit))
					return
				}
				e, ok := tr.end(wid, run)
				if !ok {
					perr.CompareAndSwap(nil, fmt.Errorf("(b) %s ended on another connection than the watcher", run))
					return
				}
				if e.state == "final" {
					co.counters.finalAfterKill.Add(1)
				}
				if e.received.After(latest) {
					latest = e.received
				}
			}
			b = latest.Sub(killed)
		}()
		go func() { // (c)
			defer wg2.Done()
			for k := 0; ; k++ {
				run := fmt.Sprintf("k%d-next%d", kill, k)
				ack, err := reader.SendErr(sessions[0], "/steps a:1ms", run)
				if err != nil {
					perr.CompareAndSwap(nil, fmt.Errorf("(c) %w", err))
					return
				}
				if ack.OK && ack.Status == "started" {
					cc = time.Since(killed)
					return
				}
				if time.Since(killed) > limit {
					perr.CompareAndSwap(nil, fmt.Errorf("(c) %s took no new message within %v: %v", sessions[0], limit, ack.Err))
					return
				}
				time.Sleep(5 * time.Millisecond) // real time: a send every 5 ms until the session is free
			}
		}()
		wg2.Wait()
		if err, _ := perr.Load().(error); err != nil {
			return err
		}
		// Writes of a stale owner: each taken-over run has exactly one
		// assistant entry, its interrupted notice.
		var bad int64
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM (
			SELECT run_id FROM messages WHERE run_id = ANY($1) AND role = 'assistant'
			GROUP BY run_id HAVING count(*) <> 1 OR bool_or(stop_reason <> 'interrupted')) x`, runs).Scan(&bad); err != nil {
			return fmt.Errorf("check the history: %w", err)
		}
		var missing int64
		if err := db.QueryRow(context.Background(), `SELECT $2 - count(DISTINCT run_id) FROM messages
			WHERE run_id = ANY($1) AND role = 'assistant'`, runs, len(runs)).Scan(&missing); err != nil {
			return fmt.Errorf("check the history: %w", err)
		}
		co.counters.staleWrites.Add(bad)
		co.counters.lostFinals.Add(missing)
		committed, notified, free = a, b, cc
		for _, cl := range append(senders, watcher, reader) {
			cl.Close()
		}
		victim.Restart()
		return nil
	})
	return committed, notified, free, err
}

// pollDB polls, every 5 ms, the count of running turns owned by replica
// until ok accepts it.
func pollDB(db *pgx.Conn, within time.Duration, ok func(running int) bool, replica string) error {
	deadline := time.Now().Add(within)
	var running int
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := db.QueryRow(ctx, `SELECT count(*) FROM turns WHERE state = 'running' AND owner_replica = $1`, replica).Scan(&running)
		cancel()
		if err != nil {
			return fmt.Errorf("count running turns: %w", err)
		}
		if ok(running) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still %d running turns of %s after %v", running, replica, within)
		}
		time.Sleep(5 * time.Millisecond) // real time: polling the database
	}
}
