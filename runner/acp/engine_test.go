package acp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/runner"
)

func secs(v float64) *float64 { return &v }

// TestEngineStepTimeoutNamesTheTool: the real engine with the acp runner
// and the Node agent. A tool call that never completes is stopped by the
// step timeout, and what the user reads names the tool; the agent honours
// the session/cancel, so the conversation goes on in the same session.
func TestEngineStepTimeoutNamesTheTool(t *testing.T) {
	turn := engineTurns(t)
	if ev := turn("r1", "remember the engine"); ev.Kind != event.Finished || ev.FullText != "OK, I will remember the engine." {
		t.Fatalf("first turn: %s %q %q", ev.Kind, ev.FullText, ev.Message)
	}
	ev := turn("r2", "tool hang")
	if ev.Kind != event.Aborted || ev.StopReason != event.ReasonStepTimeout {
		t.Fatalf("tool hang ended %s %s %q, want aborted step_timeout", ev.Kind, ev.StopReason, ev.Message)
	}
	if !strings.Contains(ev.Message, "Run slow_tool never finished") {
		t.Errorf("the user reads %q, which does not name the tool", ev.Message)
	}
	if ev := turn("r3", "what did I say"); ev.Kind != event.Finished || ev.FullText != "You said: the engine" {
		t.Errorf("after the step timeout: %s %q %q, want the same session", ev.Kind, ev.FullText, ev.Message)
	}
}

// engineTurns runs the real engine with the acp runner on the Node agent
// (the agent process already started; stepTimeoutSeconds 3, as a real Node
// process on a loaded two-core CI machine has taken over a second to answer
// a prompt) and returns a function that sends one message on session key
// "main" and returns the event that ended its turn.
func engineTurns(t *testing.T) func(runID, text string) event.Event {
	t.Helper()
	node, args := nodeAgent(t)
	c := config.Default()
	c.Agents.Defaults.Runner = config.RunnerACP
	c.Agents.ACP = config.ACP{Command: node, Args: args, Workdir: t.TempDir(), IdleSeconds: 60, StartTimeoutSeconds: 20}
	c.Agents.Defaults.StepTimeoutSeconds = secs(3)
	c.Agents.Defaults.TimeoutSeconds = secs(30)
	c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(0)
	c.Agents.Defaults.AbortGraceSeconds = secs(2)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	r, _, _ := build(t, c.Agents.ACP, 2*time.Second)
	// Start the agent process before the engine's first turn: its start-up
	// (Node) is bounded by startTimeoutSeconds, not by this test's 3s step
	// timeout.
	mustSay(t, r, (&conv{key: "warm-up", id: "warm-up"}).turn("pid"))
	e, err := gateway.New(gateway.Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{config.RunnerACP: r}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.Start(ctx)
	ends := make(chan event.Event, 16)
	unsub := e.Bus().Subscribe("", func(ev event.Event) {
		if ev.Kind == event.Finished || ev.Kind == event.Aborted {
			ends <- ev
		}
	})
	t.Cleanup(func() {
		e.Shutdown(context.Background())
		unsub()
		cancel()
	})
	return func(runID, text string) event.Event {
		t.Helper()
		if _, err := e.Send(context.Background(), gateway.SendRequest{SessionKey: "main", Channel: "ws", RunID: runID, Text: text}); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-ends:
			return ev
		case <-time.After(20 * time.Second):
			t.Fatalf("turn %q never ended", text)
			return event.Event{}
		}
	}

}
