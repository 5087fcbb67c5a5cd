package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner"

	"github.com/turnguard/turnguard/internal/faketime"
)

var turn = runner.Turn{RunID: "run-1", SessionKey: "s", Channel: "ws", Message: "What time is it in Paris?"}

func TestTwoToolConversation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := newFake(t,
			stream( // text, then two tool calls with chunked arguments
				textChunk("Let me check."),
				toolStartChunk(0, "call_a", "current_time"),
				toolArgsChunk(0, `{"timezone":`),
				toolArgsChunk(0, `"UTC"}`),
				toolStartChunk(1, "call_b", "echo_args"),
				toolArgsChunk(1, `{"ci`),
				toolArgsChunk(1, `ty": "Par`),
				toolArgsChunk(1, `is"}`),
				finishChunk("tool_calls"),
			),
			answer("It is ", "midnight."),
		)
		r, _ := newTestRunner(t, config.OpenAI{
			SystemPrompt: "Be brief.",
			Tools: config.OpenAITools{CurrentTime: true, Commands: []config.CommandTool{{
				Name: "echo_args", Description: "Echoes its arguments.", Argv: []string{"cat"},
				Parameters: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
			}}},
		}, fake)
		rec := newRecorder()
		res, err := r.Run(t.Context(), turn, rec)
		if err != nil {
			t.Fatal(err)
		}
		wantEvents := []string{
			"start llm test-model", `delta "Let me check."`, "done llm test-model",
			"start tool current_time", "done tool current_time",
			"start tool echo_args", "done tool echo_args",
			"start llm test-model", `delta "\n\nIt is "`, `delta "midnight."`, "done llm test-model",
		}
		if got := rec.events(); !slices.Equal(got, wantEvents) {
			t.Errorf("events:\n got %q\nwant %q", got, wantEvents)
		}
		if want := "Let me check.\n\nIt is midnight."; res.Text != want {
			t.Errorf("text = %q, want %q", res.Text, want)
		}

		reqs := fake.requests()
		if len(reqs) != 2 {
			t.Fatalf("%d requests, want 2", len(reqs))
		}
		var names []string
		for _, d := range reqs[0].body.Tools {
			names = append(names, d.Function.Name)
		}
		if !slices.Equal(names, []string{"current_time", "echo_args"}) {
			t.Errorf("tools offered: %q", names)
		}
		// The second call carries the reassembled tool calls and their results.
		msgs := reqs[1].body.Messages
		if len(msgs) != 5 {
			t.Fatalf("second request has %d messages, want 5: %+v", len(msgs), msgs)
		}
		am := msgs[2]
		if am.Role != "assistant" || am.Content == nil || *am.Content != "Let me check." || len(am.ToolCalls) != 2 {
			t.Fatalf("assistant message = %+v", am)
		}
		if c := am.ToolCalls[0]; c.ID != "call_a" || c.Function.Name != "current_time" || c.Function.Arguments != `{"timezone":"UTC"}` {
			t.Errorf("tool call 0 = %+v", c)
		}
		if c := am.ToolCalls[1]; c.ID != "call_b" || c.Function.Name != "echo_args" || c.Function.Arguments != `{"city": "Paris"}` {
			t.Errorf("tool call 1 = %+v", c)
		}
		// synctest's clock starts at 2000-01-01 00:00:00 UTC.
		if m := msgs[3]; m.Role != "tool" || m.ToolCallID != "call_a" || !strings.Contains(*m.Content, `"utc":"2000-01-01T00:00:00Z"`) {
			t.Errorf("current_time result = %+v %q", m, *m.Content)
		}
		if m := msgs[4]; m.Role != "tool" || m.ToolCallID != "call_b" || *m.Content != `{"city": "Paris"}` {
			t.Errorf("echo_args result = %+v %q", m, *m.Content)
		}
	})
}

