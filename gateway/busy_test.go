package gateway

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

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/faketime"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
)

// memQueue is a QueueStore in memory that records its calls. fail, when
// set, makes AddQueued fail; gate, when set, makes AddQueued wait for it.
type memQueue struct {
	mu    sync.Mutex
	msgs  []QueuedMessage
	calls []string
	fail  error
	gate  chan struct{}
}

func (m *memQueue) AddQueued(ctx context.Context, q QueuedMessage) error {
	if m.gate != nil {
		<-m.gate
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, "add "+q.RunID)
	if m.fail != nil {
		return m.fail
	}
	m.msgs = append(m.msgs, q)
	return nil
}

func (m *memQueue) RemoveQueued(ctx context.Context, ids ...string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, "remove "+strings.Join(ids, ","))
	m.msgs = slices.DeleteFunc(m.msgs, func(q QueuedMessage) bool { return slices.Contains(ids, q.RunID) })
	return nil
}

func (m *memQueue) Queued(ctx context.Context) ([]QueuedMessage, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.msgs), nil
}

// handle forgets the queued messages of a turn that starts, as the store
// does in the transaction recording its TurnStarted.
func (m *memQueue) handle(ev event.Event) {
	if ev.Kind != event.TurnStarted {
		return
	}
	ids := append([]string{ev.RunID}, ev.Joined...)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.msgs = slices.DeleteFunc(m.msgs, func(q QueuedMessage) bool { return slices.Contains(ids, q.RunID) })
}

func (m *memQueue) stored() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []string
	for _, q := range m.msgs {
		ids = append(ids, q.RunID)
	}
	return ids
}

// busyEnv is an engine with busy mode mode, a memQueue and the demo runner
// (or rn).
type busyEnv struct {
	e    *Engine
	sink *sink
	q    *memQueue
}

func newBusyEnv(t *testing.T, q *memQueue, rn runner.Runner, adjust ...func(*config.Config)) *busyEnv {
	t.Helper()
	c := testConfig(t, func(c *config.Config) {
		for _, a := range adjust {
			a(c)
		}
	})
	if rn == nil {
		d := demo.New(demo.WithScenarioStep(100 * time.Millisecond))
		t.Cleanup(d.Release)
		rn = d
	}
	if q == nil {
		q = &memQueue{}
	}
	e, s := startEngineWith(t, Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": rn}, Queue: q})
	t.Cleanup(e.Bus().Subscribe("", q.handle))
	return &busyEnv{e: e, sink: s, q: q}
}

func busyMode(mode string) func(*config.Config) {
	return func(c *config.Config) { c.Agents.Defaults.Busy.Mode = mode }
}

func (v *busyEnv) send(t *testing.T, id, text string) Ack {
	t.Helper()
	ack, err := v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: id, Text: text, Owner: "conn1"})
	if err != nil {
		t.Fatalf("Send(%s, %q): %v", id, text, err)
	}
	return ack
}

// ends lists, in the order every subscriber saw them, the starts and ends
// of turns: "r1 started", "r1 aborted timeout", "r2 finished stop".
func (v *busyEnv) ends() []string {
	v.sink.mu.Lock()
	defer v.sink.mu.Unlock()
	var out []string
	for _, ev := range v.sink.events {
		switch ev.Kind {
		case event.TurnStarted:
			out = append(out, ev.RunID+" started")
		case event.Aborted, event.Finished, event.ForceFinalized:
			out = append(out, fmt.Sprintf("%s %s %s", ev.RunID, ev.Kind, ev.StopReason))
		}
	}
	return out
}

