package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/gateway/server"
	"github.com/turnguard/turnguard/ops/admin"
	"github.com/turnguard/turnguard/ops/metrics"
	"github.com/turnguard/turnguard/ops/tracing"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
	"github.com/turnguard/turnguard/store"

	"github.com/turnguard/turnguard/internal/faketime"

	"github.com/turnguard/turnguard/internal/testlog"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current answers")

const opToken = "op-token-SECRET-2"

// secrets are configured in every test gateway; none may appear in an
// answer or a log line.
var secrets = []string{"srv-token-SECRET-1", opToken, "sk-SECRET-3", "SECRET-4-bot", "SECRET-5-hook-value", "SECRET-6-alert", "SECRET-7-env",
	"sk-SECRET-8-fallback", "SECRET-9-fallback-query"}

func secs(v float64) *float64 { return &v }

// testConfig is a configuration with every kind of secret set and short
// limits: progress notices after 1s, step timeout 3s (30s on Telegram),
// abort grace 1s.
func testConfig(t *testing.T) *config.Config {
	t.Helper()
	c := config.Default()
	c.Server.Token = secrets[0]
	c.Server.OperatorToken = opToken
	c.Agents.OpenAI.APIKey = secrets[2]
	c.Channels.Telegram.Token = "123456:" + secrets[3]
	c.Channels.Telegram.WebhookSecret = secrets[4]
	c.Alerts.WebhookURL = "https://hooks.example.test/alert?key=" + secrets[5]
	c.Agents.Exec.Env = map[string]string{"API_TOKEN": secrets[6]}
	c.Agents.OpenAI.Fallbacks = []config.OpenAIFallback{{BaseURL: "https://backup.example.test/v1?key=" + secrets[8],
		APIKey: secrets[7], Model: "backup-model"}}
	d := &c.Agents.Defaults
	d.TimeoutSeconds, d.MaxTurnTimeSeconds = secs(60), secs(120)
	d.StepTimeoutSeconds, d.ProgressNotifyAfterSeconds, d.ProgressRepeatSeconds = secs(3), secs(1), secs(10)
	d.AbortGraceSeconds = secs(1)
	c.Channels.Telegram.Timeouts.StepTimeoutSeconds = secs(30)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

// env is a gateway without a network: engine on the demo runner, a SQLite
// store recording the bus, the metrics, and the router with the operator
// routes mounted.
type env struct {
	eng  *gateway.Engine
	st   *store.SQLite
	h    http.Handler
	logs *syncBuffer
}

type syncBuffer = testlog.Buffer

func newEnv(t *testing.T, c *config.Config) *env {
	t.Helper()
	return newEnvRunner(t, c, demo.New())
}

// newEnvRunner is newEnv with rn as the runner of every channel; adjust
// changes the handler's options.
func newEnvRunner(t *testing.T, c *config.Config, rn runner.Runner, adjust ...func(*admin.Options)) *env {
	t.Helper()
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	src := config.NewSource(c)
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "admin.db"), store.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New("test")
	eng, err := gateway.New(gateway.Options{Config: src, Runners: map[string]runner.Runner{"demo": rn}, Log: log, Observer: m.Observer()})
	if err != nil {
		t.Fatal(err)
	}
	unsubStore := eng.Bus().Subscribe("", st.Handle)
	unsubMetrics := eng.Bus().Subscribe("", m.Handle)
	ctx, cancel := context.WithCancel(context.Background())
	eng.Start(ctx)
	m.AddSources(metrics.Sources{ActiveTurns: eng.Registry().Len, WSClients: func() int { return 2 }, Store: st, Outbox: st})
	opts := admin.Options{
		Engine: eng, Config: src, Store: st, Metrics: m, MetricsHandler: m.Handler(), WSClients: func() int { return 2 },
		OperatorToken: c.Server.OperatorToken, Version: "turnguard test", StartedAt: time.Now(), Log: log,
	}
	for _, f := range adjust {
		f(&opts)
	}
	a, err := admin.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if d, ok := rn.(*demo.Runner); ok {
			d.Release()
		}
		eng.Shutdown(context.Background())
		unsubMetrics()
		unsubStore()
		cancel()
		if err := st.Close(); err != nil {
			t.Errorf("store close: %v", err)
		}
	})
	return &env{eng: eng, st: st, h: server.NewRouter(server.Options{Mount: a.Mount, Log: log}), logs: logs}
}

