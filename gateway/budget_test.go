package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
	"github.com/turnguard/turnguard/runner/openai"

	"github.com/turnguard/turnguard/internal/faketime"
)

// budget sets a 10 s wall clock with no liveness window and no progress
// notices, and the budget warning ratio (nil: the default 0.8).
func budget(ratio *float64) func(*config.Config) {
	return func(c *config.Config) {
		c.Agents.Defaults.TimeoutSeconds = secs(10)
		c.Agents.Defaults.StepTimeoutSeconds = secs(0)
		c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(0)
		c.Agents.Defaults.AbortGraceSeconds = secs(2)
		c.Agents.Defaults.BudgetWarningRatio = ratio
	}
}

// TestBudgetWarningReachesTheRunnerAndThePerson: at exactly 80 % of the
// wall clock one BudgetWarning is published, in words for the person and
// with the note the runner took; the demo runner takes the note before its
// next step, wraps up and finishes before the stop.
func TestBudgetWarningReachesTheRunnerAndThePerson(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, budget(nil))
		v.send(t, "r1", "/steps build:9s deploy:hang say:Built")
		out, _ := v.e.Wait(context.Background(), "r1")
		synctest.Wait()
		note := demo.WrapUpPrefix + "Note from the gateway: 2 s left before this turn is stopped. " +
			"Wrap up now: start no new long task and give your best answer with what you have."
		if out.Status != StatusOK || out.Text != note+" Built" {
			t.Fatalf("outcome %+v, want the demo's wrap-up", out)
		}
		want := `0s turn_started
0s step_started build
8s budget_warning
9s step_completed build
9s finished stop "` + note + ` Built"`
		if got := v.sink.transcript(); got != want {
			t.Fatalf("transcript:\n%s\nwant:\n%s", got, want)
		}
		var warnings []event.Event
		for _, ev := range v.sink.events {
			if ev.Kind == event.BudgetWarning {
				warnings = append(warnings, ev)
			}
		}
		if len(warnings) != 1 {
			t.Fatalf("%d warnings, want 1", len(warnings))
		}
		w := warnings[0]
		if w.Message != "⏳ Your request will be stopped in 2 s unless it finishes." || w.Limit != 2*time.Second ||
			!strings.HasPrefix(w.Text, "Note from the gateway: 2 s left") {
			t.Errorf("warning: message %q, left %v, runner's note %q", w.Message, w.Limit, w.Text)
		}
	})
}

// TestNoBudgetWarningWhenOffOrDoneFirst: ratio 0 warns of nothing (the turn
// is stopped at its wall clock without a word before), and a turn that
// finishes before 80 % is never warned.
func TestNoBudgetWarningWhenOffOrDoneFirst(t *testing.T) {
	for _, tt := range []struct {
		name   string
		ratio  *float64
		script string
		want   string
	}{
		{"ratio 0", secs(0), "/steps build:hang", "0s turn_started\n0s step_started build\n10s aborted timeout " +
			`"⚠️ This request was stopped at its time limit of 10 s while build was running. Try again, or ask for something smaller."`},
		{"done first", nil, "/steps build:7s say:Built", "0s turn_started\n0s step_started build\n7s step_completed build\n" +
			`7s finished stop "Built"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				v := newEnv(t, budget(tt.ratio))
				v.send(t, "r1", tt.script)
				v.e.Wait(context.Background(), "r1")
				faketime.Advance(time.Minute) // past where a warning could be due
				synctest.Wait()
				if got := v.sink.transcript(); got != tt.want {
					t.Fatalf("transcript:\n%s\nwant:\n%s", got, tt.want)
				}
			})
		})
	}
}

// roundTrip is an in-memory http.RoundTripper: no sockets, so it runs in
// a synctest bubble.
type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// sse is a Chat Completions stream of the given chunks' JSON.
func sse(chunks ...string) *http.Response {
	var b strings.Builder
	for _, c := range chunks {
		b.WriteString("data: " + c + "\n\n")
	}
	b.WriteString("data: [DONE]\n\n")
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(strings.NewReader(b.String()))}
}

// TestBudgetWarningReachesTheModel: the openai runner gets the gateway's
// note before its next model call, as a system message: a first call that
// takes 9 s of a 10 s wall clock (a tool call) is followed by a call that
// carries "2 s left, wrap up".
func TestBudgetWarningReachesTheModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu    sync.Mutex
			calls [][]map[string]any
		)
		transport := roundTrip(func(r *http.Request) (*http.Response, error) {
			var body struct {
				Messages []map[string]any `json:"messages"`
			}
			if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
				return nil, err
			}
			mu.Lock()
			calls = append(calls, body.Messages)
			n := len(calls)
			mu.Unlock()
			if n == 1 {
				time.Sleep(9 * time.Second) // real time: no — inside the synctest bubble: the model thinks for 9 s of fake time
				return sse(`{"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"current_time","arguments":"{}"}}]},"finish_reason":null}]}`,
					`{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`), nil
			}
			return sse(`{"id":"c2","choices":[{"index":0,"delta":{"role":"assistant","content":"Done."},"finish_reason":null}]}`,
				`{"id":"c2","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`), nil
		})
		c := testConfig(t, func(c *config.Config) {
			budget(nil)(c)
			c.Agents.Defaults.Runner = config.RunnerOpenAI
			c.Agents.OpenAI.BaseURL = "http://llm.test/v1"
			c.Agents.OpenAI.Model = "fake-model"
			c.Agents.OpenAI.Tools.CurrentTime = true
		})
		rn, err := openai.New(c.Agents.OpenAI, openai.WithHTTPClient(&http.Client{Transport: transport}))
		if err != nil {
			t.Fatal(err)
		}
		e, _ := startEngine(t, c, map[string]runner.Runner{config.RunnerOpenAI: rn})
		if _, err := e.Send(context.Background(), SendRequest{SessionKey: "s", Channel: "ws", RunID: "r1", Text: "what time is it?"}); err != nil {
			t.Fatal(err)
		}
		out, _ := e.Wait(context.Background(), "r1")
		if out.Status != StatusOK || out.Text != "Done." {
			t.Fatalf("outcome %+v", out)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(calls) != 2 {
			t.Fatalf("%d model calls, want 2", len(calls))
		}
		last := calls[1][len(calls[1])-1]
		if text, _ := last["content"].(string); last["role"] != "system" || !strings.HasPrefix(text, "Note from the gateway: 2 s left before this turn is stopped.") {
			t.Errorf("the second call ends with %v, want the gateway's note as a system message", last)
		}
	})
}