func (v *busyEnv) wantEnds(t *testing.T, want ...string) {
	t.Helper()
	synctest.Wait()
	if got := v.ends(); !slices.Equal(got, want) {
		t.Fatalf("turns seen:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func (v *busyEnv) wait(t *testing.T, id string) Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	out, ok := v.e.Wait(ctx, id)
	if !ok {
		t.Fatalf("Wait(%s): no outcome", id)
	}
	return out
}

func wantQueued(t *testing.T, ack Ack, runID string, ahead int, mode BusyMode) {
	t.Helper()
	if ack.Status != StatusQueued || ack.RunID != runID || ack.Ahead != ahead || ack.Busy != mode {
		t.Fatalf("ack %+v, want queued as %s, %d ahead, busy %s", ack, runID, ahead, mode)
	}
}

// TestBusyQueueRunsAfterReply: in the default mode a message sent while a
// turn runs is acknowledged as queued (stored first), shows in Status, and
// runs as its own turn, with its own run id, right after the reply — every
// subscriber sees the first turn's ending before the second's start.
func TestBusyQueueRunsAfterReply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil)
		v.send(t, "r1", "/steps shell:1s say:one")
		wantQueued(t, v.send(t, "r2", "/steps say:two"), "r2", 0, BusyQueue)
		wantQueued(t, v.send(t, "r3", "/steps say:three"), "r3", 1, BusyQueue)
		// A repeated key of a queued message is answered again, not queued twice.
		wantQueued(t, v.send(t, "r3", "/steps say:three"), "r3", 1, BusyQueue)
		st := v.e.Status("main")
		if !st.Running || st.Turn.RunID != "r1" || len(st.Queue) != 2 || st.Queue[0].Text != "/steps say:two" || st.Queue[1].RunID != "r3" {
			t.Fatalf("status %+v", st)
		}
		if got := v.q.stored(); !slices.Equal(got, []string{"r2", "r3"}) {
			t.Fatalf("stored queue %v", got)
		}
		if out := v.wait(t, "r3"); out.Status != StatusOK || out.Text != "three" {
			t.Fatalf("r3 outcome %+v", out)
		}
		if out := v.wait(t, "r2"); out.Text != "two" {
			t.Fatalf("r2 outcome %+v", out)
		}
		v.wantEnds(t, "r1 started", "r1 finished stop", "r2 started", "r2 finished stop", "r3 started", "r3 finished stop")
		if got := v.q.stored(); len(got) != 0 {
			t.Fatalf("still stored after they ran: %v", got)
		}
		if st := v.e.Status("main"); st.Running || len(st.Queue) != 0 {
			t.Fatalf("status after: %+v", st)
		}
	})
}

// TestBusyQueueKeepsOrderForAnswerFromHandler: a message a client sends
// from its handler of a turn's ending (while that ending is still going out)
// waits behind what was queued before it.
func TestBusyQueueKeepsOrderForAnswerFromHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil)
		acks := make(chan Ack, 1)
		unsub := v.e.Bus().Subscribe("", func(ev event.Event) {
			if ev.Kind == event.Finished && ev.RunID == "r1" {
				ack, err := v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: "r3", Text: "/steps say:three", Owner: "conn1"})
				if err != nil {
					t.Error(err)
				}
				acks <- ack
			}
		})
		defer unsub()
		v.send(t, "r1", "/steps shell:1s say:one")
		v.send(t, "r2", "/steps say:two")
		v.wait(t, "r1")
		wantQueued(t, <-acks, "r3", 1, BusyQueue)
		v.wait(t, "r3")
		v.wantEnds(t, "r1 started", "r1 finished stop", "r2 started", "r2 finished stop", "r3 started", "r3 finished stop")
	})
}

// TestBusyQueueRunsAfterTimeout: a message queued behind a turn that times
// out — whichever deadline — runs after the timeout notice.
func TestBusyQueueRunsAfterTimeout(t *testing.T) {
	for _, tc := range []struct {
		reason event.StopReason
		adjust func(*config.Config)
		words  string
	}{
		{event.ReasonTimeout, func(c *config.Config) { c.Agents.Defaults.TimeoutSeconds = secs(2) }, "time limit of 2 s"},
		{event.ReasonStepTimeout, func(c *config.Config) { c.Agents.Defaults.StepTimeoutSeconds = secs(2) }, "No progress for 2 s"},
		{event.ReasonMaxTurnTime, func(c *config.Config) { c.Agents.Defaults.MaxTurnTimeSeconds = secs(2) }, "maximum time of 2 s"},
	} {
		t.Run(string(tc.reason), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				v := newBusyEnv(t, nil, nil, tc.adjust)
				v.send(t, "r1", "/steps shell:hang")
				wantQueued(t, v.send(t, "r2", "/steps say:after"), "r2", 0, BusyQueue)
				out := v.wait(t, "r1")
				if out.StopReason != tc.reason || !strings.Contains(out.Message, tc.words) {
					t.Fatalf("r1 outcome %+v", out)
				}
				if out := v.wait(t, "r2"); out.Status != StatusOK || out.Text != "after" {
					t.Fatalf("queued message after %s: %+v", tc.reason, out)
				}
				v.wantEnds(t, "r1 started", "r1 aborted "+string(tc.reason), "r2 started", "r2 finished stop")
			})
		})
	}
}