// do sends a request as the operator (bearer token, from loopback) and
// returns the status and body.
func (e *env) do(t *testing.T, method, path string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	req.Header.Set("Authorization", "Bearer "+opToken)
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	body := rec.Body.String()
	for _, s := range secrets {
		if strings.Contains(body, s) {
			t.Errorf("%s %s: the answer contains the secret %q", method, path, s)
		}
	}
	return rec.Code, body
}

func (e *env) send(t *testing.T, run, session, channel, chatRef, text string) {
	t.Helper()
	if _, err := e.eng.Send(context.Background(), gateway.SendRequest{SessionKey: session, Channel: channel, ChatRef: chatRef, RunID: run, Text: text}); err != nil {
		t.Fatalf("send %s: %v", run, err)
	}
}

func (e *env) flush(t *testing.T) {
	t.Helper()
	if err := e.st.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// normalise replaces the values at the given paths (dot-separated keys) of
// a JSON document with "<volatile>", and re-indents it with sorted keys.
func normalise(t *testing.T, body string, paths ...string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, body)
	}
	for _, p := range paths {
		keys := strings.Split(p, ".")
		m, ok := v.(map[string]any)
		for _, k := range keys[:len(keys)-1] {
			if !ok {
				break
			}
			m, ok = m[k].(map[string]any)
		}
		if last := keys[len(keys)-1]; ok {
			if _, present := m[last]; present {
				m[last] = "<volatile>"
			}
		}
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// golden compares got with testdata/name (rewritten with -update).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./ops/admin -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (go test ./ops/admin -update rewrites it after checking the change)\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

// TestAPIGolden drives four turns in fake time — one that finishes, one
// whose slow step recovers, one whose runner ignores its step-timeout abort
// and one left hanging — and checks the answers of /api/turns,
// /api/turns/{runId}/abort, /api/stall-history and /api/diagnose against
// testdata/*.golden. In fake time every timestamp and duration is exact;
// only the build's Go version and VCS revision and the scheduler's internal
// counters are normalised.
func TestAPIGolden(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, testConfig(t))
		e.send(t, "r-ok", "agent:main:a", "ws", "", "/steps web_search:200ms say:done")
		e.send(t, "r-slow", "agent:main:b", "ws", "", "/steps fetch_page:1500ms say:ok")
		e.send(t, "r-stuck", "agent:main:c", "ws", "", "/steps shell:stuck")
		e.send(t, "r-live", "telegram:42", "telegram", "42", "/steps web_search:100ms shell:hang")

		faketime.Advance(2 * time.Second)
		code, body := e.do(t, http.MethodGet, "/api/turns")
		if code != http.StatusOK {
			t.Fatalf("GET /api/turns: %d %s", code, body)
		}
		golden(t, "turns.golden", normalise(t, body))

		faketime.Advance(3 * time.Second) // r-stuck: step timeout at 3s, force-finalized at 4s
		code, body = e.do(t, http.MethodPost, "/api/turns/r-live/abort")
		if code != http.StatusOK {
			t.Fatalf("POST abort: %d %s", code, body)
		}
		golden(t, "abort.golden", normalise(t, body))
		if out, ok := e.eng.Wait(context.Background(), "r-live"); !ok || out.StopReason != "user" {
			t.Fatalf("r-live after the operator abort: %+v", out)
		}
		synctest.Wait()
		if code, body := e.do(t, http.MethodGet, "/api/turns"); code != http.StatusOK || !strings.Contains(body, `"count": 0`) {
			t.Errorf("after the abort /api/turns: %d %s", code, body)
		}

		e.flush(t)
		code, body = e.do(t, http.MethodGet, "/api/stall-history")
		if code != http.StatusOK {
			t.Fatalf("GET /api/stall-history: %d %s", code, body)
		}
		golden(t, "stall-history.golden", normalise(t, body))

		code, body = e.do(t, http.MethodGet, "/api/diagnose")
		if code != http.StatusOK {
			t.Fatalf("GET /api/diagnose: %d %s", code, body)
		}
		golden(t, "diagnose.golden", normalise(t, body,
			"build.goVersion", "build.revision", "build.modified", "build.os", "build.arch",
			"scheduler.wakeups", "scheduler.looks", "scheduler.rearms", "store.enqueued", "store.written"))

		for _, s := range secrets {
			if strings.Contains(e.logs.String(), s) {
				t.Errorf("the log contains the secret %q", s)
			}
		}
	})
}