// TestRealSSEOverTCP reads a stream from a real HTTP server: CRLF line
// endings, comments, events split across writes, an unrelated event field.
func TestRealSSEOverTCP(t *testing.T) {
	var got seenRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.auth = r.Header.Get("Authorization")
		if err := json.NewDecoder(r.Body).Decode(&got.body); err != nil {
			t.Errorf("request body: %v", err)
		}
		sseHeader(w)
		fl := w.(http.Flusher)
		parts := []string{
			": keep-alive\r\n\r\n",
			"event: message\r\ndata: " + textChunk("Bon") + "\r\n\r\n",
			"data: " + textChunk("jour")[:20], // an event split across two writes
			textChunk("jour")[20:] + "\n\n",
			"data: " + textChunk(" à ") + "\n\ndata: " + textChunk("vous") + "\n\n",
			"data: " + finishChunk("stop") + "\n\n",
			"data: [DONE]\n\n",
		}
		for _, p := range parts {
			fmt.Fprint(w, p)
			fl.Flush()
		}
	}))
	defer srv.Close()

	r, err := New(config.OpenAI{BaseURL: srv.URL + "/v1/", APIKey: "sk-test-123", Model: "gpt-test", SystemPrompt: "Be brief."})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	tr := turn
	tr.History = []runner.Message{{Role: "user", Text: "Hi"}, {Role: "assistant", Text: "Hello!"}}
	res, err := r.Run(t.Context(), tr, rec)
	if err != nil {
		t.Fatal(err)
	}
	if res.Text != "Bonjour à vous" {
		t.Errorf("text = %q", res.Text)
	}
	want := []string{"start llm gpt-test", `delta "Bon"`, `delta "jour"`, `delta " à "`, `delta "vous"`, "done llm gpt-test"}
	if ev := rec.events(); !slices.Equal(ev, want) {
		t.Errorf("events %q, want %q", ev, want)
	}
	if got.auth != "Bearer sk-test-123" {
		t.Errorf("Authorization = %q", got.auth)
	}
	b := got.body
	if b.Model != "gpt-test" || !b.Stream || b.Tools != nil {
		t.Errorf("request = model %q stream %v tools %v", b.Model, b.Stream, b.Tools)
	}
	var roles []string
	for _, m := range b.Messages {
		roles = append(roles, m.Role+":"+*m.Content)
	}
	wantRoles := []string{"system:Be brief.", "user:Hi", "assistant:Hello!", "user:What time is it in Paris?"}
	if !slices.Equal(roles, wantRoles) {
		t.Errorf("messages %q, want %q", roles, wantRoles)
	}
}

func TestNonStreamingAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := newFake(t, status(http.StatusOK, map[string]string{"Content-Type": "application/json"},
			`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Whole answer."},"finish_reason":"stop"}]}`))
		r, _ := newTestRunner(t, config.OpenAI{}, fake)
		rec := newRecorder()
		res, err := r.Run(t.Context(), turn, rec)
		if err != nil || res.Text != "Whole answer." {
			t.Fatalf("Run = %q, %v", res.Text, err)
		}
		if ev := rec.events(); !slices.Contains(ev, `delta "Whole answer."`) {
			t.Errorf("events %q", ev)
		}
	})
}

func TestIdleTimeout(t *testing.T) {
	const idle = 30 * time.Second
	tests := []struct {
		name     string
		handlers []http.HandlerFunc
		text     string
		cause    error  // nil = success
		userMsg  string // substring
		gaps     []time.Duration
		logMatch string
	}{{
		name:     "silent after headers, then retried",
		handlers: []http.HandlerFunc{stallAfter(), answer("ok")},
		text:     "ok",
		gaps:     []time.Duration{idle},
		logMatch: "model stream idle; retrying once",
	}, {
		name:     "silent before headers, then retried",
		handlers: []http.HandlerFunc{stallBeforeHeaders(), answer("ok")},
		text:     "ok",
		gaps:     []time.Duration{idle},
	}, {
		name:     "silent after a tool-call fragment, then retried",
		handlers: []http.HandlerFunc{stallAfter(toolStartChunk(0, "c", "current_time")), answer("ok")},
		text:     "ok",
		gaps:     []time.Duration{idle},
	}, {
		name:     "silent twice fails the turn",
		handlers: []http.HandlerFunc{stallAfter()},
		cause:    ErrIdleTimeout,
		userMsg:  "The model provider stopped responding (nothing for 30 s, twice).",
		gaps:     []time.Duration{idle},
	}, {
		name:     "silent after reply text is not retried",
		handlers: []http.HandlerFunc{stallAfter(textChunk("Hel"))},
		text:     "Hel",
		cause:    ErrIdleTimeout,
		userMsg:  "the reply is incomplete",
		gaps:     nil,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				fake := newFake(t, tt.handlers...)
				r, logs := newTestRunner(t, config.OpenAI{LLMIdleTimeoutSeconds: idle.Seconds(), Tools: config.OpenAITools{CurrentTime: true}}, fake)
				start := time.Now()
				res, err := r.Run(t.Context(), turn, runner.Nop{})
				if res.Text != tt.text {
					t.Errorf("text = %q, want %q", res.Text, tt.text)
				}
				if tt.cause == nil && err != nil {
					t.Fatalf("err = %v", err)
				}
				if tt.cause != nil {
					if !errors.Is(err, tt.cause) {
						t.Fatalf("err = %v, want %v", err, tt.cause)
					}
					if u, ok := runner.AsUserError(err); !ok || !strings.Contains(u.Message, tt.userMsg) {
						t.Errorf("user message = %v, want %q", err, tt.userMsg)
					}
					// It failed exactly when the last attempt's idle timer fired.
					if el, want := time.Since(start), idle*time.Duration(len(tt.gaps)+1); el != want {
						t.Errorf("failed after %v, want %v", el, want)
					}
				}
				if g := fake.gaps(); !slices.Equal(g, tt.gaps) {
					t.Errorf("request gaps %v, want %v", g, tt.gaps)
				}
				if !strings.Contains(logs.String(), tt.logMatch) {
					t.Errorf("log lacks %q:\n%s", tt.logMatch, logs)
				}
			})
		})
	}
}