// TestBusyQueueAfterStopKeepsNothing: /stop stops the turn and drops what
// was queued (from the store too), saying how many; nothing runs after.
func TestBusyQueueRunsAfterStopKeepsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil)
		v.send(t, "r1", "/steps shell:hang")
		v.send(t, "r2", "/steps say:two")
		v.send(t, "r3", "/steps say:three")
		if _, err := v.e.Stop(context.Background(), "main", "someone-else", false); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("stop by another: %v", err)
		}
		if n := len(v.e.Status("main").Queue); n != 2 {
			t.Fatalf("a refused stop changed the queue: %d left", n)
		}
		res, err := v.e.Stop(context.Background(), "main", "conn1", false)
		if err != nil || !res.Aborted || res.Dropped != 2 || !slices.Equal(res.RunIDs, []string{"r1"}) {
			t.Fatalf("stop: %+v, %v", res, err)
		}
		faketime.Advance(time.Minute)
		v.wantEnds(t, "r1 started", "r1 aborted user")
		if got := v.q.stored(); len(got) != 0 {
			t.Fatalf("dropped messages still stored: %v", got)
		}
		if _, ok := v.e.Wait(context.Background(), "r2"); ok {
			t.Fatal("a dropped message has an outcome")
		}
		// A restored session (one running, one waiting): /stop stops the
		// one and drops the other.
		v.q.mu.Lock()
		v.q.msgs = []QueuedMessage{{RunID: "x1", SessionKey: "idle", Channel: "ws", Text: "/steps shell:hang", Owner: "conn1"},
			{RunID: "x2", SessionKey: "idle", Channel: "ws", Text: "/steps say:two", Owner: "conn1"}}
		v.q.mu.Unlock()
		if err := v.e.RestoreQueued(context.Background()); err != nil {
			t.Fatal(err)
		}
		res, err = v.e.Stop(context.Background(), "idle", "conn1", false)
		if err != nil || res.Dropped != 1 || !res.Aborted {
			t.Fatalf("stop with one running, one queued: %+v, %v", res, err)
		}
	})
}

// TestBusyStopWhileStoring: a /stop that comes while a queued message is
// still being stored drops it too; its Send then answers that it was
// stopped, and the store forgets it.
func TestBusyStopWhileStoring(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &memQueue{gate: make(chan struct{})}
		v := newBusyEnv(t, q, nil)
		v.send(t, "r1", "/steps shell:hang")
		var ack Ack
		done := make(chan struct{})
		go func() { ack = v.send(t, "r2", "/steps say:two"); close(done) }()
		synctest.Wait()
		res, err := v.e.Stop(context.Background(), "main", "conn1", false)
		if err != nil || !res.Aborted || res.Dropped != 1 {
			t.Fatalf("stop: %+v, %v", res, err)
		}
		close(q.gate)
		<-done
		if ack.Status != StatusAborted || ack.RunID != "r2" {
			t.Fatalf("ack of the dropped message %+v", ack)
		}
		faketime.Advance(time.Minute)
		v.wantEnds(t, "r1 started", "r1 aborted user")
		if got := q.stored(); len(got) != 0 {
			t.Fatalf("stored %v", got)
		}
	})
}

