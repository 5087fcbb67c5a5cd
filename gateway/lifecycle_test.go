package gateway

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
)

// pauseAskRunner runs one tool step in which it asks deployQuestion in the
// background (as runner/exec does: the agent goes on reading its process
// while the person decides) and pauses and resumes for its own reason, in
// the order ops give; then it waits for the answer, completes the step and
// returns. Each op waits its time first (the bubble's clock).
func pauseAskRunner(ops ...scriptOp) runner.Runner {
	return runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		cb.StepStarted(event.StepTool, "shell")
		answered := make(chan error, 1)
		ask := func(runner.Callbacks) {
			go func() {
				_, err := turn.Ask(ctx, deployQuestion)
				answered <- err
			}()
		}
		for _, op := range ops {
			select {
			case <-ctx.Done():
				return runner.Result{}, ctx.Err()
			case <-time.After(op.wait):
			}
			if op.do == nil {
				ask(cb)
			} else {
				op.do(cb)
			}
		}
		if err := <-answered; err != nil {
			return runner.Result{}, err
		}
		cb.StepCompleted(event.StepTool, "shell")
		return runner.Result{Text: "deployed"}, nil
	})
}

// TestLivenessClockRunsOnlyWhenNeitherPausedNorAsking (issue 20, defect 1):
// the runner's own pause and an open question are two reasons to stop the
// 2s liveness window; ending one must not restart it while the other holds.
// The person answers at 30s and the runner resumes (or has resumed) by
// then: the turn finishes, with no step timeout in between.
func TestLivenessClockRunsOnlyWhenNeitherPausedNorAsking(t *testing.T) {
	ask := func(wait time.Duration) scriptOp { return scriptOp{wait: wait} } // do nil: ask in the background
	for _, tc := range []struct {
		name string
		ops  []scriptOp
	}{{
		// Asks first; pauses and resumes for its own reason at 1s while
		// the question is open (main: the clock restarted, aborted at 3s).
		name: "question open across the runner's pause",
		ops:  []scriptOp{ask(0), {time.Second, pause}, {0, resume}},
	}, {
		// Pauses first, then asks; the answer at 30s must not restart the
		// clock (main: aborted at 32s): the runner stays paused until 35s.
		name: "runner paused across the question",
		ops:  []scriptOp{{0, pause}, ask(500 * time.Millisecond), {34500 * time.Millisecond, resume}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e, s := approvalEnv(t, pauseAskRunner(tc.ops...), nil)
				if _, err := e.Send(context.Background(), SendRequest{SessionKey: "chat1", Channel: "telegram", RunID: "r1", Text: "deploy"}); err != nil {
					t.Fatal(err)
				}
				elapse(time.Second + time.Millisecond)
				q := waitQuestion(t, e, "chat1")
				elapse(29 * time.Second)
				if _, err := e.Resolve(context.Background(), ResolveRequest{ApprovalID: q.ID, OptionID: "yes", SessionKey: "chat1", By: "@alice"}); err != nil {
					t.Fatalf("Resolve after 30s: %v; transcript:\n%s", err, s.transcript())
				}
				out, ok := e.Wait(context.Background(), "r1")
				if !ok || out.StopReason != event.ReasonStop || out.Text != "deployed" {
					t.Fatalf("outcome %+v, want the runner's reply; transcript:\n%s", out, s.transcript())
				}
			})
		})
	}
}

// streamingRunner streams deltas and steps in a loop until its turn is
// stopped, signalling started after its first delta.
func streamingRunner(started chan<- string) runner.Runner {
	return runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		first := true
		for ctx.Err() == nil {
			cb.StepStarted(event.StepTool, "shell")
			cb.Delta("x")
			if first {
				first = false
				started <- turn.RunID
			}
			cb.StepCompleted(event.StepTool, "shell")
		}
		return runner.Result{}, ctx.Err()
	})
}

// afterTerminal returns the first event of runID published after its
// terminal event (ForceFinalized aside), in the order subscribers saw them.
func afterTerminal(s *sink, runID string) (event.Event, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ended := false
	for _, ev := range s.events {
		switch {
		case ev.RunID != runID || ev.Kind == event.ForceFinalized:
		case ended:
			return ev, true
		case ev.Kind.Terminal():
			ended = true
		}
	}
	return event.Event{}, false
}

