package openai

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
)

// fallbackRecorder is a recorder that also records the runner's
// runner.FallbackReporter calls, as the engine's callbacks take them.
type fallbackRecorder struct{ *recorder }

func (f fallbackRecorder) Fallback(from, to string) { f.add("fallback " + from + " -> " + to) }

// hostTransport serves each host's handler in memory (pipeTransport), so a
// provider that never answers is durably blocked inside a synctest bubble.
type hostTransport map[string]http.Handler

func (h hostTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return pipeTransport{h[req.URL.Host]}.RoundTrip(req)
}

const (
	mainKey     = "sk-main-provider-key-0123456789"
	fallbackKey = "sk-fallback-provider-key-9876543210"
)

// deadURL is the base URL of a provider nobody listens on: a closed
// httptest server's address refuses connections.
func deadURL(t *testing.T) string {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	return srv.URL + "/v1"
}

// TestFallbackOverRealTCP runs turns against real OpenAI-compatible
// servers on loopback: the main provider dead, failing or half-answering,
// the fallback working. A failure before any reply text or tool run moves
// the turn to the fallback at once (no retries of the main one) and the
// person reads one notice; a failure after reply text or a tool run stops
// the turn as without fallbacks.
func TestFallbackOverRealTCP(t *testing.T) {
	switched := func(timedOut bool) string {
		return messages.ProviderSwitched("main-model", "backup-model", timedOut) + "\n\n"
	}
	tests := []struct {
		name     string
		main     http.HandlerFunc // nil: nothing listens
		backup   http.HandlerFunc
		tools    bool
		text     string   // what the person read, in order
		err      string   // "" = success; else a substring of the error
		mainReqs int      // requests the main provider got
		backReqs int      // requests the fallback got
		events   []string // the callbacks, in order
	}{{
		name:     "main refuses connections",
		backup:   answer("Hello", " there"),
		text:     switched(false) + "Hello there",
		backReqs: 1,
		events: []string{"start llm main-model", "fallback main-model -> backup-model", "heartbeat",
			"delta " + strconv.Quote(switched(false)), "start llm backup-model",
			`delta "Hello"`, `delta " there"`, "done llm backup-model"},
	}, {
		name:     "main fails with HTTP 500: no retries, the fallback answers",
		main:     status(500, nil, `{"error":{"message":"overloaded, key `+mainKey+`"}}`),
		backup:   answer("ok"),
		text:     switched(false) + "ok",
		mainReqs: 1,
		backReqs: 1,
	}, {
		name:     "main streams an error before any token",
		main:     stream(`{"error":{"message":"model not loaded"}}`),
		backup:   answer("ok"),
		text:     switched(false) + "ok",
		mainReqs: 1,
		backReqs: 1,
	}, {
		name:     "both fail: the person reads the notice, then the fallback's failure",
		main:     status(503, nil, "down"),
		backup:   status(401, nil, `{"error":{"message":"Incorrect API key provided: `+fallbackKey+`"}}`),
		text:     switched(false),
		err:      "The model provider rejected the request (HTTP 401 Unauthorized). Check agents.openai.fallbacks[0].apiKey. Provider says: Incorrect API key provided: [redacted]",
		mainReqs: 1,
		backReqs: 1,
	}, {
		name: "a failure after reply text stops the turn as today",
		main: func(w http.ResponseWriter, r *http.Request) { // closes without finishing
			sseHeader(w)
			writeEvents(w, []string{textChunk("Hel")})
		},
		backup:   answer("never"),
		text:     "Hel",
		err:      "closed the stream before the answer was complete",
		mainReqs: 1,
		events:   []string{"start llm main-model", `delta "Hel"`},
	}, {
		name: "a failure after a tool call stops the turn as today",
		main: func() http.HandlerFunc {
			n := 0
			return func(w http.ResponseWriter, r *http.Request) {
				if n++; n == 1 {
					callTool("c1", "current_time", `{}`)(w, r)
					return
				}
				status(500, nil, "down")(w, r)
			}
		}(),
		backup:   answer("never"),
		tools:    true,
		err:      "The model provider failed (HTTP 500 Internal Server Error); gave up after 1 attempts.",
		mainReqs: 2,
		events:   []string{"start llm main-model", "done llm main-model", "start tool current_time", "done tool current_time", "start llm main-model"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mainURL := deadURL(t)
			var mainFake *fakeLLM
			if tt.main != nil {
				mainFake = newFake(t, tt.main)
				srv := httptest.NewServer(mainFake)
				t.Cleanup(srv.Close)
				mainURL = srv.URL + "/v1"
			}
			backFake := newFake(t, tt.backup)
			back := httptest.NewServer(backFake)
			t.Cleanup(back.Close)

			logs := &logBuffer{}
			r, err := New(config.OpenAI{BaseURL: mainURL, APIKey: mainKey, Model: "main-model",
				Tools:     config.OpenAITools{CurrentTime: tt.tools},
				Fallbacks: []config.OpenAIFallback{{BaseURL: back.URL + "/v1", APIKey: fallbackKey, Model: "backup-model"}}},
				WithRetries(0, 0), WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
			if err != nil {
				t.Fatal(err)
			}
			rec := fallbackRecorder{newRecorder()}
			res, err := r.Run(t.Context(), turn, rec)
			if res.Text != tt.text {
				t.Errorf("the person read %q, want %q", res.Text, tt.text)
			}
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("err = %v", err)
			case tt.err != "":
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("err = %v, want %q", err, tt.err)
				}
			}
			if mainFake != nil && len(mainFake.requests()) != tt.mainReqs {
				t.Errorf("main provider got %d requests, want %d", len(mainFake.requests()), tt.mainReqs)
			}
			reqs := backFake.requests()
			if len(reqs) != tt.backReqs {
				t.Errorf("fallback got %d requests, want %d", len(reqs), tt.backReqs)
			}
			for _, q := range reqs {
				if q.auth != "Bearer "+fallbackKey || q.body.Model != "backup-model" {
					t.Errorf("fallback request auth %q model %q", q.auth, q.body.Model)
				}
				if got := q.body.Messages[len(q.body.Messages)-1]; *got.Content != turn.Message {
					t.Errorf("fallback's last message %q, want the person's", *got.Content)
				}
			}
			if tt.events != nil && !slices.Equal(rec.events(), tt.events) {
				t.Errorf("callbacks\n %q\nwant\n %q", rec.events(), tt.events)
			}
			if strings.Contains(logs.String(), mainKey) || strings.Contains(logs.String(), fallbackKey) ||
				(err != nil && (strings.Contains(err.Error(), mainKey) || strings.Contains(err.Error(), fallbackKey))) {
				t.Errorf("an API key leaked:\nlog %s\nerr %v", logs, err)
			}
			if n := strings.Count(res.Text, "↪️"); n > 1 {
				t.Errorf("%d switch notices, want at most one: %q", n, res.Text)
			}
		})
	}
}