// failingRunner fails the message "fail" after a second; others it hands
// to next.
func failingRunner(next runner.Runner) runner.Runner {
	return runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		if turn.Message == "fail" {
			cb.StepStarted("tool", "shell")
			faketime.Advance(time.Second) // the tool runs a second
			return runner.Result{}, errors.New("exit status 1")
		}
		return next.Run(ctx, turn, cb)
	})
}

// TestBusyQueueRunsAfterError: a failed turn's queue runs after its error
// notice.
func TestBusyQueueRunsAfterError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := demo.New()
		v := newBusyEnv(t, nil, failingRunner(d))
		v.send(t, "r1", "fail")
		wantQueued(t, v.send(t, "r2", "/steps say:two"), "r2", 0, BusyQueue)
		if out := v.wait(t, "r1"); out.Status != StatusError || !strings.Contains(out.Message, "error id") {
			t.Fatalf("r1 %+v", out)
		}
		if out := v.wait(t, "r2"); out.Text != "two" {
			t.Fatalf("r2 %+v", out)
		}
		v.wantEnds(t, "r1 started", "r1 finished error", "r2 started", "r2 finished stop")
	})
}

// TestBusyQueueRunsAfterForceFinalize: a runner that ignores the abort
// holds the queue until the turn is force-finalized; the queued message
// then starts, after the ForceFinalized event.
func TestBusyQueueRunsAfterForceFinalize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil, stepTimeout(2))
		v.send(t, "r1", "/steps shell:stuck")
		wantQueued(t, v.send(t, "r2", "/steps say:two"), "r2", 0, BusyQueue)
		faketime.Advance(3 * time.Second) // aborted at 2s, grace 2s
		v.wantEnds(t, "r1 started", "r1 aborted step_timeout")
		if out := v.wait(t, "r2"); out.Text != "two" {
			t.Fatalf("r2 %+v", out)
		}
		v.wantEnds(t, "r1 started", "r1 aborted step_timeout", "r1 force_finalized step_timeout", "r2 started", "r2 finished stop")
	})
}

// TestBusyMaxQueuedOverflow: one message more than busy.maxQueued is
// refused with a QueueFullError (a busy error) whose words say what to do;
// nothing of it is queued or stored.
func TestBusyMaxQueuedOverflow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil, func(c *config.Config) { two := 2; c.Agents.Defaults.Busy.MaxQueued = &two })
		v.send(t, "r1", "/steps shell:hang")
		wantQueued(t, v.send(t, "r2", "a"), "r2", 0, BusyQueue)
		wantQueued(t, v.send(t, "r3", "b"), "r3", 1, BusyQueue)
		_, err := v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: "r4", Text: "c"})
		var full *QueueFullError
		if !errors.As(err, &full) || full.Limit != 2 || !errors.Is(err, ErrBusy) || !strings.Contains(full.UserText(), "/stop") {
			t.Fatalf("third queued message: %v", err)
		}
		if n := len(v.e.Status("main").Queue); n != 2 {
			t.Fatalf("queue %d", n)
		}
		if got := v.q.stored(); !slices.Equal(got, []string{"r2", "r3"}) {
			t.Fatalf("stored %v", got)
		}
		// The channel override: maxQueued 0 lets nothing wait.
		v.e.cfg.Current().Channels.Telegram.Busy.MaxQueued = new(int)
		v.e.Send(context.Background(), SendRequest{SessionKey: "tg", Channel: "telegram", RunID: "t1", Text: "/steps shell:hang"})
		if _, err := v.e.Send(context.Background(), SendRequest{SessionKey: "tg", Channel: "telegram", RunID: "t2", Text: "x"}); !errors.As(err, &full) || full.Limit != 0 {
			t.Fatalf("telegram with maxQueued 0: %v", err)
		}
	})
}

