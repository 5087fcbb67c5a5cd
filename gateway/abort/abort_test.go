package abort

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/timeout"

	"github.com/turnguard/turnguard/internal/faketime"
)

func register(t testing.TB, g *Registry, id string) *Run {
	t.Helper()
	r, err := g.Register(context.Background(), Spec{RunID: id, SessionKey: "main", Channel: "ws", Settings: timeout.Defaults()})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRegisterRefusesDuplicateAndReturnsExisting(t *testing.T) {
	g := New(nil)
	r := register(t, g, "k1")
	_, err := g.Register(context.Background(), Spec{RunID: "k1"})
	var dup *DuplicateError
	if !errors.As(err, &dup) || dup.Run != r || !errors.Is(err, ErrDuplicate) {
		t.Fatalf("second Register = %v, want DuplicateError with the first run", err)
	}
	if _, err := g.Register(context.Background(), Spec{}); err == nil {
		t.Fatal("empty run id accepted")
	}
	// After release the id can start a new run.
	g.Release(r)
	if _, err := g.Register(context.Background(), Spec{RunID: "k1", Settings: timeout.Defaults()}); err != nil {
		t.Fatalf("Register after release: %v", err)
	}
}

// TestFinishAbortRaceHasOneWinner runs the race of a runner completing just
// as a deadline passes thousands of times: exactly one side wins, the loser
// changes nothing and says it lost.
func TestFinishAbortRaceHasOneWinner(t *testing.T) {
	g := New(nil)
	for i := range 5000 {
		r := register(t, g, "race")
		var finishWon, abortWon atomic.Bool
		var ev event.Event
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() { defer wg.Done(); <-start; finishWon.Store(r.Finish(event.ReasonStop)) }()
		go func() {
			defer wg.Done()
			<-start
			e, ok := r.Abort(event.ReasonStepTimeout)
			ev = e
			abortWon.Store(ok)
		}()
		close(start)
		wg.Wait()
		if finishWon.Load() == abortWon.Load() {
			t.Fatalf("iteration %d: finish won %v, abort won %v — want exactly one", i, finishWon.Load(), abortWon.Load())
		}
		switch {
		case finishWon.Load():
			if r.State() != StateFinished || r.StopReason() != event.ReasonStop || r.Context().Err() != nil {
				t.Fatalf("finish won but state %v reason %v ctx %v", r.State(), r.StopReason(), r.Context().Err())
			}
		default:
			if r.State() != StateAborted || r.StopReason() != event.ReasonStepTimeout || ev.Kind != event.Aborted {
				t.Fatalf("abort won but state %v reason %v event %v", r.State(), r.StopReason(), ev.Kind)
			}
			if c := context.Cause(r.Context()); c == nil {
				t.Fatal("abort won but the runner's context is not cancelled")
			}
		}
		g.Release(r)
	}
}

func TestAbortTwiceSecondLoses(t *testing.T) {
	g := New(nil)
	r := register(t, g, "a")
	if _, ok := r.Abort(event.ReasonUser); !ok {
		t.Fatal("first abort lost")
	}
	if _, ok := r.Abort(event.ReasonTimeout); ok {
		t.Fatal("second abort won")
	}
	if r.Finish(event.ReasonStop) {
		t.Fatal("finish after abort won")
	}
	if r.StopReason() != event.ReasonUser {
		t.Fatalf("reason %v", r.StopReason())
	}
	var ae *AbortError
	if !errors.As(context.Cause(r.Context()), &ae) || ae.Reason != event.ReasonUser {
		t.Fatalf("cause = %v", context.Cause(r.Context()))
	}
}

// TestStepsAndAbortMessage: an abort carries the facts its notice is
// rendered from (steps, elapsed, the limit hit) and the partial reply.
func TestStepsAndAbortMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New(nil)
		r := register(t, g, "s")
		r.StepStarted("tool", "web_search")
		faketime.Advance(2 * time.Second)
		r.StepCompleted("tool", "web_search")
		r.StepStarted("tool", "shell")
		faketime.Advance(3 * time.Second)
		cur, last := r.CurrentStep()
		if cur.Name != "shell" || cur.Seq != 2 || last.Name != "web_search" {
			t.Fatalf("current %+v last %+v", cur, last)
		}
		r.AppendText("partial ", 0, "")
		ev, ok := r.Abort(event.ReasonStepTimeout)
		if !ok {
			t.Fatal("abort lost")
		}
		want := "⚠️ No progress for 5 min — shell never finished (last completed: web_search). The task may be stuck. Retry or ask for a simpler approach."
		if ev.Message != "" {
			t.Fatalf("the registry rendered %q: it carries facts, the engine renders", ev.Message)
		}
		if ev.Limit != 5*time.Minute || ev.StepTimeout != 5*time.Minute {
			t.Fatalf("limit %v, step timeout %v: want the liveness window, 5m", ev.Limit, ev.StepTimeout)
		}
		if got := messages.Render(nil, ev); got != want {
			t.Fatalf("message from the facts\n got  %q\n want %q", got, want)
		}
		if ev.Elapsed != 5*time.Second || ev.Step.Name != "shell" || ev.LastStep.Name != "web_search" || ev.FullText != "partial " {
			t.Fatalf("event %+v", ev)
		}
	})
}