// TestNoEventAfterTheTerminalEvent (issue 20, defect 2): a runner streams
// deltas and steps in a loop while /stop aborts its turn. A delta or step
// that passed its liveness check before the abort must not reach
// subscribers after Aborted: the terminal event is the run's last. On main
// one of the first few dozen rounds shows a late event.
func TestNoEventAfterTheTerminalEvent(t *testing.T) {
	const rounds = 100
	started := make(chan string, 1)
	e, s := startEngine(t, testConfig(t, func(c *config.Config) { c.Agents.Defaults.Runner = config.RunnerDemo }),
		map[string]runner.Runner{config.RunnerDemo: streamingRunner(started)})
	for i := range rounds {
		id := fmt.Sprintf("r%d", i)
		key := fmt.Sprintf("chat%d", i)
		if _, err := e.Send(context.Background(), SendRequest{SessionKey: key, Channel: "ws", RunID: id, Text: "go"}); err != nil {
			t.Fatal(err)
		}
		<-started
		if res, err := e.Abort(context.Background(), key, "", event.ReasonUser, "", true); err != nil || !res.Aborted {
			t.Fatalf("round %d: abort %+v, %v", i, res, err)
		}
		if _, ok := e.Wait(context.Background(), id); !ok {
			t.Fatalf("round %d: no outcome", i)
		}
		if ev, late := afterTerminal(s, id); late {
			t.Fatalf("round %d: %s (seq %d) published after the turn's terminal event", i, ev.Kind, ev.Seq)
		}
	}
}