// TestBusyCollectJoins: in collect mode the messages sent while busy join
// one follow-up turn (texts joined by a blank line), answered with its run
// id; it runs once, after the running turn.
func TestBusyCollectJoins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil, busyMode(config.BusyCollect))
		v.send(t, "r1", "/steps shell:1s say:one")
		wantQueued(t, v.send(t, "r2", "first part"), "r2", 0, BusyCollect)
		wantQueued(t, v.send(t, "r3", "second part"), "r2", 0, BusyCollect)
		if got := v.q.stored(); !slices.Equal(got, []string{"r2", "r3"}) {
			t.Fatalf("stored %v", got)
		}
		out := v.wait(t, "r3") // a joined message's outcome is its turn's
		if out.RunID != "r2" || !strings.Contains(out.Text, `You said: "first part second part"`) {
			t.Fatalf("collected outcome %+v", out)
		}
		v.wantEnds(t, "r1 started", "r1 finished stop", "r2 started", "r2 finished stop")
		// A repeated key of a collected message is answered with its turn's outcome.
		if ack := v.send(t, "r3", "second part"); ack.RunID != "r2" || ack.Status != StatusOK || ack.Outcome == nil {
			t.Fatalf("repeat of a collected message %+v", ack)
		}
		v.sink.mu.Lock()
		defer v.sink.mu.Unlock()
		for _, ev := range v.sink.events {
			if ev.Kind == event.TurnStarted && ev.RunID == "r2" && ev.Text != "first part\n\nsecond part" {
				t.Fatalf("the follow-up's message is %q", ev.Text)
			}
		}
	})
}

// TestBusySteerDemo: in steer mode a message for a turn on the demo runner
// goes into that turn: the answer is steered (the running turn's id), the
// demo shows it between its steps and the reply mentions it.
func TestBusySteerDemo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil, busyMode(config.BusySteer))
		v.send(t, "r1", "/steps web_search:1s shell:1s say:done")
		faketime.Advance(500 * time.Millisecond)
		ack := v.send(t, "r2", "also check the weather")
		if ack.Status != StatusSteered || ack.RunID != "r1" || ack.Busy != BusySteer || ack.FellBack {
			t.Fatalf("ack %+v", ack)
		}
		out := v.wait(t, "r1")
		if !strings.Contains(out.Text, "📨 Noted: also check the weather") || !strings.HasSuffix(out.Text, "done") {
			t.Fatalf("reply %q", out.Text)
		}
		v.wantEnds(t, "r1 started", "r1 finished stop")
		_, h, _ := v.e.History(context.Background(), "main", 0)
		if len(h) != 3 || h[1].Text != "also check the weather" {
			t.Fatalf("history %+v", h)
		}
	})
}

// TestBusySteerFallsBack: a runner that cannot take a message mid-turn gets
// it queued instead, and the answer says so.
func TestBusySteerFallsBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := demo.New()
		plain := runner.Func(d.Run) // not a Steerer
		v := newBusyEnv(t, nil, plain, busyMode(config.BusySteer))
		v.send(t, "r1", "/steps shell:1s say:one")
		ack := v.send(t, "r2", "/steps say:two")
		if ack.Status != StatusQueued || !ack.FellBack || ack.Busy != BusySteer || ack.RunID != "r2" {
			t.Fatalf("ack %+v", ack)
		}
		if out := v.wait(t, "r2"); out.Text != "two" {
			t.Fatalf("r2 %+v", out)
		}
		v.wantEnds(t, "r1 started", "r1 finished stop", "r2 started", "r2 finished stop")
	})
}

// lazySteerer says it steers but never reads its inbox.
type lazySteerer struct{ runner.Func }

func (lazySteerer) Steers() bool { return true }

// TestBusySteerNeverTakenRunsNext: a message steered into a turn whose
// runner returned without taking it is not lost: it runs next as its own
// turn.
func TestBusySteerNeverTakenRunsNext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rn := lazySteerer{func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
			if turn.Message == "slow" {
				faketime.Advance(time.Second) // a slow turn
			}
			return runner.Result{Text: "ok " + turn.Message}, nil
		}}
		v := newBusyEnv(t, nil, rn, busyMode(config.BusySteer))
		v.send(t, "r1", "slow")
		if ack := v.send(t, "r2", "late thought"); ack.Status != StatusSteered {
			t.Fatalf("ack %+v", ack)
		}
		v.wait(t, "r1")
		synctest.Wait()
		ends := v.ends()
		if len(ends) != 4 || ends[1] != "r1 finished stop" || !strings.HasSuffix(ends[3], "finished stop") {
			t.Fatalf("turns: %q", ends)
		}
		_, h, _ := v.e.History(context.Background(), "main", 0)
		if last := h[len(h)-1]; last.Text != "ok late thought" {
			t.Fatalf("history %+v", h)
		}
	})
}