// TestStallHistoryFilters: by session, run and time; bad parameters are a
// clear 400.
func TestStallHistoryFilters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, testConfig(t))
		start := time.Now().UTC()
		e.send(t, "r-1", "agent:main:a", "ws", "", "/steps fetch_page:1500ms say:ok")
		faketime.Advance(10 * time.Second)
		e.send(t, "r-2", "agent:main:b", "ws", "", "/steps shell:hang")
		faketime.Advance(10 * time.Second)
		e.flush(t)
		at := func(d time.Duration) string { return start.Add(d).Format(time.RFC3339) }

		tests := []struct {
			query    string
			wantCode int
			wantRuns []string // episodes, in order
			wantErr  string
		}{
			{"", 200, []string{"r-1", "r-2"}, ""},
			{"?session=agent:main:b", 200, []string{"r-2"}, ""},
			{"?run=r-1", 200, []string{"r-1"}, ""},
			{"?since=" + at(5*time.Second), 200, []string{"r-2"}, ""},
			{"?until=" + at(5*time.Second), 200, []string{"r-1"}, ""},
			{"?since=15s", 200, []string{"r-2"}, ""},
			{"?since=1h&limit=1", 200, []string{"r-2"}, ""},
			{"?session=nobody", 200, nil, ""},
			{"?since=yesterday", 400, nil, "since must be an RFC 3339 time"},
			{"?until=-5m", 400, nil, "until must be"},
			{"?since=" + at(10*time.Second) + "&until=" + at(5*time.Second), 400, nil, "since must be before until"},
			{"?limit=0", 400, nil, "limit must be a whole number from 1 to 10000"},
			{"?limit=lots", 400, nil, "limit must be"},
			{"?sesion=a", 400, nil, `unknown parameter "sesion"`},
		}
		for _, tt := range tests {
			code, body := e.do(t, http.MethodGet, "/api/stall-history"+tt.query)
			if code != tt.wantCode {
				t.Errorf("%s: status %d, want %d (%s)", tt.query, code, tt.wantCode, body)
				continue
			}
			if tt.wantErr != "" {
				var ae struct{ Error string }
				if json.Unmarshal([]byte(body), &ae) != nil || !strings.Contains(ae.Error, tt.wantErr) {
					t.Errorf("%s: error %s, want it to contain %q", tt.query, body, tt.wantErr)
				}
				continue
			}
			var res admin.StallHistoryResponse
			if err := json.Unmarshal([]byte(body), &res); err != nil {
				t.Fatalf("%s: %v", tt.query, err)
			}
			var runs []string
			for _, ep := range res.Episodes {
				runs = append(runs, ep.RunID)
			}
			if strings.Join(runs, ",") != strings.Join(tt.wantRuns, ",") {
				t.Errorf("%s: episodes of %v, want %v", tt.query, runs, tt.wantRuns)
			}
		}
	})
}

// TestAbortErrors: aborting what is not live is a clear 404 or 409, and the
// user's turn is not touched by a wrong id.
func TestAbortErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, testConfig(t))
		e.send(t, "r-1", "agent:main:a", "ws", "", "/steps shell:stuck")
		faketime.Advance(4 * time.Second) // step timeout at 3s; the runner ignores it; force-finalized at 4s
		e.send(t, "r-2", "agent:main:b", "ws", "", "/steps shell:stuck")
		faketime.Advance(3500 * time.Millisecond) // r-2 aborted at 3s, still stopping

		tests := []struct {
			path     string
			wantCode int
			wantErr  string
		}{
			{"/api/turns/nope/abort", 404, "no live turn has that runId"},
			{"/api/turns/r-1/abort", 404, "no live turn has that runId"},
			{"/api/turns/r-2/abort", 409, "no longer running"},
		}
		for _, tt := range tests {
			code, body := e.do(t, http.MethodPost, tt.path)
			if code != tt.wantCode || !strings.Contains(body, tt.wantErr) {
				t.Errorf("POST %s: %d %s, want %d %q", tt.path, code, body, tt.wantCode, tt.wantErr)
			}
		}
		if code, body := e.do(t, http.MethodGet, "/api/turns/r-2/abort"); code == http.StatusOK {
			t.Errorf("GET on the abort route answered 200: %s", body)
		}
	})
}

