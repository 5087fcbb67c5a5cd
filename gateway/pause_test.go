package gateway

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/exec"
)

// scriptOp is one thing a scripted runner does after waiting wait.
type scriptOp struct {
	wait time.Duration
	do   func(cb runner.Callbacks)
}

// scriptRunner does ops in order (waiting on the bubble's clock) and then
// hangs until its turn is aborted, as a tool stuck after a human's answer
// would. It speaks the same Callbacks the exec runner's jsonl parser calls
// for step_start, step_complete, heartbeat, pause and resume; it exists
// because a real process cannot run in a synctest bubble (a goroutine
// reading a pipe from a child is not durably blocked, so fake time would
// never advance). TestExecAgentPauseInsideStepThenHang is the same story
// with the real exec runner and a real process, in real time.
func scriptRunner(ops ...scriptOp) runner.Runner {
	return runner.Func(func(ctx context.Context, _ runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		for _, op := range ops {
			select {
			case <-ctx.Done():
				return runner.Result{}, ctx.Err()
			case <-time.After(op.wait):
			}
			op.do(cb)
		}
		<-ctx.Done()
		return runner.Result{}, ctx.Err()
	})
}

func stepStart(name string) func(runner.Callbacks) {
	return func(cb runner.Callbacks) { cb.StepStarted(event.StepTool, name) }
}
func stepDone(name string) func(runner.Callbacks) {
	return func(cb runner.Callbacks) { cb.StepCompleted(event.StepTool, name) }
}
func pause(cb runner.Callbacks)     { cb.Pause("waiting for approval") }
func resume(cb runner.Callbacks)    { cb.Resume() }
func heartbeat(cb runner.Callbacks) { cb.Heartbeat() }

// pauseEnv starts an engine whose turns run rn, with stepTimeoutSeconds: 2
// and timeoutSeconds: 40 (the numbers of the report in issue 9).
func pauseEnv(t *testing.T, rn runner.Runner) (*Engine, *sink) {
	t.Helper()
	c := config.Default()
	c.Agents.Defaults.Runner = config.RunnerDemo // the slot the scripted runner takes
	c.Agents.Defaults.StepTimeoutSeconds = secs(2)
	c.Agents.Defaults.TimeoutSeconds = secs(40)
	c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(0)
	c.Agents.Defaults.AbortGraceSeconds = secs(2)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return startEngine(t, c, map[string]runner.Runner{config.RunnerDemo: rn})
}

// TestStepTimeoutAfterPauseCountsFromResume: a runner that pauses inside a
// step (a tool waiting for a human) and hangs after the resume is stopped
// for its step timeout when the liveness window runs out after the resume —
// not at the 40s wall clock. Liveness resets that only move the deadline
// later (a heartbeat, a completion) never move it earlier than what the
// user was promised.
func TestStepTimeoutAfterPauseCountsFromResume(t *testing.T) {
	const stuckAsk = "⚠️ No progress for 2 s — ask_human never finished. The task may be stuck. Retry or ask for a simpler approach."
	const stuckAfterAsk = "⚠️ No progress for 2 s — last action was ask_human. The task may be stuck. Retry or ask for a simpler approach."
	for _, tc := range []struct {
		name string
		ops  []scriptOp
		want string // the aborted line of the transcript
	}{{
		// Paused at once, resumed at 10s: the whole 2s window is left.
		name: "paused at step start",
		ops:  []scriptOp{{0, stepStart("ask_human")}, {0, pause}, {10 * time.Second, resume}},
		want: `12s aborted step_timeout "` + stuckAsk + `"`,
	}, {
		// 1.5s of the window used before the pause: 0.5s left at the resume.
		name: "paused inside the window",
		ops: []scriptOp{{0, stepStart("ask_human")}, {1500 * time.Millisecond, pause},
			{10 * time.Second, resume}},
		want: `12s aborted step_timeout "` + stuckAsk + `"`,
	}, {
		// The step completes while paused: progress during the pause, so the
		// window restarts at the resume (12s), never later.
		name: "step completed while paused",
		ops: []scriptOp{{0, stepStart("ask_human")}, {0, pause}, {5 * time.Second, stepDone("ask_human")},
			{5 * time.Second, resume}},
		want: `12s aborted step_timeout "` + stuckAfterAsk + `"`,
	}, {
		// The same, then a heartbeat 1s after the resume: the window restarts
		// at the heartbeat (13s), and the scheduler must not sleep past it.
		name: "heartbeat after a pause with a completion",
		ops: []scriptOp{{0, stepStart("ask_human")}, {0, pause}, {5 * time.Second, stepDone("ask_human")},
			{5 * time.Second, resume}, {time.Second, heartbeat}},
		want: `13s aborted step_timeout "` + stuckAfterAsk + `"`,
	}, {
		// Paused twice inside one step: the windows add up over both resumes.
		name: "two pauses",
		ops: []scriptOp{{0, stepStart("ask_human")}, {time.Second, pause}, {5 * time.Second, resume},
			{500 * time.Millisecond, pause}, {5 * time.Second, resume}},
		want: `12s aborted step_timeout "` + stuckAsk + `"`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e, s := pauseEnv(t, scriptRunner(tc.ops...))
				if _, err := e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: "r1",
					Text: "deploy after approval", Owner: "conn1"}); err != nil {
					t.Fatal(err)
				}
				out, ok := e.Wait(context.Background(), "r1")
				if !ok {
					t.Fatal("no outcome")
				}
				synctest.Wait()
				if got := abortedLine(s); got != tc.want {
					t.Fatalf("aborted line:\n got  %s\n want %s\ntranscript:\n%s", got, tc.want, s.transcript())
				}
				if out.StopReason != event.ReasonStepTimeout {
					t.Fatalf("outcome %+v", out)
				}
			})
		})
	}
}

