package gateway

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
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