// TestResetDuringATurnKeepsItsReplyOut (issue 20, defect 4): /new while a
// turn runs starts a fresh conversation; the old turn's reply, when it
// comes, belongs to the old one: it is not in the new history, and the next
// turn's runner does not receive it.
func TestResetDuringATurnKeepsItsReplyOut(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var heard [][]runner.Message // the history each turn's runner received
	rn := runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		mu.Lock()
		heard = append(heard, turn.History)
		mu.Unlock()
		if turn.Message == "old question" {
			<-release
		}
		return runner.Result{Text: "reply to " + turn.Message}, nil
	})
	e, _ := startEngine(t, testConfig(t, func(c *config.Config) { c.Agents.Defaults.Runner = config.RunnerDemo }),
		map[string]runner.Runner{config.RunnerDemo: rn})
	ctx := context.Background()
	if _, err := e.Send(ctx, SendRequest{SessionKey: "chat1", Channel: "ws", RunID: "r1", Text: "old question"}); err != nil {
		t.Fatal(err)
	}
	e.Reset("chat1")
	close(release)
	if out, ok := e.Wait(ctx, "r1"); !ok || out.Text != "reply to old question" {
		t.Fatalf("old turn's outcome %+v", out)
	}
	if _, h, _ := e.History(ctx, "chat1", 0); len(h) != 0 {
		t.Fatalf("history after /new holds the old turn's ending: %+v", h)
	}
	if _, err := e.Send(ctx, SendRequest{SessionKey: "chat1", Channel: "ws", RunID: "r2", Text: "new question"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.Wait(ctx, "r2"); !ok {
		t.Fatal("no outcome for r2")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(heard) != 2 || len(heard[1]) != 0 {
		t.Fatalf("the new conversation's first turn received history %+v, want none", heard[len(heard)-1])
	}
}

// The model-based test of a session's turn lifecycle (issue 20): rapid
// draws random interleavings of what users, runners and the clock do —
// send, /stop, /new, runner pause/resume, questions asked and answered,
// deltas, steps, returns (ok, error, or ignoring cancellation) and time
// passing past each deadline — runs each under testing/synctest, and after
// every step checks the invariants below against a small model of what the
// runners were told to do. A failure shrinks to a minimal interleaving.
// The budget is rapid's default (100 interleavings; -rapid.checks=N for a
// longer run).

// modelSessions are the sessions the model test uses.
var modelSessions = []string{"a", "b"}

// modelRun is one interleaving: the engine, the puppet, what the bus showed
// and the model's own state.
type modelRun struct {
	e    *Engine
	p    *ModelPuppet
	sink *sink
	gen  map[string]int // conversation generation by session (bumped by /new)
	sent int
}

func newModelRun(t *rapid.T) *modelRun {
	c := ModelConfig(2)
	c.Agents.Defaults.ApprovalTimeoutSeconds = secs(10)
	c.Agents.Defaults.Busy.Mode = rapid.SampledFrom([]string{config.BusyQueue, config.BusyCollect, config.BusySteer,
		config.BusyInterrupt, config.BusyReject}).Draw(t, "busy")
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	p := NewModelPuppet(rapid.Bool().Draw(t, "steers"))
	e, err := New(Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{config.RunnerDemo: p}})
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	s := &sink{start: time.Now()}
	e.Bus().Subscribe("", s.handle)
	return &modelRun{e: e, p: p, sink: s, gen: map[string]int{}}
}

// active returns the puppet turn running session key's active run, if any.
func (m *modelRun) active(key string) (string, *ModelTurn) { return m.p.Active(m.e, key) }

// tell has session key's running runner do f (no-op when none runs).
func (m *modelRun) tell(key string, f func(pt *ModelTurn, cb runner.Callbacks)) {
	if _, pt := m.active(key); pt != nil {
		pt.cmds <- func(cb runner.Callbacks) { f(pt, cb) }
	}
}

// step does one drawn action.
func (m *modelRun) step(t *rapid.T) string {
	ctx := context.Background()
	key := rapid.SampledFrom(modelSessions).Draw(t, "session")
	action := rapid.SampledFrom([]string{"send", "send", "stop", "new", "pause", "resume", "ask", "answer",
		"delta", "stepStart", "stepDone", "return", "fail", "ignoreCancel", "take", "elapse", "elapse"}).Draw(t, "action")
	switch action {
	case "send":
		m.sent++
		text := fmt.Sprintf("m%d g%d", m.sent, m.gen[key])
		_, _ = m.e.Send(ctx, SendRequest{SessionKey: key, Channel: "ws", RunID: fmt.Sprintf("r%d", m.sent), Text: text})
	case "stop":
		_, _ = m.e.Stop(ctx, key, "", true)
	case "new":
		m.e.Reset(key)
		m.gen[key]++
	case "pause":
		m.tell(key, func(pt *ModelTurn, cb runner.Callbacks) {
			m.p.mu.Lock()
			pt.paused = true
			m.p.mu.Unlock()
			cb.Pause("model")
		})
	case "resume":
		m.tell(key, func(pt *ModelTurn, cb runner.Callbacks) {
			m.p.mu.Lock()
			pt.paused = false
			m.p.mu.Unlock()
			cb.Resume()
		})
	case "ask":
		m.tell(key, func(pt *ModelTurn, _ runner.Callbacks) { pt.ask(m.p) })
	case "answer":
		if open := m.e.PendingApprovals(key); len(open) > 0 {
			_, _ = m.e.Resolve(ctx, ResolveRequest{ApprovalID: open[0].ID, OptionID: "yes", SessionKey: key, By: "model"})
		}
	case "take":
		m.tell(key, func(pt *ModelTurn, _ runner.Callbacks) {
			if pt.turn.Inbox != nil {
				texts := pt.turn.Inbox.Take()
				m.p.mu.Lock()
				m.p.taken[pt.turn.RunID] = append(m.p.taken[pt.turn.RunID], texts...)
				m.p.mu.Unlock()
			}
		})
	case "delta", "stepStart", "stepDone", "return", "fail", "ignoreCancel":
		if _, pt := m.active(key); pt != nil {
			m.p.Do(pt, action)
		}
	case "elapse":
		return ModelElapse(t, 200*time.Millisecond, time.Second, 2500*time.Millisecond, 11*time.Second)
	}
	return action + " " + key
}

// check returns the first invariant that does not hold, "" if all do.
func (m *modelRun) check() string {
	// One terminal event per turn, and it is the turn's last (ForceFinalized aside).
	m.sink.mu.Lock()
	order := TerminalOrder{}
	for _, ev := range m.sink.events {
		if v := order.See("the engine", ev); v != "" {
			m.sink.mu.Unlock()
			return v
		}
	}
	m.sink.mu.Unlock()
	if n := m.e.illegalMoves.Load(); n != 0 {
		return fmt.Sprintf("%d turn state moves out of the lifecycle's order", n)
	}
	for _, key := range modelSessions {
		id, pt := m.active(key)
		// No session busy with no live run: its active run's runner runs.
		if id != "" && pt == nil {
			return fmt.Sprintf("session %s is busy with run %s, whose runner returned", key, id)
		}
		// A free session does not keep messages waiting.
		if id == "" && len(m.e.Status(key).Queue) > 0 {
			return fmt.Sprintf("session %s is free with %d messages waiting", key, len(m.e.Status(key).Queue))
		}
		// The liveness clock runs iff the runner is not paused and no question is open.
		if pt != nil {
			m.p.mu.Lock()
			want := pt.paused || pt.asking > 0
			m.p.mu.Unlock()
			for _, snap := range m.e.Live() {
				if snap.RunID == id && snap.Paused != want {
					return fmt.Sprintf("run %s: liveness clock paused=%v, want %v (runner paused, or a question open)", id, snap.Paused, want)
				}
			}
		}
	}
	// Nothing from before /new reaches a later turn's runner.
	m.p.mu.Lock()
	defer m.p.mu.Unlock()
	for _, turn := range m.p.heard {
		gen := turn.Message[strings.LastIndex(turn.Message, " "):]
		for _, h := range turn.History {
			if !strings.HasSuffix(h.Text, gen) {
				return fmt.Sprintf("run %s (%q) received %q from another conversation", turn.RunID, turn.Message, h.Text)
			}
		}
		for _, text := range m.p.taken[turn.RunID] {
			if !strings.HasSuffix(text, gen) {
				return fmt.Sprintf("run %s (%q) took steered %q from another conversation", turn.RunID, turn.Message, text)
			}
		}
	}
	return ""
}

func TestLifecycleModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rapid.SyncTest(t, func(t *rapid.T) {
			m := newModelRun(t)
			trail, violation := RunModel(t, 60, m.step, m.check)
			m.p.Quit()
			m.e.Shutdown(context.Background())
			if violation != "" {
				t.Fatalf("%s\nafter: %s\ntranscript:\n%s", violation, strings.Join(trail, ", "), m.sink.transcript())
			}
		})
	})
}