// TestKeepAliveCommentsAreNotSilence: SSE comments every 20s keep a 30s
// idle timer from firing.
func TestKeepAliveCommentsAreNotSilence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := newFake(t, func(w http.ResponseWriter, r *http.Request) {
			sseHeader(w)
			for range 3 {
				faketime.Advance(20 * time.Second)
				fmt.Fprint(w, ": processing\n\n")
			}
			writeEvents(w, []string{textChunk("slow but alive"), finishChunk("stop"), "[DONE]"})
		})
		r, _ := newTestRunner(t, config.OpenAI{LLMIdleTimeoutSeconds: 30}, fake)
		res, err := r.Run(t.Context(), turn, runner.Nop{})
		if err != nil || res.Text != "slow but alive" {
			t.Fatalf("Run = %q, %v", res.Text, err)
		}
		if n := len(fake.requests()); n != 1 {
			t.Errorf("%d requests, want 1", n)
		}
	})
}

func TestIdleCircuitBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := newFake(t, stallAfter())
		r, _ := newTestRunner(t, config.OpenAI{LLMIdleTimeoutSeconds: 10}, fake)
		run := func() error {
			t.Helper()
			_, err := r.Run(t.Context(), turn, runner.Nop{})
			return err
		}
		// Turns 1 and 2: two silent attempts each (streak 4).
		// Turn 3: the 5th silent attempt opens the breaker: no retry.
		// Turn 4: one attempt only.
		wantReqs := []int{2, 2, 1, 1}
		wantErr := []error{ErrIdleTimeout, ErrIdleTimeout, ErrBreakerOpen, ErrBreakerOpen}
		for i := range wantReqs {
			fake.setHandlers(stallAfter())
			err := run()
			if !errors.Is(err, wantErr[i]) {
				t.Fatalf("turn %d: err = %v, want %v", i+1, err, wantErr[i])
			}
			if n := len(fake.requests()); n != wantReqs[i] {
				t.Errorf("turn %d: %d requests, want %d", i+1, n, wantReqs[i])
			}
		}
		if !r.BreakerOpen() {
			t.Error("breaker closed after 6 silent attempts")
		}
		u, _ := runner.AsUserError(run())
		if want := "not responding (7 silent attempts in a row"; u == nil || !strings.Contains(u.Message, want) {
			t.Errorf("user message %v, want %q", u, want)
		}

		// The provider answers again: the breaker closes and retries resume.
		fake.setHandlers(answer("back"))
		if err := run(); err != nil {
			t.Fatal(err)
		}
		if r.BreakerOpen() {
			t.Error("breaker still open after an answer")
		}
		fake.setHandlers(stallAfter(), answer("retried"))
		if err := run(); err != nil || len(fake.requests()) != 2 {
			t.Errorf("after recovery: err %v, %d requests, want a retry", err, len(fake.requests()))
		}
	})
}

