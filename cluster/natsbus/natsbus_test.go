package natsbus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/natstest"
	"github.com/turnguard/turnguard/internal/testwait"
)

// connect opens a connection to node i of c that fails over to the other
// nodes and reconnects without end (the cluster is killed at cleanup).
func connect(t testing.TB, c *natstest.Cluster, i int) *nats.Conn {
	t.Helper()
	return c.Connect(t, i)
}

func testContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func newExporter(t testing.TB, nc *nats.Conn, opt ExporterOptions) *Exporter {
	t.Helper()
	x, err := NewExporter(testContext(t, 30*time.Second), nc, opt)
	if err != nil {
		t.Fatalf("exporter: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = x.Close(ctx)
	})
	return x
}

// recorder is what a watcher observed: kept events as "k<text>", deltas as
// "d<text>", gaps as "GAP".
type recorder struct {
	mu   sync.Mutex
	log  []string
	gaps []*GapError
}

func (r *recorder) handle(ev event.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ev.Kind == event.Delta {
		r.log = append(r.log, "d"+ev.Text)
	} else {
		r.log = append(r.log, "k"+ev.Text)
	}
}

func (r *recorder) gap(err *GapError) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, "GAP")
	r.gaps = append(r.gaps, err)
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

// kept returns the kept entries and gaps, deltas left out.
func (r *recorder) kept() []string {
	var out []string
	for _, s := range r.snapshot() {
		if !strings.HasPrefix(s, "d") {
			out = append(out, s)
		}
	}
	return out
}

func watch(t testing.TB, nc *nats.Conn, key string, opt WatchOptions) *recorder {
	t.Helper()
	r, _ := watchStats(t, nc, key, opt)
	return r
}

func watchStats(t testing.TB, nc *nats.Conn, key string, opt WatchOptions) (*recorder, *Watcher) {
	t.Helper()
	r := new(recorder)
	w, err := Watch(testContext(t, 10*time.Second), nc, key, r.handle, r.gap, opt)
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	t.Cleanup(w.Stop)
	return r, w
}

// keptEvent is the i-th kept event of a test turn: a step, or the turn's
// start or end.
func keptEvent(key string, i, n int) event.Event {
	k := event.StepCompleted
	switch i {
	case 1:
		k = event.TurnStarted
	case n:
		k = event.Finished
	}
	return event.Event{Kind: k, RunID: "run", SessionKey: key, Seq: uint64(2 * i), Text: strconv.Itoa(i), Time: time.Now()}
}

func deltaEvent(key string, i int) event.Event {
	return event.Event{Kind: event.Delta, RunID: "run", SessionKey: key, Seq: uint64(2*i + 1), Text: strconv.Itoa(i)}
}

func want(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "k" + strconv.Itoa(i+1)
	}
	return out
}