// TestBusyInterruptSupersedes: in interrupt mode the running turn stops
// with reason superseded and its own words, then the new message runs.
func TestBusyInterruptSupersedes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil, busyMode(config.BusyInterrupt))
		v.send(t, "r1", "/steps shell:hang")
		faketime.Advance(time.Second)
		wantQueued(t, v.send(t, "r2", "/steps say:new"), "r2", 0, BusyInterrupt)
		out := v.wait(t, "r1")
		if out.Status != StatusAborted || out.StopReason != event.ReasonSuperseded ||
			out.Message != "⏭️ I stopped this request while shell was running because your newer message replaced it — working on that one now." {
			t.Fatalf("r1 %+v", out)
		}
		if out := v.wait(t, "r2"); out.Text != "new" {
			t.Fatalf("r2 %+v", out)
		}
		v.wantEnds(t, "r1 started", "r1 aborted superseded", "r2 started", "r2 finished stop")
		if !event.ReasonSuperseded.Valid() {
			t.Fatal("superseded is not a valid stop reason")
		}
	})
}

// TestBusyReject: in reject mode a message while busy is refused as before;
// nothing is queued.
func TestBusyReject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil, busyMode(config.BusyReject))
		v.send(t, "r1", "/steps shell:1s")
		_, err := v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: "r2", Text: "x"})
		var busy *BusyError
		if !errors.As(err, &busy) || busy.RunID != "r1" {
			t.Fatalf("send while busy: %v", err)
		}
		if st := v.e.Status("main"); len(st.Queue) != 0 || len(v.q.stored()) != 0 {
			t.Fatalf("queued in reject mode: %+v", st)
		}
		v.wait(t, "r1")
		v.wantEnds(t, "r1 started", "r1 finished stop")
	})
}

// TestBusyQueuePersistedBeforeAck: Send answers queued only once the store
// has the message; a store that fails makes Send fail, and nothing is
// queued or run.
func TestBusyQueuePersistedBeforeAck(t *testing.T) {
	t.Run("recorded", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			q := &memQueue{gate: make(chan struct{})}
			v := newBusyEnv(t, q, nil)
			v.send(t, "r1", "/steps shell:hang")
			var ack Ack
			done := make(chan struct{})
			go func() { ack = v.send(t, "r2", "/steps say:two"); close(done) }()
			synctest.Wait()
			select {
			case <-done:
				t.Fatal("Send answered before the store had the message")
			default:
			}
			close(q.gate)
			<-done
			wantQueued(t, ack, "r2", 0, BusyQueue)
			if got := q.stored(); !slices.Equal(got, []string{"r2"}) {
				t.Fatalf("stored %v", got)
			}
			v.e.Stop(context.Background(), "main", "conn1", false)
		})
	})
	t.Run("failing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			q := &memQueue{fail: errors.New("disk I/O error")}
			v := newBusyEnv(t, q, nil)
			v.send(t, "r1", "/steps shell:1s say:one")
			ack, err := v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: "r2", Text: "x"})
			if err == nil || !strings.Contains(err.Error(), "disk I/O error") {
				t.Fatalf("send with a failing store: %+v, %v", ack, err)
			}
			if st := v.e.Status("main"); len(st.Queue) != 0 {
				t.Fatalf("queued anyway: %+v", st.Queue)
			}
			v.wait(t, "r1")
			faketime.Advance(time.Minute)
			v.wantEnds(t, "r1 started", "r1 finished stop")
		})
	})
}