// TestTurnStartsWithTheConfigInForceAfterTheHistoryWait (issue 20,
// suspected: "Send reads the config before waiting up to 10 s for history
// or a claim"): a hot reload while Send waits for the session's stored
// history applies to the turn it then starts. Real time: the reload
// watches a real file.
func TestTurnStartsWithTheConfigInForceAfterTheHistoryWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "turnguard.yaml")
	write := func(step int) {
		if err := os.WriteFile(path, fmt.Appendf(nil, "agents:\n  defaults:\n    stepTimeoutSeconds: %d\n", step), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(2)
	c, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	src := config.NewSource(c)
	loading, release := make(chan struct{}), make(chan struct{})
	e, s := startEngineWith(t, Options{Config: src, Runners: map[string]runner.Runner{config.RunnerDemo: demo.New()},
		History: func(ctx context.Context, key string, limit int) ([]Message, error) {
			close(loading)
			<-release
			return nil, nil
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // real time: a real file is watched
	defer cancel()
	watching, changed := make(chan struct{}), make(chan struct{}, 1)
	go func() {
		_ = src.Watch(ctx, path, nil, config.ReloadHooks{Watching: func() { close(watching) },
			Changed: func(_, next *config.Config) {
				if next.Agents.Defaults.StepTimeoutSeconds != nil && *next.Agents.Defaults.StepTimeoutSeconds == 7 {
					changed <- struct{}{}
				}
			}})
	}()
	<-watching
	sent := make(chan error, 1)
	go func() {
		_, err := e.Send(ctx, SendRequest{SessionKey: "k", Channel: "ws", RunID: "r1", Text: "/steps say:hi"})
		sent <- err
	}()
	<-loading
	write(7)
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("the configuration was not reloaded")
	}
	close(release)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	e.Wait(ctx, "r1")
	for _, ev := range eventsOf(s, event.TurnStarted) {
		if ev.StepTimeout != 7*time.Second {
			t.Fatalf("the turn started with step timeout %v, want the reloaded 7s", ev.StepTimeout)
		}
		return
	}
	t.Fatal("no TurnStarted")
}