func TestHTTPRetries(t *testing.T) {
	retryDate := time.Date(2000, 1, 1, 0, 0, 10, 0, time.UTC).Format(http.TimeFormat) // bubble start + 10s
	tests := []struct {
		name     string
		handlers []http.HandlerFunc
		gaps     []time.Duration
		status   int    // 0 = success
		userMsg  string // substring
	}{{
		name:     "429 with Retry-After seconds",
		handlers: []http.HandlerFunc{status(429, map[string]string{"Retry-After": "7"}, `{"error":{"message":"Rate limit reached"}}`), answer("ok")},
		gaps:     []time.Duration{7 * time.Second},
	}, {
		name:     "429 with Retry-After date",
		handlers: []http.HandlerFunc{status(429, map[string]string{"Retry-After": retryDate}, ""), answer("ok")},
		gaps:     []time.Duration{10 * time.Second},
	}, {
		name:     "503 without Retry-After backs off 1s then 2s",
		handlers: []http.HandlerFunc{status(503, nil, "overloaded"), status(503, nil, "overloaded"), answer("ok")},
		gaps:     []time.Duration{time.Second, 2 * time.Second},
	}, {
		name:     "500 four times gives up",
		handlers: []http.HandlerFunc{status(500, nil, `{"error":{"message":"The server had an error"}}`)},
		gaps:     []time.Duration{time.Second, 2 * time.Second, 4 * time.Second},
		status:   500,
		userMsg:  "The model provider failed (HTTP 500 Internal Server Error); gave up after 4 attempts. Provider says: The server had an error",
	}, {
		name:     "429 exhausting retries",
		handlers: []http.HandlerFunc{status(429, map[string]string{"Retry-After": "1"}, "")},
		gaps:     []time.Duration{time.Second, time.Second, time.Second},
		status:   429,
		userMsg:  "rate-limiting requests (HTTP 429); gave up after 4 attempts",
	}, {
		name:     "Retry-After beyond the cap is not waited for",
		handlers: []http.HandlerFunc{status(429, map[string]string{"Retry-After": "3600"}, "")},
		status:   429,
		userMsg:  "asks to retry in 1h0m0s; not waiting that long",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				fake := newFake(t, tt.handlers...)
				r, _ := newTestRunner(t, config.OpenAI{}, fake)
				res, err := r.Run(t.Context(), turn, runner.Nop{})
				if g := fake.gaps(); !slices.Equal(g, tt.gaps) {
					t.Errorf("request gaps %v, want %v", g, tt.gaps)
				}
				if tt.status == 0 {
					if err != nil || res.Text != "ok" {
						t.Fatalf("Run = %q, %v", res.Text, err)
					}
					return
				}
				var se *StatusError
				if !errors.As(err, &se) || se.StatusCode != tt.status {
					t.Fatalf("err = %v, want status %d", err, tt.status)
				}
				if u, ok := runner.AsUserError(err); !ok || !strings.Contains(u.Message, tt.userMsg) {
					t.Errorf("user message = %q, want %q", err, tt.userMsg)
				}
			})
		})
	}
}

func TestCancelDuringRetryWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := newFake(t, status(503, map[string]string{"Retry-After": "30"}, ""))
		r, _ := newTestRunner(t, config.OpenAI{}, fake)
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(5*time.Second, cancel)
		start := time.Now()
		_, err := r.Run(ctx, turn, runner.Nop{})
		if !errors.Is(err, context.Canceled) || time.Since(start) != 5*time.Second {
			t.Fatalf("err %v after %v, want context.Canceled after 5s", err, time.Since(start))
		}
	})
}