// TestBusyStoreFailsAfterStop: a store write that fails after a /stop
// dropped its message is an error for Send, and nothing breaks.
func TestBusyStoreFailsAfterStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &memQueue{gate: make(chan struct{}), fail: errors.New("disk full")}
		v := newBusyEnv(t, q, nil)
		v.send(t, "r1", "/steps shell:hang")
		var err error
		done := make(chan struct{})
		go func() {
			_, err = v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: "r2", Text: "x"})
			close(done)
		}()
		synctest.Wait()
		if res, err := v.e.Stop(context.Background(), "main", "", true); err != nil || res.Dropped != 1 {
			t.Fatalf("stop: %+v, %v", res, err)
		}
		close(q.gate)
		<-done
		if err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Fatalf("send: %v", err)
		}
		v.wait(t, "r1") // the stopped turn has ended: the session is free
		if ack := v.send(t, "r3", "/steps say:three"); ack.Status != StatusStarted {
			t.Fatalf("next message: %+v", ack)
		}
	})
}

// TestBusyWaitOnFailedQueue: Wait on a message whose store write then
// fails returns no outcome (it never runs).
func TestBusyWaitOnFailedQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &memQueue{gate: make(chan struct{}), fail: errors.New("disk full")}
		v := newBusyEnv(t, q, nil)
		v.send(t, "r1", "/steps shell:1s")
		go v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: "r2", Text: "x"})
		synctest.Wait()
		waited := make(chan bool)
		go func() { _, ok := v.e.Wait(context.Background(), "r2"); waited <- ok }()
		synctest.Wait()
		close(q.gate)
		if <-waited {
			t.Fatal("an outcome for a message that was never queued")
		}
	})
}

// TestRestoreQueuedRunsInOrder: messages the store kept across a restart
// run per session in their order, sessions side by side, and leave the
// store as they start.
func TestRestoreQueuedRunsInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &memQueue{msgs: []QueuedMessage{
			{RunID: "a1", SessionKey: "main", Channel: "ws", Text: "/steps shell:1s say:a1"},
			{RunID: "b1", SessionKey: "other", Channel: "ws", Text: "/steps shell:1s say:b1"},
			{RunID: "a2", SessionKey: "main", Channel: "ws", Text: "/steps say:a2"},
			{RunID: "a3", SessionKey: "main", Channel: "ws", Text: "/steps say:a3"},
		}}
		v := newBusyEnv(t, q, nil)
		if err := v.e.RestoreQueued(context.Background()); err != nil {
			t.Fatal(err)
		}
		if st := v.e.Status("main"); !st.Running || st.Turn.RunID != "a1" || len(st.Queue) != 2 {
			t.Fatalf("main after restore: %+v", st)
		}
		for _, id := range []string{"a3", "b1"} {
			v.wait(t, id)
		}
		synctest.Wait()
		var main, other []string // sessions run side by side: the order is per session
		for _, l := range v.ends() {
			if strings.HasPrefix(l, "a") {
				main = append(main, l)
			} else {
				other = append(other, l)
			}
		}
		if want := []string{"a1 started", "a1 finished stop", "a2 started", "a2 finished stop", "a3 started", "a3 finished stop"}; !slices.Equal(main, want) {
			t.Fatalf("main: %q", main)
		}
		if want := []string{"b1 started", "b1 finished stop"}; !slices.Equal(other, want) {
			t.Fatalf("other: %q", other)
		}
		if got := q.stored(); len(got) != 0 {
			t.Fatalf("still stored: %v", got)
		}
	})
}

// TestBusyQueueWaitsForStuckRunner: a queued message whose runner refuses
// new turns (server.maxStuckRuns runs ignore their stop) waits, and starts
// as soon as the stuck run's runner returns.
func TestBusyQueueWaitsForStuckRunner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		unstick := make(chan struct{})
		rn := runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
			if turn.Message == "stuck" {
				cb.StepStarted("tool", "shell")
				<-unstick // ignores ctx
			}
			return runner.Result{Text: "ok " + turn.Message}, nil
		})
		v := newBusyEnv(t, nil, rn, stepTimeout(2), func(c *config.Config) { c.Server.MaxStuckRuns = 1 })
		v.send(t, "r1", "stuck")
		wantQueued(t, v.send(t, "r2", "two"), "r2", 0, BusyQueue)
		faketime.Advance(10 * time.Second) // aborted at 2s, force-finalized at 4s: the runner is at its cap
		v.wantEnds(t, "r1 started", "r1 aborted step_timeout", "r1 force_finalized step_timeout")
		if st := v.e.Status("main"); st.Running || len(st.Queue) != 1 {
			t.Fatalf("status while the runner refuses: %+v", st)
		}
		close(unstick)
		if out := v.wait(t, "r2"); out.Text != "ok two" {
			t.Fatalf("r2 %+v", out)
		}
		v.wantEnds(t, "r1 started", "r1 aborted step_timeout", "r1 force_finalized step_timeout", "r2 started", "r2 finished stop")
	})
}