// TestThreeWatchersOnThreeNodesSeeTheSameSequence: one owner publishes a
// turn through node 0; watchers on connections to nodes 0, 1 and 2 each
// deliver the same kept events, in order, and the deltas between them.
func TestThreeWatchersOnThreeNodesSeeTheSameSequence(t *testing.T) {
	c := natstest.Start(t, 3)
	cfg := Config{Replicas: 3}
	x := newExporter(t, connect(t, c, 0), ExporterOptions{Config: cfg})
	const key, n = "agent:main:ws:three", 300
	var rs []*recorder
	for i := range 3 {
		rs = append(rs, watch(t, connect(t, c, i), key, WatchOptions{Config: cfg, Replay: true}))
	}
	for i := 1; i <= n; i++ {
		x.Publish(keptEvent(key, i, n))
		if i < n {
			x.Publish(deltaEvent(key, i))
		}
	}
	for i, r := range rs {
		testwait.Until(t, 20*time.Second, fmt.Sprintf("watcher on node %d delivers %d kept events", i, n), func() bool {
			return len(r.kept()) >= n
		})
		if got := r.kept(); !slices.Equal(got, want(n)) {
			t.Fatalf("watcher on node %d: kept %v", i, got)
		}
	}
	// Deltas may drop, but those delivered sit after the kept event they
	// followed at the owner.
	for i, r := range rs {
		last := 0
		for _, s := range r.snapshot() {
			v, _ := strconv.Atoi(s[1:])
			if s[0] == 'k' {
				last = v
			} else if v != last {
				t.Fatalf("watcher %d: delta %d delivered after kept %d", i, v, last)
			}
		}
	}
	// The watchers may deliver a frame before its acknowledgement reaches
	// the exporter: wait for those, then count.
	if err := x.Flush(testContext(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if st := x.Stats(); st.Acked != n || st.Failed != 0 || st.Dropped != 0 {
		t.Errorf("exporter stats %+v", st)
	}
}

// checkNoSilentGap asserts a watcher's log holds consecutive kept events
// between gap reports, and ends at the last event or with a gap.
func checkNoSilentGap(t *testing.T, who string, log []string, n int) {
	t.Helper()
	prev := 0
	for _, s := range log {
		if s == "GAP" {
			prev = 0
			continue
		}
		v, _ := strconv.Atoi(s[1:])
		if prev != 0 && v != prev+1 {
			t.Fatalf("%s: silent gap: kept %d then %d\nlog %v", who, prev, v, log)
		}
		prev = v
	}
	if prev != n && (len(log) == 0 || log[len(log)-1] != "GAP") {
		t.Fatalf("%s: ends at %d of %d without a gap report\nlog %v", who, prev, n, log)
	}
}

// TestNodeKilledWhileWatched: events keep flowing while one of three NATS
// nodes is SIGKILLed; each watcher (one per node) either delivers the whole
// sequence or reports its gap — never a silent gap.
func TestNodeKilledWhileWatched(t *testing.T) {
	c := natstest.Start(t, 3)
	cfg := Config{Replicas: 3}
	var errs sync.Map
	x := newExporter(t, connect(t, c, 1), ExporterOptions{Config: cfg, AckTimeout: 2 * time.Second,
		OnError: func(err error) { errs.Store(err.Error(), true) }})
	const key, n = "agent:main:ws:kill", 600
	var rs []*recorder
	var ws []*Watcher
	for i := range 3 {
		r, w := watchStats(t, connect(t, c, i), key, WatchOptions{Config: cfg, Replay: true})
		rs, ws = append(rs, r), append(ws, w)
	}
	info, err := x.stream.Info(testContext(t, 5*time.Second))
	if err != nil || info.Cluster == nil || !strings.HasPrefix(info.Cluster.Leader, "n") {
		t.Fatalf("stream info: %+v, %v", info, err)
	}
	leader, _ := strconv.Atoi(info.Cluster.Leader[1:])
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i <= n; i++ {
			x.Publish(keptEvent(key, i, n))
			x.Publish(deltaEvent(key, i))
			time.Sleep(5 * time.Millisecond) // real time: a turn's pace, so the kill lands mid-stream
		}
	}()
	testwait.Until(t, 20*time.Second, "a third of the events delivered", func() bool { return len(rs[0].kept()) > n/3 })
	c.Kill(leader) // the stream's leader, and the node one watcher (maybe the owner too) is connected to
	<-done
	for i, r := range rs {
		testwait.Until(t, 30*time.Second, fmt.Sprintf("watcher %d delivers the last event or reports a gap", i), func() bool {
			l := r.kept()
			return len(l) > 0 && (l[len(l)-1] == "k"+strconv.Itoa(n) || l[len(l)-1] == "GAP")
		})
	}
	for i, r := range rs {
		checkNoSilentGap(t, fmt.Sprintf("watcher %d", i), r.kept(), n)
		r.mu.Lock()
		t.Logf("watcher %d: %d entries, gaps %v, stats %+v", i, len(r.log), r.gaps, ws[i].Stats())
		r.mu.Unlock()
	}
	t.Logf("killed node %d (the stream's leader); exporter %+v", leader, x.Stats())
	errs.Range(func(k, _ any) bool { t.Logf("exporter error: %s", k); return true })
}

// TestGapRepairedFromStream: a watcher whose handler stalls is a slow
// consumer, and NATS withholds the frames that overflow its buffer; the
// watcher repairs them from the stream and delivers every event in order.
func TestGapRepairedFromStream(t *testing.T) {
	c := natstest.Start(t, 3)
	cfg := Config{Replicas: 3}
	x := newExporter(t, connect(t, c, 0), ExporterOptions{Config: cfg})
	const key, n = "agent:main:ws:slow", 50
	release := make(chan struct{})
	r := new(recorder)
	stalled := false
	w, err := Watch(testContext(t, 10*time.Second), connect(t, c, 2), key, func(ev event.Event) {
		if !stalled {
			stalled = true
			<-release
		}
		r.handle(ev)
	}, r.gap, WatchOptions{Config: cfg, Buffer: 1, Replay: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	for i := 1; i <= n; i++ {
		x.Publish(keptEvent(key, i, n))
	}
	testwait.Until(t, 10*time.Second, "every frame acknowledged", func() bool { return x.Stats().Acked == n })
	close(release)
	testwait.Until(t, 10*time.Second, "every event delivered", func() bool { return len(r.kept()) >= n })
	if got := r.kept(); !slices.Equal(got, want(n)) {
		t.Fatalf("kept %v", got)
	}
	if st := w.Stats(); st.Repaired == 0 {
		t.Fatalf("nothing was repaired from the stream (stats %+v): no frame was withheld", st)
	} else {
		t.Logf("watcher stats %+v", st)
	}
}

// TestReplayRepairsWhatCameBeforeWatch: a watcher that starts after a
// session's first events (it has up to After) gets the rest from the stream.
func TestReplayRepairsWhatCameBeforeWatch(t *testing.T) {
	c := natstest.Start(t, 1)
	x := newExporter(t, connect(t, c, 0), ExporterOptions{})
	const key, n = "agent:main:ws:replay", 20
	for i := 1; i <= 10; i++ {
		x.Publish(keptEvent(key, i, n))
	}
	testwait.Until(t, 10*time.Second, "acked", func() bool { return x.Stats().Acked == 10 })
	r := watch(t, connect(t, c, 0), key, WatchOptions{Replay: true, After: 3})
	for i := 11; i <= n; i++ {
		x.Publish(keptEvent(key, i, n))
	}
	testwait.Until(t, 10*time.Second, "delivered", func() bool { return len(r.kept()) >= n-3 })
	if got := r.kept(); !slices.Equal(got, want(n)[3:]) {
		t.Fatalf("kept %v", got)
	}
}

// TestDeltasAreNotKept: deltas reach a live watcher but never the stream.
func TestDeltasAreNotKept(t *testing.T) {
	c := natstest.Start(t, 1)
	nc := connect(t, c, 0)
	x := newExporter(t, nc, ExporterOptions{})
	const key = "agent:main:ws:deltas"
	r := watch(t, connect(t, c, 0), key, WatchOptions{Replay: true})
	x.Publish(keptEvent(key, 1, 3))
	// A delta that reaches a watcher before the session's first kept event
	// is dropped by design (it cannot be placed); wait for that event so
	// the deltas below must all arrive, in order.
	testwait.Until(t, 10*time.Second, "the first kept event", func() bool { return len(r.kept()) == 1 })
	for i := 1; i <= 5; i++ {
		x.Publish(event.Event{Kind: event.Delta, RunID: "run", SessionKey: key, Seq: uint64(10 + i), Text: "x" + strconv.Itoa(i)})
	}
	x.Publish(keptEvent(key, 2, 3))
	testwait.Until(t, 10*time.Second, "both kept events", func() bool { return len(r.kept()) == 2 })
	if got := r.snapshot(); !slices.Equal(got, []string{"k1", "dx1", "dx2", "dx3", "dx4", "dx5", "k2"}) {
		t.Fatalf("watcher saw %v", got)
	}
	info, err := x.stream.Info(testContext(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("the stream holds %d frames, want the 2 kept events", info.State.Msgs)
	}
	if st := x.Stats(); st.Deltas != 5 {
		t.Fatalf("stats %+v", st)
	}
}

// TestTakeoverContinuesTheSequence: a second owner continues a session's
// sequence from the stream (Adopt, or on its first event) and a watcher
// sees no gap; an owner that cannot know (the stream lost the session)
// but is told the last sequence continues from it; one that is told
// nothing conflicts with what the watcher delivered, and the watcher
// reports it.
func TestTakeoverContinuesTheSequence(t *testing.T) {
	c := natstest.Start(t, 3)
	cfg := Config{Replicas: 3}
	const key = "agent:main:ws:takeover"
	a := newExporter(t, connect(t, c, 0), ExporterOptions{Config: cfg})
	r := watch(t, connect(t, c, 2), key, WatchOptions{Config: cfg, Replay: true})
	for i := 1; i <= 5; i++ {
		a.Publish(keptEvent(key, i, 0))
	}
	ctx := testContext(t, 30*time.Second)
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}

	b := newExporter(t, connect(t, c, 1), ExporterOptions{Config: cfg})
	if last, err := b.Adopt(ctx, key, 0); err != nil || last != 5 {
		t.Fatalf("Adopt = %d, %v; want 5", last, err)
	}
	for i := 6; i <= 8; i++ {
		b.Publish(keptEvent(key, i, 0))
	}
	testwait.Until(t, 10*time.Second, "8 events", func() bool { return len(r.kept()) >= 8 })
	b.Close(ctx)

	// A third owner that learns on its first event, without Adopt.
	x3 := newExporter(t, connect(t, c, 2), ExporterOptions{Config: cfg})
	x3.Publish(keptEvent(key, 9, 0))
	testwait.Until(t, 10*time.Second, "9 events", func() bool { return len(r.kept()) >= 9 })
	x3.Close(ctx)
	if got := r.kept(); !slices.Equal(got, want(9)) {
		t.Fatalf("kept %v", got)
	}

	// The stream loses the session (a memory stream after a full restart).
	if err := x3.stream.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	d := newExporter(t, connect(t, c, 0), ExporterOptions{Config: cfg})
	if last, err := d.Adopt(ctx, key, 9); err != nil || last != 9 {
		t.Fatalf("Adopt with 9 = %d, %v", last, err)
	}
	d.Publish(keptEvent(key, 10, 0))
	testwait.Until(t, 10*time.Second, "10 events", func() bool { return len(r.kept()) >= 10 })
	d.Close(ctx)

	if err := x3.stream.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	e := newExporter(t, connect(t, c, 1), ExporterOptions{Config: cfg})
	e.Publish(keptEvent(key, 11, 0)) // numbered 1: it cannot know better
	testwait.Until(t, 10*time.Second, "a conflict reported", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.gaps) == 1
	})
	r.mu.Lock()
	g := r.gaps[0]
	r.mu.Unlock()
	if g.Reason != GapConflict || g.Delivered != 10 {
		t.Fatalf("gap %v; want a conflict after 10", g)
	}
	if got := r.kept(); !slices.Equal(got, append(want(10), "GAP")) {
		t.Fatalf("kept %v", got)
	}
}

// TestExporterWithNATSDown: with the only node stopped, Publish still
// returns at once; the events it cannot hold are counted as dropped, those
// it held but could not store as failed, and each kept one is reported.
func TestExporterWithNATSDown(t *testing.T) {
	c := natstest.Start(t, 1)
	nc := connect(t, c, 0)
	var mu sync.Mutex
	var full, notStored int
	x := newExporter(t, nc, ExporterOptions{Buffer: 1000, MaxInFlight: 100, AckTimeout: 200 * time.Millisecond, Retries: 1,
		OnError: func(err error) {
			var pe *PublishError
			if !errors.As(err, &pe) {
				t.Errorf("OnError(%v): not a *PublishError", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if errors.Is(err, ErrBufferFull) {
				full++
			} else if pe.Seq > 0 {
				notStored++
			}
		}})
	const key = "agent:main:ws:down"
	x.Publish(keptEvent(key, 1, 0))
	testwait.Until(t, 10*time.Second, "acked", func() bool { return x.Stats().Acked == 1 })
	c.Stop(0)
	testwait.Until(t, 10*time.Second, "disconnected", func() bool { return !nc.IsConnected() })

	const n = 100_000
	lat := make([]time.Duration, n)
	for i := range n {
		ev := keptEvent(key, i+2, 0)
		t0 := time.Now()
		x.Publish(ev)
		lat[i] = time.Since(t0)
	}
	slices.Sort(lat)
	p50, p99, worst := lat[n/2], lat[n*99/100], lat[n-1]
	// The figures are for the log: a loaded machine (the race detector, a
	// GC) stretches single calls. That Publish never waits for NATS shows in
	// what it did instead: it dropped what its buffer could not hold (a
	// Publish that waited for room would have dropped nothing).
	t.Logf("Publish with NATS down: p50 %v p99 %v max %v; stats %+v", p50, p99, worst, x.Stats())
	testwait.Until(t, 20*time.Second, "unstored frames counted", func() bool { return x.Stats().Failed > 0 })
	st := x.Stats()
	if st.Dropped == 0 || st.Dropped+uint64(st.Queued) > n {
		t.Errorf("stats %+v", st)
	}
	mu.Lock()
	if full != int(st.Dropped) || notStored == 0 {
		t.Errorf("OnError: %d buffer-full (dropped %d), %d not stored", full, st.Dropped, notStored)
	}
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := x.Close(ctx); err == nil {
		t.Error("Close with NATS down and frames unacknowledged returned nil")
	}
}

// TestSkipOriginHidesOnlyOneExportersEvents: a watcher of every session
// given exporter a's Origin delivers b's events and none of a's, and a
// session that passes from a to b and back stays in sequence: no gap.
func TestSkipOriginHidesOnlyOneExportersEvents(t *testing.T) {
	c := natstest.Start(t, 1)
	nc := connect(t, c, 0)
	a := newExporter(t, nc, ExporterOptions{})
	b := newExporter(t, connect(t, c, 0), ExporterOptions{})
	r, w := watchStats(t, nc, "", WatchOptions{SkipOrigin: a.Origin()})
	const key = "agent:main:ws:origin"
	ctx := testContext(t, 30*time.Second)
	acked := func(x *Exporter, n uint64) {
		t.Helper()
		testwait.Until(t, 10*time.Second, fmt.Sprintf("%d frames acknowledged", n), func() bool { return x.Stats().Acked >= n })
	}
	for i := 1; i <= 3; i++ {
		a.Publish(keptEvent(key, i, 0))
		a.Publish(deltaEvent(key, i))
	}
	acked(a, 3)
	for i := 4; i <= 5; i++ {
		b.Publish(keptEvent(key, i, 0))
		b.Publish(deltaEvent(key, i))
	}
	acked(b, 2)
	if last, err := a.Adopt(ctx, key, 0); err != nil || last != 5 {
		t.Fatalf("a adopts again: %d, %v; want 5", last, err)
	}
	a.Publish(keptEvent(key, 6, 0))
	acked(a, 4)
	if _, err := b.Adopt(ctx, key, 0); err != nil {
		t.Fatal(err)
	}
	b.Publish(keptEvent(key, 7, 0))
	testwait.Until(t, 10*time.Second, "b's third event", func() bool { return len(r.kept()) >= 3 })
	if got := r.kept(); !slices.Equal(got, []string{"k4", "k5", "k7"}) {
		t.Fatalf("kept %v; want b's events only, no gap", got)
	}
	for _, s := range r.snapshot() {
		if s == "d1" || s == "d2" || s == "d3" {
			t.Fatalf("a's delta delivered: %v", r.snapshot())
		}
	}
	if st := w.Stats(); st.Skipped == 0 || st.Gaps != 0 {
		t.Errorf("watcher stats %+v; want a's events skipped, no gap", st)
	}
}

// TestRenewContinuesAfterAnotherOwner: a session numbered by a, then by b,
// then by a again: after a.Renew, a's events continue after b's and every
// watcher delivers all of them in order; without it a would go on under
// its old tenure and its events would be dropped as superseded.
func TestRenewContinuesAfterAnotherOwner(t *testing.T) {
	c := natstest.Start(t, 1)
	a := newExporter(t, connect(t, c, 0), ExporterOptions{})
	b := newExporter(t, connect(t, c, 0), ExporterOptions{})
	const key = "agent:main:ws:renew"
	r := watch(t, connect(t, c, 0), key, WatchOptions{Replay: true})
	b.Renew(key) // b never numbered the session: nothing to do
	for i := 1; i <= 3; i++ {
		a.Publish(keptEvent(key, i, 0))
	}
	testwait.Until(t, 10*time.Second, "a's frames stored", func() bool { return a.Stats().Acked >= 3 })
	for i := 4; i <= 5; i++ {
		b.Publish(keptEvent(key, i, 0))
	}
	testwait.Until(t, 10*time.Second, "b's frames stored", func() bool { return b.Stats().Acked >= 2 })
	a.Renew(key)
	a.Publish(keptEvent(key, 6, 0))
	a.Publish(event.Event{SessionKey: key}) // no kind: not an event, and not a renewal
	a.Publish(keptEvent(key, 7, 0))
	testwait.Until(t, 10*time.Second, "7 events", func() bool { return len(r.kept()) >= 7 })
	if got := r.kept(); !slices.Equal(got, want(7)) {
		t.Fatalf("kept %v", got)
	}
}

// TestFlushWaitsForTheStream: once Flush returns, every kept event
// published before it is acknowledged; with the stream unreachable Flush
// ends with its ctx.
func TestFlushWaitsForTheStream(t *testing.T) {
	c := natstest.Start(t, 1)
	nc := connect(t, c, 0)
	x := newExporter(t, nc, ExporterOptions{})
	const key, n = "agent:main:ws:flush", 20
	for i := 1; i <= n; i++ {
		x.Publish(keptEvent(key, i, n))
		x.Publish(deltaEvent(key, i))
	}
	if err := x.Flush(testContext(t, 10*time.Second)); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if st := x.Stats(); st.Acked != n {
		t.Fatalf("after Flush: %d of %d kept events acknowledged (%+v)", st.Acked, n, st)
	}
	c.Stop(0)
	testwait.Until(t, 10*time.Second, "disconnected", func() bool { return !nc.IsConnected() })
	x.Publish(keptEvent(key, n+1, 0))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := x.Flush(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Flush with the stream down: %v; want its deadline", err)
	}
}

// TestLateFrameOfAnEarlierTenureIsNotAConflict: an owner renews its tenure
// at every claim, so a busy session goes through many tenures of one
// exporter. A frame of one of its early tenures arriving again late (a
// publish retried after an ack timeout reaches core subscribers a second
// time) is late, not a new owner numbering from an earlier point: no gap,
// and the sequence goes on.
func TestLateFrameOfAnEarlierTenureIsNotAConflict(t *testing.T) {
	c := natstest.Start(t, 1)
	nc := connect(t, c, 0)
	x := newExporter(t, nc, ExporterOptions{})
	const key = "agent:main:ws:tenures"
	r := watch(t, connect(t, c, 0), key, WatchOptions{})
	n := 0
	for range 8 { // eight claims: eight tenures, more than a watcher remembers by name
		x.Renew(key)
		for range 2 {
			n++
			x.Publish(keptEvent(key, n, 0))
		}
	}
	testwait.Until(t, 10*time.Second, "16 events", func() bool { return len(r.kept()) >= n })
	first := frame{kind: frameEvent, seq: 2, tenure: x.Origin() + ".1", ev: keptEvent(key, 2, 0)}
	if err := nc.Publish(subjectsFor(Config{}.withDefaults().Prefix, key).kept, appendFrame(nil, &first)); err != nil {
		t.Fatal(err)
	}
	x.Publish(keptEvent(key, n+1, 0))
	testwait.Until(t, 10*time.Second, "the next event", func() bool { return len(r.kept()) >= n+1 })
	r.mu.Lock()
	gaps := len(r.gaps)
	r.mu.Unlock()
	if got := r.kept(); gaps != 0 || !slices.Equal(got, want(n+1)) {
		t.Fatalf("kept %v, %d gaps; want %d events in order and no gap", got, gaps, n+1)
	}
}

// TestSkipOriginFramesAreNeverDecoded (issue 21): a watcher of every
// session decodes none of SkipOrigin's frames — kept or delta — whole; it
// reads their heads, which keep the session's sequence, so the other
// exporter's events that follow them are delivered in order with no gap.
func TestSkipOriginFramesAreNeverDecoded(t *testing.T) {
	c := natstest.Start(t, 1)
	nc := connect(t, c, 0)
	a := newExporter(t, nc, ExporterOptions{})
	b := newExporter(t, connect(t, c, 0), ExporterOptions{})
	r, w := watchStats(t, nc, "", WatchOptions{SkipOrigin: a.Origin()})
	const key = "agent:main:ws:own"
	for i := 1; i <= 5; i++ {
		a.Publish(keptEvent(key, i, 0))
		a.Publish(deltaEvent(key, i))
	}
	testwait.Until(t, 10*time.Second, "a's frames acknowledged", func() bool { return a.Stats().Acked >= 5 })
	if _, err := b.Adopt(testContext(t, 10*time.Second), key, 0); err != nil {
		t.Fatal(err)
	}
	b.Publish(keptEvent(key, 6, 0))
	testwait.Until(t, 10*time.Second, "b's event", func() bool { return len(r.kept()) >= 1 })
	if got := r.kept(); !slices.Equal(got, []string{"k6"}) {
		t.Fatalf("kept %v; want b's event only, no gap", got)
	}
	if st := w.Stats(); st.Decoded != 1 || st.Skipped != 5 || st.Gaps != 0 || st.Repaired != 0 {
		t.Errorf("watcher stats %+v; want only b's frame decoded, a's 5 kept events skipped in sequence, no gap or repair", st)
	}
}

// TestFollowDeliversOnlyTheEndsOfOtherSessions (issue 21): a watcher of
// every session with Follow delivers the sessions it follows whole and in
// order, and of the others only their turns' ends, decoding nothing else;
// a session it starts to follow is delivered whole from its next turn on,
// with no gap, and one it stops following falls back to its ends.
func TestFollowDeliversOnlyTheEndsOfOtherSessions(t *testing.T) {
	c := natstest.Start(t, 1)
	nc := connect(t, c, 0)
	x := newExporter(t, nc, ExporterOptions{})
	var mu sync.Mutex
	shown := map[string]bool{"shown": true}
	follow := func(key string) bool { mu.Lock(); defer mu.Unlock(); return shown[key] }
	r, w := watchStats(t, nc, "", WatchOptions{Follow: follow})
	turn := func(key string, from int) {
		for i := from; i < from+3; i++ {
			ev := keptEvent(key, i, from+2)
			ev.Text = key + ev.Text
			x.Publish(ev)
			d := deltaEvent(key, i)
			d.Text = key + d.Text
			x.Publish(d)
		}
	}
	wait := func(n int) {
		t.Helper()
		testwait.Until(t, 10*time.Second, fmt.Sprintf("%d kept events", n), func() bool { return len(r.kept()) >= n })
	}
	turn("shown", 1)
	turn("other", 1)
	wait(4)
	if got, want := r.kept(), []string{"kshown1", "kshown2", "kshown3", "kother3"}; !slices.Equal(got, want) {
		t.Fatalf("kept %v; want the shown session whole and the other's end only %v", got, want)
	}
	if st := w.Stats(); st.Unfollowed != 5 {
		t.Errorf("watcher stats %+v; want the other session's 2 steps and 3 deltas dropped undecoded", st)
	}
	mu.Lock()
	shown["other"], shown["shown"] = true, false
	mu.Unlock()
	turn("other", 4)
	turn("shown", 4)
	wait(8)
	if got, want := r.kept()[4:], []string{"kother4", "kother5", "kother6", "kshown6"}; !slices.Equal(got, want) {
		t.Fatalf("kept %v after the switch; want %v", got, want)
	}
	if st := w.Stats(); st.Gaps != 0 || st.Repaired != 0 {
		t.Errorf("watcher stats %+v; want no gap and no repair", st)
	}
}