// TestDashboardPage: the page and its assets are served with a strict
// CSP and no data; unknown assets are 404.
func TestDashboardPage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, testConfig(t))
		tests := []struct {
			path, wantType, wantBody string
			wantCode                 int
		}{
			{"/admin", "text/html", `id="turns"`, 200},
			{"/admin/", "text/html", `id="stalls"`, 200},
			{"/admin/assets/admin.js", "text/javascript", "/api/turns", 200},
			{"/admin/assets/admin.css", "text/css", ".stall-warning", 200},
			{"/admin/assets/nope.js", "", "", 404},
			{"/admin/assets/index.html", "", "", 404},
		}
		for _, tt := range tests {
			rec := httptest.NewRecorder()
			e.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tt.path, nil)) // no token: the page holds no data
			if rec.Code != tt.wantCode {
				t.Errorf("GET %s: %d, want %d", tt.path, rec.Code, tt.wantCode)
				continue
			}
			if tt.wantCode != 200 {
				continue
			}
			if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, tt.wantType) {
				t.Errorf("GET %s: Content-Type %q", tt.path, ct)
			}
			if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
				t.Errorf("GET %s: CSP %q", tt.path, csp)
			}
			if !strings.Contains(rec.Body.String(), tt.wantBody) {
				t.Errorf("GET %s: body lacks %q", tt.path, tt.wantBody)
			}
		}
	})
}

// TestMetricsRoute: /metrics is behind the operator token and serves the
// text format.
func TestMetricsRoute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, testConfig(t))
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if rec.Code != http.StatusUnauthorized {
			t.Errorf("GET /metrics without a token: %d", rec.Code)
		}
		code, body := e.do(t, http.MethodGet, "/metrics")
		if code != http.StatusOK || !strings.Contains(body, "turnguard_ws_clients 2") {
			t.Errorf("GET /metrics: %d\n%s", code, body)
		}
	})
}

// TestNewRequiresEngineAndConfig: a clear error, not a crash.
func TestNewRequiresEngineAndConfig(t *testing.T) {
	if _, err := admin.New(admin.Options{}); err == nil || !strings.Contains(err.Error(), "required") {
		t.Errorf("New without engine: %v", err)
	}
}

// drain reads a response body fully (for the auth tests).
func drain(r io.Reader) string {
	b, _ := io.ReadAll(r)
	return string(b)
}

// TestTurnsShowTraceID: with tracing on (Options.TraceID), each live turn of
// /api/turns names its trace; with it off, no traceId is shown.
func TestTurnsShowTraceID(t *testing.T) {
	for _, on := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			e := newEnvRunner(t, testConfig(t), demo.New(), func(o *admin.Options) {
				if on {
					o.TraceID = tracing.TraceIDString
				}
			})
			e.send(t, "r-traced", "agent:main:a", "ws", "", "/steps shell:hang")
			synctest.Wait()
			code, body := e.do(t, http.MethodGet, "/api/turns")
			var resp admin.TurnsResponse
			if err := json.Unmarshal([]byte(body), &resp); code != http.StatusOK || err != nil || len(resp.Turns) != 1 {
				t.Fatalf("GET /api/turns: %d %v %s", code, err, body)
			}
			want := ""
			if on {
				want = tracing.TraceIDString("r-traced")
			}
			if got := resp.Turns[0].TraceID; got != want || strings.Contains(body, "traceId") != on {
				t.Errorf("tracing %v: traceId %q, want %q", on, got, want)
			}
		})
	}
}