func TestProviderRejects(t *testing.T) {
	const key = "sk-proj-Zq8fT3xLk29VbNw7Hc4RmYp1"
	tests := []struct {
		name    string
		handler http.HandlerFunc
		status  int
		want    []string // substrings of the user's message
	}{{
		name:    "401 echoing the key",
		handler: status(401, nil, `{"error":{"message":"Incorrect API key provided: `+key+`. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","code":"invalid_api_key"}}`),
		status:  401,
		want:    []string{"rejected the request (HTTP 401 Unauthorized)", "Check agents.openai.apiKey", "Incorrect API key provided: [redacted]."},
	}, {
		name:    "401 echoing the key partly masked",
		handler: status(401, nil, `{"error":{"message":"Incorrect API key provided: sk-proj-****************Yp1 (key sk-proj-Zq8fT3xL...)."}}`),
		status:  401,
		want:    []string{"HTTP 401", "Incorrect API key provided: [redacted] (key [redacted])."},
	}, {
		name:    "404 from Ollama",
		handler: status(404, nil, `{"error":"model \"llama9\" not found, try pulling it first"}`),
		status:  404,
		want:    []string{"HTTP 404 Not Found", "Check agents.openai.baseURL and agents.openai.model", `model "llama9" not found`},
	}, {
		name:    "400 with a plain body",
		handler: status(400, nil, "bad\nrequest   body"),
		status:  400,
		want:    []string{"HTTP 400 Bad Request", "Provider says: bad request body"},
	}, {
		name:    "error inside the stream",
		handler: stream(`{"error":{"message":"This model's maximum context length is 8192 tokens"}}`),
		status:  200,
		want:    []string{"The model provider reported an error: This model's maximum context length is 8192 tokens"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				fake := newFake(t, tt.handler)
				r, logs := newTestRunner(t, config.OpenAI{APIKey: key}, fake)
				_, err := r.Run(t.Context(), turn, runner.Nop{})
				if len(fake.requests()) != 1 {
					t.Errorf("%d requests, want 1 (no retry)", len(fake.requests()))
				}
				var se *StatusError
				if !errors.As(err, &se) || se.StatusCode != tt.status {
					t.Fatalf("err = %v, want status %d", err, tt.status)
				}
				u, ok := runner.AsUserError(err)
				if !ok {
					t.Fatalf("err = %v is not for the user", err)
				}
				for _, w := range tt.want {
					if !strings.Contains(u.Message, w) {
						t.Errorf("user message %q lacks %q", u.Message, w)
					}
				}
				for i := 0; i+8 <= len(key); i++ {
					frag := key[i : i+8]
					if strings.Contains(err.Error(), frag) || strings.Contains(se.Error(), frag) || strings.Contains(logs.String(), frag) {
						t.Fatalf("key fragment %q leaked: err %q; log:\n%s", frag, err, logs)
					}
				}
			})
		})
	}
}

func TestMaxSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := newFake(t, callTool("c1", "current_time", "{}"))
		r, _ := newTestRunner(t, config.OpenAI{MaxSteps: 3, Tools: config.OpenAITools{CurrentTime: true}}, fake)
		rec := newRecorder()
		_, err := r.Run(t.Context(), turn, rec)
		if !errors.Is(err, ErrMaxSteps) {
			t.Fatalf("err = %v, want ErrMaxSteps", err)
		}
		if u, ok := runner.AsUserError(err); !ok || !strings.Contains(u.Message, "stopped after 3 model calls without a final answer") {
			t.Errorf("user message: %v", err)
		}
		var llm, tools int
		for _, e := range rec.events() {
			switch e {
			case "start llm test-model":
				llm++
			case "start tool current_time":
				tools++
			}
		}
		if llm != 3 || tools != 2 || len(fake.requests()) != 3 {
			t.Errorf("%d llm steps, %d tool steps, %d requests; want 3, 2, 3", llm, tools, len(fake.requests()))
		}
	})
}

func TestUnknownToolAndBadArguments(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := newFake(t,
			stream(toolStartChunk(0, "c1", "rm_rf"), toolArgsChunk(0, "{}"),
				toolStartChunk(1, "c2", "current_time"), toolArgsChunk(1, "{not json"), finishChunk("tool_calls")),
			answer("sorry"))
		r, _ := newTestRunner(t, config.OpenAI{Tools: config.OpenAITools{CurrentTime: true}}, fake)
		rec := newRecorder()
		if _, err := r.Run(t.Context(), turn, rec); err != nil {
			t.Fatal(err)
		}
		msgs := fake.requests()[1].body.Messages
		got := []string{*msgs[len(msgs)-2].Content, *msgs[len(msgs)-1].Content}
		want := []string{`error: unknown tool "rm_rf"`, "error: the arguments are not valid JSON"}
		if !slices.Equal(got, want) {
			t.Errorf("tool results %q, want %q", got, want)
		}
		if ev := rec.events(); !slices.Contains(ev, "done tool rm_rf") {
			t.Errorf("events %q: a failed tool call is still a completed step", ev)
		}
	})
}

func TestCancelMidStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := newFake(t, stallAfter(textChunk("Hel")))
		r, _ := newTestRunner(t, config.OpenAI{}, fake)
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(5*time.Second, cancel)
		rec := newRecorder()
		start := time.Now()
		res, err := r.Run(ctx, turn, rec)
		if !errors.Is(err, context.Canceled) || res.Text != "Hel" {
			t.Fatalf("Run = %q, %v; want partial text and context.Canceled", res.Text, err)
		}
		if el := time.Since(start); el != 5*time.Second {
			t.Errorf("returned after %v, want at the cancel (5s)", el)
		}
		want := []string{"start llm test-model", `delta "Hel"`}
		if ev := rec.events(); !slices.Equal(ev, want) {
			t.Errorf("events %q, want %q (the interrupted step is not completed)", ev, want)
		}
	})
}

// TestSlowCommandToolHoldsStepOpen: a command tool that does not finish
// leaves its step open (the engine's step timeout will name it); cancelling
// the turn returns promptly and kills the tool. Real processes, real time.
func TestSlowCommandToolHoldsStepOpen(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pid")
	t.Setenv("PIDFILE", pidfile)
	fake := newFake(t, callTool("c1", "slow_lookup", `{"q":"x"}`), answer("never"))
	r, _ := newTestRunner(t, config.OpenAI{Tools: config.OpenAITools{Commands: []config.CommandTool{{
		Name: "slow_lookup", Argv: []string{"testdata/slow_tool.sh"}, TimeoutSeconds: 3600,
	}}}}, fake)
	rec := newRecorder()
	ctx, cancel := context.WithCancel(t.Context())
	type outcome struct {
		res runner.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := r.Run(ctx, turn, rec)
		done <- outcome{res, err}
	}()
	for ev := range rec.ch {
		if ev == "start tool slow_lookup" {
			break
		}
	}
	pid := waitPidfile(t, pidfile) // the tool's process is running
	if ev := rec.events(); slices.Contains(ev, "done tool slow_lookup") {
		t.Fatalf("step completed while the tool runs: %q", ev)
	}
	cancelled := time.Now()
	cancel()
	var o outcome
	select {
	case o = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if el := time.Since(cancelled); el > 2*time.Second {
		t.Errorf("Run returned %v after cancel", el)
	}
	if !errors.Is(o.err, context.Canceled) {
		t.Errorf("err = %v", o.err)
	}
	want := []string{"start llm test-model", "done llm test-model", "start tool slow_lookup"}
	if ev := rec.events(); !slices.Equal(ev, want) {
		t.Errorf("events %q, want %q", ev, want)
	}
	if err := syscall.Kill(pid, 0); err == nil && !isZombie(pid) {
		t.Errorf("tool process %d still running", pid)
	}
	if n := len(fake.requests()); n != 1 {
		t.Errorf("%d LLM requests, want 1", n)
	}
}

// waitPidfile waits (real time, 10s at most) for a process to write its pid.
func waitPidfile(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && strings.HasSuffix(string(b), "\n") {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
		time.Sleep(5 * time.Millisecond) // real time: the tool's process starts asynchronously
	}
	t.Fatal("the tool never started")
	return 0
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && strings.HasPrefix(string(b[i+1:]), " Z")
}

// TestUnreachableProvider: a connection error names the endpoint without
// its query (which may hold a secret) and is not retried.
func TestUnreachableProvider(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	base := srv.URL
	srv.Close()
	r, err := New(config.OpenAI{BaseURL: base + "/v1?token=q-secret", Model: "m", APIKey: "sk-unreachable-key"})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	_, err = r.Run(t.Context(), turn, rec)
	if err == nil {
		t.Fatal("no error")
	}
	if want := "openai: request to " + base + "/v1/chat/completions: "; !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "refused") {
		t.Errorf("err = %q, want %q… connection refused", err, want)
	}
	if strings.Contains(err.Error(), "q-secret") || strings.Contains(err.Error(), "sk-unreachable-key") {
		t.Errorf("err leaks a secret: %q", err)
	}
	if ev := rec.events(); !slices.Equal(ev, []string{"start llm m"}) {
		t.Errorf("events %q", ev)
	}
}