func TestCompletionWithoutStartIsRecorded(t *testing.T) {
	g := New(nil)
	r := register(t, g, "u")
	r.StepCompleted("tool", "memory_lookup")
	cur, last := r.CurrentStep()
	if !cur.IsZero() || last.Name != "memory_lookup" {
		t.Fatalf("current %+v last %+v", cur, last)
	}
	r.StepStarted("llm", "gpt")
	r.StepStarted("tool", "shell") // superseding a running step keeps the completed one as last
	cur, last = r.CurrentStep()
	if cur.Name != "shell" || last.Name != "memory_lookup" {
		t.Fatalf("current %+v last %+v", cur, last)
	}
}

func TestLivenessResetRules(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New(nil)
		stepMode := register(t, g, "step")
		s := timeout.Defaults()
		s.LivenessResetOn = timeout.LivenessActivity
		act, _ := g.Register(context.Background(), Spec{RunID: "act", Settings: s})
		faketime.Advance(10 * time.Second)
		stepMode.Activity()
		act.Activity()
		if got := stepMode.View().LivenessRef; got != stepMode.View().Start {
			t.Fatalf("activity reset liveness in step mode: ref %v", got)
		}
		if got := act.View().LivenessRef - act.View().Start; got != 10*time.Second {
			t.Fatalf("activity mode ref moved %v, want 10s", got)
		}
		stepMode.Heartbeat()
		if got := stepMode.View().LivenessRef - stepMode.View().Start; got != 10*time.Second {
			t.Fatalf("heartbeat moved ref %v, want 10s", got)
		}
	})
}

func TestSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New(nil)
		s := timeout.Resolve(0, timeout.Keys{StepTimeoutSeconds: f(60), ProgressNotifyAfterSeconds: f(30)})
		r, _ := g.Register(context.Background(), Spec{RunID: "snap", SessionKey: "main", Channel: "telegram", Settings: s})
		r.StepStarted("tool", "shell")
		faketime.Advance(45 * time.Second)
		sn := r.Snapshot()
		if !sn.Stalled || sn.StepElapsed != 45*time.Second || sn.UntilStep != 15*time.Second || sn.CurrentStep.Name != "shell" {
			t.Fatalf("snapshot %+v", sn)
		}
		if sn.UntilWall != 30*time.Minute-45*time.Second || sn.UntilCeiling != time.Hour-45*time.Second {
			t.Fatalf("deadlines %+v", sn)
		}
		if sn.State != "running" || !strings.Contains(sn.Channel, "telegram") {
			t.Fatalf("snapshot %+v", sn)
		}
	})
}

func TestReleaseOnceCallsHook(t *testing.T) {
	var calls atomic.Int32
	g := New(func(*Run) { calls.Add(1) })
	r := register(t, g, "x")
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() { g.Release(r) })
	}
	wg.Wait()
	if calls.Load() != 1 || g.Len() != 0 || r.Context().Err() == nil {
		t.Fatalf("hook calls %d, len %d, ctx %v", calls.Load(), g.Len(), r.Context().Err())
	}
}

func f(v float64) *float64 { return &v }

// TestZeroTimeIsATime: a pause or a completion at the registry's very first
// instant (fake time that has not moved) still counts.
func TestZeroTimeIsATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New(nil)
		r := register(t, g, "z")
		r.StepStarted("tool", "shell")
		r.StepCompleted("tool", "shell")
		if cur, last := r.CurrentStep(); !cur.IsZero() || last.Name != "shell" {
			t.Fatalf("completion at time zero lost: current %+v last %+v", cur, last)
		}
		r.Pause()
		if !r.View().Paused {
			t.Fatal("pause at time zero lost")
		}
	})
}