// TestRestoreQueuedCollects: in collect mode the messages restored for a
// session are one follow-up turn again.
func TestRestoreQueuedCollects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &memQueue{msgs: []QueuedMessage{
			{RunID: "c1", SessionKey: "main", Channel: "ws", Text: "first"},
			{RunID: "c2", SessionKey: "main", Channel: "ws", Text: "second"},
		}}
		v := newBusyEnv(t, q, nil, busyMode(config.BusyCollect))
		if err := v.e.RestoreQueued(context.Background()); err != nil {
			t.Fatal(err)
		}
		if out := v.wait(t, "c2"); out.RunID != "c1" || !strings.Contains(out.Text, `"first second"`) {
			t.Fatalf("outcome %+v", out)
		}
		v.wantEnds(t, "c1 started", "c1 finished stop")
		if len(q.stored()) != 0 {
			t.Fatalf("stored %v", q.stored())
		}
	})
}

// TestBusyStopIdleDropsQueue: /stop on a session with nothing running but
// messages waiting (their runner refuses new turns) drops them and stops
// nothing; they never run.
func TestBusyStopIdleDropsQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		unstick := make(chan struct{})
		rn := runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
			if turn.Message == "stuck" {
				<-unstick // ignores ctx
			}
			return runner.Result{Text: "ok"}, nil
		})
		v := newBusyEnv(t, nil, rn, stepTimeout(2), func(c *config.Config) { c.Server.MaxStuckRuns = 1 })
		v.send(t, "r1", "stuck")
		v.send(t, "r2", "two")
		faketime.Advance(10 * time.Second)
		if st := v.e.Status("main"); st.Running || len(st.Queue) != 1 {
			t.Fatalf("status %+v", st)
		}
		res, err := v.e.Stop(context.Background(), "main", "conn1", false)
		if err != nil || res.Aborted || res.Stopping || res.Dropped != 1 {
			t.Fatalf("stop: %+v, %v", res, err)
		}
		close(unstick)
		faketime.Advance(time.Minute)
		v.wantEnds(t, "r1 started", "r1 aborted step_timeout", "r1 force_finalized step_timeout")
		if len(v.q.stored()) != 0 {
			t.Fatalf("stored %v", v.q.stored())
		}
	})
}

// TestBusyResetDropsQueue: /new forgets what was queued.
func TestBusyResetDropsQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil)
		v.send(t, "r1", "/steps shell:1s")
		v.send(t, "r2", "/steps say:two")
		v.e.Reset("main")
		v.wait(t, "r1")
		faketime.Advance(time.Minute)
		v.wantEnds(t, "r1 started", "r1 finished stop")
		if len(v.q.stored()) != 0 || len(v.e.Status("main").Queue) != 0 {
			t.Fatal("queue kept after reset")
		}
	})
}

// TestBusyShutdownKeepsQueue: a shutdown neither runs nor forgets what was
// queued: the store keeps it for the next start.
func TestBusyShutdownKeepsQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil)
		v.send(t, "r1", "/steps shell:hang")
		v.send(t, "r2", "/steps say:two")
		v.e.Shutdown(context.Background())
		synctest.Wait()
		v.wantEnds(t, "r1 started", "r1 aborted shutdown")
		if got := v.q.stored(); !slices.Equal(got, []string{"r2"}) {
			t.Fatalf("stored after shutdown: %v", got)
		}
	})
}
