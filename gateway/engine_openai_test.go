package gateway

import (
	"context"
	"fmt"
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
	defer e.Shutdown(context.Background())

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