// TestLongRunKeepsOnlyTwoSteps: a run (or a force-finalized runner that
// keeps reporting) may take millions of steps; only the current and the
// last completed one are ever shown, so the memory a run holds must not
// grow with its steps (200,000 steps here).
func TestLongRunKeepsOnlyTwoSteps(t *testing.T) {
	g := New(nil)
	r := register(t, g, "long")
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	r.StepStarted("tool", "warmup")
	r.StepCompleted("tool", "warmup")
	before := heap()
	for i := range 200_000 {
		name := "shell"
		if i%2 == 1 {
			name = "search"
		}
		r.StepStarted("tool", name)
		r.StepCompleted("tool", name)
	}
	r.StepStarted("tool", "last")
	after := heap()
	if grown := int64(after) - int64(before); grown > 2<<20 {
		t.Fatalf("heap grew %d bytes over 200,000 steps: every step is kept alive", grown)
	}
	if cur, last := r.CurrentStep(); cur.Name != "last" || last.Name != "search" || last.Seq != 200_001 {
		t.Fatalf("current %+v, last %+v; want last running and search (seq 200001) completed", cur, last)
	}
	runtime.KeepAlive(r)
}

// TestStepReadersSeeTheLastStepWhileLinksAreCut: snapshots taken while the
// runner moves from step to step (and old links are cut) always show the
// last completed step next to a running one after the first (-race).
func TestStepReadersSeeTheLastStepWhileLinksAreCut(t *testing.T) {
	g := New(nil)
	r := register(t, g, "readers")
	r.StepStarted("tool", "first")
	r.StepCompleted("tool", "first")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if cur, last := r.CurrentStep(); !cur.IsZero() && last.IsZero() {
				t.Errorf("running step %+v shown without the last completed one", cur)
				return
			}
			if v := r.View(); v.StepRunning && v.LivenessRef == v.Start {
				t.Errorf("liveness reference fell back to the turn's start while step %d runs", v.StepSeq)
				return
			}
		}
	})
	for i := range 100_000 {
		name := "shell"
		if i%2 == 1 {
			name = "search"
		}
		r.StepStarted("tool", name)
		if i%3 != 0 {
			r.StepStarted("tool", "nested") // supersedes the running step
		}
		r.StepCompleted("tool", "nested")
	}
	close(stop)
	wg.Wait()
}

// TestAbortTellsTheWatcherUnlessItIsTheWatcher: Abort calls the OnSooner
// watcher (the abort grace may be due before the run's armed time); AbortDue,
// which the watcher itself calls while it looks at the run, does not.
func TestAbortTellsTheWatcherUnlessItIsTheWatcher(t *testing.T) {
	for _, tt := range []struct {
		name  string
		abort func(*Run) (event.Event, bool)
		want  int
	}{
		{"Abort", func(r *Run) (event.Event, bool) { return r.Abort(event.ReasonUser) }, 1},
		{"AbortDue", func(r *Run) (event.Event, bool) { return r.AbortDue(event.ReasonStepTimeout) }, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := New(nil)
			calls := 0
			g.OnSooner(func(*Run) { calls++ })
			r := register(t, g, "r1")
			if _, ok := tt.abort(r); !ok {
				t.Fatal("the abort lost")
			}
			if calls != tt.want {
				t.Fatalf("OnSooner called %d times, want %d", calls, tt.want)
			}
			if r.State() != StateAborted || r.Context().Err() == nil {
				t.Fatalf("state %v, context %v: want aborted and cancelled", r.State(), r.Context().Err())
			}
			if _, ok := tt.abort(r); ok || calls != tt.want {
				t.Fatalf("a second abort won (%v) or called the watcher (%d)", ok, calls)
			}
		})
	}
}