// TestTurnsShowTheAttempt: /api/turns gives each live turn its attempt
// number — 1 for a first attempt, 2 for a turn dispatched again after a
// restart (agents.defaults.resume: a queued message with its Resume mark).
func TestTurnsShowTheAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnvRunner(t, testConfig(t), demo.New())
		e.send(t, "r-first", "agent:main:a", "ws", "", "/steps shell:hang")
		if _, err := e.eng.Send(context.Background(), gateway.SendRequest{SessionKey: "agent:main:b", Channel: "ws", RunID: "r-attempt-2",
			Text: "/steps shell:hang", Resume: &gateway.Resume{Attempt: 2, MaxAttempts: 3}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		code, body := e.do(t, http.MethodGet, "/api/turns")
		var resp admin.TurnsResponse
		if err := json.Unmarshal([]byte(body), &resp); code != http.StatusOK || err != nil || len(resp.Turns) != 2 {
			t.Fatalf("GET /api/turns: %d %v %s", code, err, body)
		}
		got := map[string]int{}
		for _, v := range resp.Turns {
			got[v.RunID] = v.Attempt
		}
		if want := map[string]int{"r-first": 1, "r-attempt-2": 2}; !maps.Equal(got, want) {
			t.Errorf("attempts %v, want %v", got, want)
		}
	})
}

// TestDashboardTakesNoTokenFromTheQuery: the served admin.js reads the
// operator token from the URL fragment only — a ?token= query reaches the
// server's and proxies' logs and Referer headers, so the page ignores it.
func TestDashboardTakesNoTokenFromTheQuery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, testConfig(t))
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/assets/admin.js", nil))
		js := rec.Body.String()
		if rec.Code != http.StatusOK || !strings.Contains(js, `new URLSearchParams(location.hash.slice(1)).get("token")`) {
			t.Fatalf("GET admin.js: %d, no token read from the fragment", rec.Code)
		}
		if strings.Contains(js, "location.search") {
			t.Errorf("admin.js reads the query string (location.search): a ?token= would be used")
		}
	})
}

// TestTurnsListTheOtherReplicasTurns (issue 20, one view from every
// replica): in cluster mode /api/turns lists, after this replica's own
// live turns, the turns the store holds as running elsewhere (elsewhere:
// true, steps as recorded, the wall-clock deadline); a turn of its own is
// listed once, from its engine.
func TestTurnsListTheOtherReplicasTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := testConfig(t)
		c.Cluster.Enabled = true // the store answers for the other replicas (PostgreSQL in production)
		e := newEnv(t, c)
		e.send(t, "r-here", "agent:main:here", "ws", "", "/steps shell:hang")
		synctest.Wait()
		at := time.Now()
		e.st.Handle(event.Event{Kind: event.TurnStarted, RunID: "r-there", SessionKey: "agent:main:there", Channel: "ws",
			Time: at.Add(-time.Minute), Deadline: at.Add(4 * time.Minute)})
		e.st.Handle(event.Event{Kind: event.StepStarted, RunID: "r-there", SessionKey: "agent:main:there", Channel: "ws",
			Time: at.Add(-30 * time.Second), Step: event.Step{Kind: "tool", Name: "web_search", Seq: 1}})
		e.flush(t)
		code, body := e.do(t, http.MethodGet, "/api/turns")
		var resp admin.TurnsResponse
		if err := json.Unmarshal([]byte(body), &resp); code != http.StatusOK || err != nil {
			t.Fatalf("GET /api/turns: %d %v %s", code, err, body)
		}
		if resp.Count != 2 || len(resp.Turns) != 2 {
			t.Fatalf("GET /api/turns: %s; want r-there (elsewhere) and r-here", body)
		}
		there, here := resp.Turns[0], resp.Turns[1]
		if there.RunID != "r-there" || !there.Elsewhere || there.State != "running" || there.SessionKey != "agent:main:there" ||
			there.CurrentStep == nil || there.CurrentStep.Name != "web_search" || there.ElapsedMs != 60000 ||
			there.Deadlines.TimeoutInMs == nil || *there.Deadlines.TimeoutInMs != 240000 {
			t.Errorf("the other replica's turn: %+v", there)
		}
		if here.RunID != "r-here" || here.Elsewhere {
			t.Errorf("this replica's turn: %+v", here)
		}
	})
}