func abortedLine(s *sink) string {
	for _, l := range strings.Split(s.transcript(), "\n") {
		if _, rest, _ := strings.Cut(l, " "); strings.HasPrefix(rest, "aborted ") {
			return l
		}
	}
	return ""
}

// TestExecAgentPauseInsideStepThenHang is the report of issue 9 with the
// real exec runner and a real process speaking jsonl: step_start, pause,
// resume after 1s, then silence. The step timeout (1s here) must fire about
// 1s after the resume, not at the 40s wall clock. A real process cannot run
// in a synctest bubble, so this waits in real time, bounded; the precise
// timings are checked under synctest by TestStepTimeoutAfterPauseCountsFromResume.
func TestExecAgentPauseInsideStepThenHang(t *testing.T) {
	script, err := filepath.Abs("testdata/pause_in_step_then_hang.sh")
	if err != nil {
		t.Fatal(err)
	}
	c := config.Default()
	c.Agents.Defaults.Runner = config.RunnerExec
	c.Agents.Defaults.StepTimeoutSeconds = secs(1)
	c.Agents.Defaults.TimeoutSeconds = secs(40)
	c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(0)
	c.Agents.Defaults.AbortGraceSeconds = secs(1)
	c.Agents.Exec = config.Exec{Command: script, Format: exec.FormatJSONL, Env: map[string]string{"PAUSE_SECONDS": "1"}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	rn, err := exec.New(c.Agents.Exec, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, s := startEngine(t, c, map[string]runner.Runner{config.RunnerExec: rn})

	if _, err := e.Send(context.Background(), SendRequest{SessionKey: "s", Channel: "ws", RunID: "r", Text: "deploy"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second) // real time: a real process runs the turn
	defer cancel()
	out, ok := e.Wait(ctx, "r")
	if !ok {
		t.Fatalf("no outcome within 15s (the step timeout is 1s after the resume); transcript:\n%s", s.transcript())
	}
	if out.StopReason != event.ReasonStepTimeout || !strings.Contains(out.Message, "ask_human never finished") {
		t.Fatalf("outcome %+v, want a step timeout naming ask_human", out)
	}
	var started, paused, resumed, aborted time.Time
	s.mu.Lock()
	for _, ev := range s.events {
		switch ev.Kind {
		case event.StepStarted:
			started = ev.Time
		case event.Paused:
			paused = ev.Time
		case event.Resumed:
			resumed = ev.Time
		case event.Aborted:
			aborted = ev.Time
		}
	}
	s.mu.Unlock()
	if started.IsZero() || paused.IsZero() || resumed.IsZero() || aborted.IsZero() {
		t.Fatalf("a step_started, paused, resumed or aborted event is missing; transcript:\n%s", s.transcript())
	}
	// The deadline is 1s after the resume, less the part of the window used
	// before the pause; allow a loaded machine some lateness, far below the
	// 39s the wall clock would add.
	used := paused.Sub(started)
	if d := aborted.Sub(resumed); d < time.Second-used-100*time.Millisecond || d > 5*time.Second {
		t.Fatalf("aborted %v after the resume (%v of the window used before the pause), want ≈1s", d, used)
	}
}
