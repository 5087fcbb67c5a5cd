package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/openai"
)

// startOpenAI starts an engine whose runner is the real openai runner of c;
// it is shut down when the test ends.
func startOpenAI(t *testing.T, c *config.Config) *Engine {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	rn, err := openai.New(c.Agents.OpenAI)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{config.RunnerOpenAI: rn}})
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	t.Cleanup(func() { e.Shutdown(context.Background()) })
	return e
}

// TestSlowToolOfRealRunnerHitsStepTimeout runs the real openai runner
// against a fake OpenAI-compatible server whose model calls a command tool
// that never finishes (a real `sleep` process): the step timeout fires and
// the user's message names the tool. Real processes and sockets do not run
// in a synctest bubble, so this waits (bounded) for the engine's outcome.
func TestSlowToolOfRealRunnerHitsStepTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"slow_lookup","arguments":"{}"}}]},"finish_reason":null}]}`+"\n\n")
		fmt.Fprint(w, `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()

	c := config.Default()
	c.Agents.Defaults.Runner = config.RunnerOpenAI
	c.Agents.Defaults.StepTimeoutSeconds = secs(1)
	c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(0)
	c.Agents.Defaults.AbortGraceSeconds = secs(5)
	c.Agents.OpenAI.BaseURL = srv.URL
	c.Agents.OpenAI.Model = "fake-model"
	c.Agents.OpenAI.Tools.Commands = []config.CommandTool{{
		Name: "slow_lookup", Description: "looks something up, slowly", Argv: []string{"sleep", "30"},
		TimeoutSeconds: 60,
	}}
	e := startOpenAI(t, c)

	if _, err := e.Send(context.Background(), SendRequest{SessionKey: "s", Channel: "ws", RunID: "r", Text: "look it up"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, ok := e.Wait(ctx, "r")
	if !ok {
		t.Fatal("no outcome within 20s")
	}
	if out.StopReason != event.ReasonStepTimeout || !strings.Contains(out.Message, "slow_lookup never finished") {
		t.Fatalf("outcome %+v, want a step timeout naming slow_lookup", out)
	}
	if !strings.Contains(out.Message, "last completed: the model") {
		t.Errorf("message %q does not name the completed LLM step as the model", out.Message)
	}
}

// TestProviderFallbackWhatTheUserSees runs the real openai runner against
// two real OpenAI-compatible servers on loopback: the main one hangs
// without a byte, the fallback answers. The turn finishes with the
// fallback's reply after one "switched to" notice, and the bus carries
// the Fallback event the trace and the journal record. Real sockets do not
// run in a synctest bubble, so the idle timeout is short and real.
func TestProviderFallbackWhatTheUserSees(t *testing.T) {
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // then the server notices the client going away
		<-r.Context().Done()
	}))
	defer hang.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"content":"Paris is at UTC+1."},"finish_reason":"stop"}]}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer backup.Close()

	c := config.Default()
	c.Agents.Defaults.Runner = config.RunnerOpenAI
	c.Agents.Defaults.StepTimeoutSeconds = secs(10)
	c.Agents.OpenAI.BaseURL = hang.URL + "/v1"
	c.Agents.OpenAI.Model = "main-model"
	c.Agents.OpenAI.LLMIdleTimeoutSeconds = 0.3
	c.Agents.OpenAI.Fallbacks = []config.OpenAIFallback{{BaseURL: backup.URL + "/v1", APIKey: "sk-backup-secret", Model: "backup-model"}}
	e := startOpenAI(t, c)
	fell := make(chan event.Event, 4)
	defer e.Bus().Subscribe("", func(ev event.Event) {
		if ev.Kind == event.Fallback {
			fell <- ev
		}
	})()

	if _, err := e.Send(context.Background(), SendRequest{SessionKey: "s", Channel: "ws", RunID: "r", Text: "time in Paris?"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, ok := e.Wait(ctx, "r")
	if !ok {
		t.Fatal("no outcome within 20s")
	}
	want := "↪️ The model `main-model` did not answer in time; switched to `backup-model`.\n\nParis is at UTC+1."
	if out.Status != StatusOK || out.Text != want {
		t.Fatalf("outcome %+v, want the reply %q", out, want)
	}
	select {
	case ev := <-fell:
		if ev.Step.Name != "main-model" || ev.Text != "backup-model" || ev.RunID != "r" {
			t.Errorf("fallback event step %+v to %q run %q", ev.Step, ev.Text, ev.RunID)
		}
	default:
		t.Error("no Fallback event on the bus")
	}
	if len(fell) != 0 {
		t.Errorf("%d more Fallback events, want one", len(fell))
	}
}