// TestTerminalPublishHoldsNoLockReadersWaitFor (issue 20: the hang of
// TestLifecycleModelCluster): the terminal event's pub may block — in
// cluster mode it records the ending in the database, retrying while the
// database does not answer — and the run's readers and its runner's late
// events must not wait for it: Text, a late delta (dropped) and a step
// return at once. A ForceFinalized waits until the terminal event is
// passed on, and comes after it. Under the run's lock, a runner's delta
// stalled the runner's goroutine (and, under synctest, the whole bubble)
// for as long as the ending retried.
func TestTerminalPublishHoldsNoLockReadersWaitFor(t *testing.T) {
	g := New(nil)
	r := register(t, g, "t1")
	r.AppendText("so far", 0, "")
	var mu sync.Mutex
	var got []event.Kind
	record := func(ev event.Event) { mu.Lock(); got = append(got, ev.Kind); mu.Unlock() }
	entered, release := make(chan struct{}), make(chan struct{})
	go r.Publish(func(ev event.Event) { close(entered); <-release; record(ev) }, event.Event{Kind: event.Finished, StopReason: event.ReasonStop})
	<-entered
	readers := make(chan string, 1)
	go func() {
		text := r.Text()
		r.Publish(record, event.Event{Kind: event.Delta, Text: "late"})
		r.StepStarted(event.StepTool, "shell")
		readers <- text
	}()
	select {
	case text := <-readers:
		if text != "so far" {
			t.Fatalf("Text while the ending is recorded: %q", text)
		}
	case <-time.After(10 * time.Second): // a bound on a failure, not a wait for a timer
		t.Fatal("Text and a late delta waited for the terminal event's pub")
	}
	forced := make(chan bool, 1)
	go func() { forced <- r.Publish(record, event.Event{Kind: event.ForceFinalized}) }()
	close(release)
	if !<-forced {
		t.Fatal("ForceFinalized was not passed on")
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []event.Kind{event.Finished, event.ForceFinalized}; !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
}

// countingCtx is a cancellable context that counts the children registered
// with it: the context package registers a child through AfterFunc when its
// parent is not one of its own.
type countingCtx struct {
	context.Context
	done     chan struct{}
	mu       sync.Mutex
	children []func()
}

func newCountingCtx() *countingCtx {
	return &countingCtx{Context: context.WithValue(context.Background(), ctxKey{}, "base"), done: make(chan struct{})}
}

type ctxKey struct{}

func (c *countingCtx) Done() <-chan struct{} { return c.done }

func (c *countingCtx) Err() error {
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}

func (c *countingCtx) AfterFunc(f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.children = append(c.children, f)
	return func() bool { return true }
}

func (c *countingCtx) registered() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.children)
}

func (c *countingCtx) cancel() {
	c.mu.Lock()
	fs := c.children
	c.mu.Unlock()
	close(c.done)
	for _, f := range fs {
		f()
	}
}

// TestRunsDoNotRegisterWithTheBaseContext: every run is registered with the
// gateway's one base context; a run's context must not be a child of it
// directly (one map of every live turn, under one lock, at every start and
// end), yet must carry its values and end with it.
func TestRunsDoNotRegisterWithTheBaseContext(t *testing.T) {
	base := newCountingCtx()
	g := New(nil)
	const n = 1000
	runs := make([]*Run, n)
	for i := range runs {
		r, err := g.Register(base, Spec{RunID: string(rune('a'+i%26)) + strings.Repeat("x", i/26), Settings: timeout.Defaults()})
		if err != nil {
			t.Fatal(err)
		}
		runs[i] = r
	}
	if got := base.registered(); got > Slots {
		t.Fatalf("%d children registered with the base context for %d runs, want at most %d (one per shard)", got, n, Slots)
	}
	if v := runs[0].Context().Value(ctxKey{}); v != "base" {
		t.Fatalf("a run's context lost the base context's values: %v", v)
	}
	// Nor with any other cancellable context: its abort or release then
	// removes it from no parent's map (the context package names each
	// layer; a run's parent is the base without its cancellation).
	if name := fmt.Sprint(runs[0].Context()); !strings.HasSuffix(name, ".WithoutCancel.WithCancel") {
		t.Fatalf("a run's context %s derives from a cancellable parent", name)
	}
	// A run that ends leaves the others alone; the base's end ends them all.
	if _, ok := runs[0].Abort(event.ReasonStop); !ok {
		t.Fatal("abort lost")
	}
	if runs[1].Context().Err() != nil {
		t.Fatal("aborting one run ended another's context")
	}
	base.cancel()
	late, err := g.Register(base, Spec{RunID: "after-the-end", Settings: timeout.Defaults()})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range append(runs[1:], late) {
		select { // the shards end their runs from an AfterFunc's goroutine
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		if !errors.Is(r.Context().Err(), context.Canceled) {
			t.Fatalf("run %s: context %v after the base context ended", r.ID, r.Context().Err())
		}
	}
	var ae *AbortError
	if !errors.As(context.Cause(runs[0].Context()), &ae) || ae.Reason != event.ReasonStop {
		t.Fatalf("the aborted run's cause = %v", context.Cause(runs[0].Context()))
	}
}