// TestFallbackAfterIdleTimeout: a main provider that never answers is left
// after one llmIdleTimeoutSeconds — not two, the idle retry is the
// fallback's — and the person reads that it did not answer in time. The
// next turn starts with the main provider again.
func TestFallbackAfterIdleTimeout(t *testing.T) {
	const idle = 20 * time.Second
	synctest.Test(t, func(t *testing.T) {
		mainFake := newFake(t, stallBeforeHeaders())
		backFake := newFake(t, answer("ok"))
		r, err := New(config.OpenAI{BaseURL: "http://main.test/v1", Model: "main-model", LLMIdleTimeoutSeconds: idle.Seconds(),
			Fallbacks: []config.OpenAIFallback{{BaseURL: "http://backup.test/v1", Model: "backup-model"}}},
			WithHTTPClient(&http.Client{Transport: hostTransport{"main.test": mainFake, "backup.test": backFake}}))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			start := time.Now()
			rec := fallbackRecorder{newRecorder()}
			res, err := r.Run(t.Context(), turn, rec)
			if err != nil {
				t.Fatal(err)
			}
			want := messages.ProviderSwitched("main-model", "backup-model", true) + "\n\nok"
			if res.Text != want || !strings.Contains(want, "did not answer in time; switched to `backup-model`") {
				t.Errorf("turn %d: the person read %q, want %q", i+1, res.Text, want)
			}
			if el := time.Since(start); el != idle {
				t.Errorf("turn %d took %v, want one idle timeout (%v)", i+1, el, idle)
			}
			if got := len(mainFake.requests()); got != i+1 {
				t.Errorf("turn %d: main provider got %d requests in all, want %d", i+1, got, i+1)
			}
			if !slices.Contains(rec.events(), "fallback main-model -> backup-model") {
				t.Errorf("turn %d: no fallback reported: %q", i+1, rec.events())
			}
		}
	})
}

// TestFallbackChain: with two fallbacks, a dead first fallback passes the
// turn on to the second; the person reads one notice per switch.
func TestFallbackChain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, err := New(config.OpenAI{BaseURL: "http://a.test/v1", Model: "a",
			Fallbacks: []config.OpenAIFallback{{BaseURL: "http://b.test/v1", Model: "b"}, {BaseURL: "http://c.test/v1", Model: "c"}}},
			WithHTTPClient(&http.Client{Transport: hostTransport{
				"a.test": newFake(t, status(500, nil, "")), "b.test": newFake(t, status(502, nil, "")), "c.test": newFake(t, answer("ok")),
			}}))
		if err != nil {
			t.Fatal(err)
		}
		res, err := r.Run(t.Context(), turn, runner.Nop{})
		want := messages.ProviderSwitched("a", "b", false) + "\n\n" + messages.ProviderSwitched("b", "c", false) + "\n\nok"
		if err != nil || res.Text != want {
			t.Fatalf("Run = %q, %v; want %q", res.Text, err, want)
		}
	})
}

// TestFallbackConfigErrors: New names the fallback's key and never quotes
// its URL or key.
func TestFallbackConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		fb   config.OpenAIFallback
		want string
	}{
		{config.OpenAIFallback{Model: "m"}, "agents.openai.fallbacks[0].baseURL: required"},
		{config.OpenAIFallback{BaseURL: "ftp://x.example/v1?k=q-secret", Model: "m"}, "agents.openai.fallbacks[0].baseURL: not an http(s) URL"},
		{config.OpenAIFallback{BaseURL: "https://u:pw-secret@x.example/v1", Model: "m"}, "agents.openai.fallbacks[0].baseURL: must not contain credentials; use agents.openai.fallbacks[0].apiKey"},
		{config.OpenAIFallback{BaseURL: "https://x.example/v1", APIKey: "sk-q-secret"}, "agents.openai.fallbacks[0].model: required"},
	} {
		_, err := New(config.OpenAI{Model: "main", Fallbacks: []config.OpenAIFallback{tc.fb}})
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("New(%+v) = %v, want %q…", tc.fb, err, tc.want)
		}
	}
	if _, err := New(config.OpenAI{Model: "main", Fallbacks: make([]config.OpenAIFallback, config.MaxOpenAIFallbacks+1)}); err == nil ||
		!errors.Is(err, err) || !strings.Contains(err.Error(), "at most 8") {
		t.Errorf("too many fallbacks: %v", err)
	}
}
