package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/ops/metrics"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
	"github.com/turnguard/turnguard/store"

	"github.com/turnguard/turnguard/internal/faketime"
)

var quiet = slog.New(slog.DiscardHandler)

func secs(v float64) *float64 { return &v }

// scrape GETs /metrics from h and parses the answer with the Prometheus
// text parser, as a Prometheus server would.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("Content-Type %q, want the text format", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

// series renders every series of the turnguard_ families as
// `name{k="v",…} value` lines (histograms as _count and _sum), sorted, so a
// test compares what a dashboard would read.
func series(fams map[string]*dto.MetricFamily) map[string]string {
	out := map[string]string{}
	for name, f := range fams {
		if !strings.HasPrefix(name, "turnguard_") || name == "turnguard_build_info" {
			continue
		}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(ls)
			key := name + "{" + strings.Join(ls, ",") + "}"
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				out[key+" count"] = fmt.Sprint(h.GetSampleCount())
				out[key+" sum"] = fmt.Sprintf("%.3f", h.GetSampleSum())
			case dto.MetricType_COUNTER:
				out[key] = fmt.Sprint(m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				out[key] = fmt.Sprint(m.GetGauge().GetValue())
			}
		}
	}
	return out
}

type fakeStore struct{ st store.Stats }

func (f fakeStore) Stats() store.Stats { return f.st }

type fakeCounts struct {
	n   store.OutboxCounts
	err error
}

func (f fakeCounts) Counts(context.Context) (store.OutboxCounts, error) { return f.n, f.err }

// TestTurnMetrics runs real turns on the engine and the demo runner in
// fake time and checks the scraped series: turns by stop reason, step
// durations, progress notices, abort lateness, force-finalizations and the
// scrape-time gauges.
func TestTurnMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := config.Default()
		c.Agents.Defaults.StepTimeoutSeconds = secs(1)
		c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(0.5)
		c.Agents.Defaults.ProgressRepeatSeconds = secs(10)
		c.Agents.Defaults.AbortGraceSeconds = secs(2)
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		m := metrics.New("test")
		d := demo.New()
		eng, err := gateway.New(gateway.Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": d},
			Log: quiet, Observer: m.Observer()})
		if err != nil {
			t.Fatal(err)
		}
		unsub := eng.Bus().Subscribe("", m.Handle)
		ctx, cancel := context.WithCancel(context.Background())
		eng.Start(ctx)
		defer func() {
			d.Release()
			eng.Shutdown(context.Background())
			unsub()
			cancel()
		}()
		m.AddSources(metrics.Sources{
			ActiveTurns: func() int { return eng.Registry().Len() },
			WSClients:   func() int { return 3 },
			Store:       fakeStore{store.Stats{QueueDepth: 7, Dropped: 2, Failed: 1, Written: 40}},
			Outbox:      fakeCounts{n: store.OutboxCounts{Pending: 1, Delivered: 5, Failed: 2}},
		})

		send := func(run, session, channel, text string) {
			t.Helper()
			if _, err := eng.Send(ctx, gateway.SendRequest{SessionKey: session, Channel: channel, RunID: run, Text: text}); err != nil {
				t.Fatalf("send %s: %v", run, err)
			}
		}
		wait := func(run string, want event.StopReason) {
			t.Helper()
			out, ok := eng.Wait(ctx, run)
			if !ok || out.StopReason != want {
				t.Fatalf("run %s ended %+v, want stop reason %s", run, out, want)
			}
		}
		send("r1", "s1", "ws", "/steps web_search:300ms llm:400ms say:ok")
		wait("r1", event.ReasonStop)
		send("r2", "s2", "telegram", "/steps shell:hang")
		wait("r2", event.ReasonStepTimeout)
		send("r3", "s3", "ws", "/steps shell:stuck")
		wait("r3", event.ReasonStepTimeout)
		faketime.Advance(2500 * time.Millisecond) // fake time: past the abort grace of r3, which is force-finalized
		send("r4", "s4", "ws", "/steps shell:5s")
		faketime.Advance(100 * time.Millisecond)
		if res, err := eng.Abort(ctx, "s4", "r4", event.ReasonUser, "operator", true); err != nil || !res.Aborted {
			t.Fatalf("abort r4: %+v %v", res, err)
		}
		wait("r4", event.ReasonUser)
		synctest.Wait()

		got := series(scrape(t, m.Handler()))
		want := map[string]string{
			`turnguard_turns_started_total{channel="ws"}`:                                   "3",
			`turnguard_turns_started_total{channel="telegram"}`:                             "1",
			`turnguard_turns_finished_total{channel="ws",stop_reason="stop"}`:               "1",
			`turnguard_turns_finished_total{channel="telegram",stop_reason="step_timeout"}`: "1",
			`turnguard_turns_finished_total{channel="ws",stop_reason="step_timeout"}`:       "1",
			`turnguard_turns_finished_total{channel="ws",stop_reason="user"}`:               "1",
			`turnguard_step_duration_seconds{kind="tool"} count`:                            "1",
			`turnguard_step_duration_seconds{kind="tool"} sum`:                              "0.300",
			`turnguard_step_duration_seconds{kind="llm"} count`:                             "1",
			`turnguard_step_duration_seconds{kind="llm"} sum`:                               "0.400",
			`turnguard_progress_notices_total{channel="telegram"}`:                          "1",
			`turnguard_progress_notices_total{channel="ws"}`:                                "1",
			`turnguard_abort_late_seconds{stop_reason="step_timeout"} count`:                "2",
			`turnguard_abort_late_seconds{stop_reason="step_timeout"} sum`:                  "0.000",
			`turnguard_force_finalized_total{stop_reason="step_timeout"}`:                   "1",
			`turnguard_active_turns{}`:                                                      "0",
			`turnguard_ws_clients{}`:                                                        "3",
			`turnguard_store_queue_depth{}`:                                                 "7",
			`turnguard_store_events_dropped_total{}`:                                        "2",
			`turnguard_store_events_failed_total{}`:                                         "1",
			`turnguard_store_events_written_total{}`:                                        "40",
			`turnguard_outbox_messages{status="pending"}`:                                   "1",
			`turnguard_outbox_messages{status="delivered"}`:                                 "5",
			`turnguard_outbox_messages{status="failed"}`:                                    "2",
			`turnguard_resume_decisions_total{outcome="resumed"}`:                           "0",
			`turnguard_resume_decisions_total{outcome="asked"}`:                             "0",
			`turnguard_resume_decisions_total{outcome="exhausted"}`:                         "0",
			`turnguard_resume_decisions_total{outcome="skipped"}`:                           "0",
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s = %q, want %s", k, got[k], v)
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("unexpected series %s = %s", k, got[k])
			}
		}

		finished, err := m.Values("turnguard_turns_finished_total", "stop_reason")
		if err != nil || finished["step_timeout"] != 2 || finished["user"] != 1 || finished["stop"] != 1 {
			t.Errorf("Values(turns_finished by stop_reason) = %v, %v", finished, err)
		}
	})
}

// TestActiveTurnsWhileRunning: the gauge follows live turns.
func TestActiveTurnsWhileRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := config.Default()
		m := metrics.New("test")
		d := demo.New()
		eng, err := gateway.New(gateway.Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": d}, Log: quiet})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		eng.Start(ctx)
		defer func() { eng.Shutdown(context.Background()); cancel() }()
		m.AddSources(metrics.Sources{ActiveTurns: func() int { return eng.Registry().Len() }})
		for i := range 2 {
			if _, err := eng.Send(ctx, gateway.SendRequest{SessionKey: fmt.Sprint("s", i), Channel: "ws", Text: "/steps shell:10s"}); err != nil {
				t.Fatal(err)
			}
		}
		faketime.Advance(time.Second)
		if got := series(scrape(t, m.Handler()))[`turnguard_active_turns{}`]; got != "2" {
			t.Errorf("active turns while two run: %s, want 2", got)
		}
		faketime.Advance(10 * time.Second)
		synctest.Wait()
		if got := series(scrape(t, m.Handler()))[`turnguard_active_turns{}`]; got != "0" {
			t.Errorf("active turns after they ended: %s, want 0", got)
		}
	})
}

// TestHandleBoundsLabels: label values that do not come from a fixed set
// are bounded, so a runner cannot blow up the series count.
func TestHandleBoundsLabels(t *testing.T) {
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		ev   event.Event
		want string
	}{
		{"odd step kind", event.Event{Kind: event.StepCompleted, Time: at.Add(time.Second),
			Step: event.Step{Kind: "tool call; DROP", StartedAt: at}}, `turnguard_step_duration_seconds{kind="other"} count`},
		{"no step kind", event.Event{Kind: event.StepCompleted, Time: at.Add(time.Second),
			Step: event.Step{Name: "x", StartedAt: at}}, `turnguard_step_duration_seconds{kind="none"} count`},
		{"no channel", event.Event{Kind: event.TurnStarted}, `turnguard_turns_started_total{channel="none"}`},
		{"unknown stop reason", event.Event{Kind: event.Finished, Channel: "ws", StopReason: "bogus"},
			`turnguard_turns_finished_total{channel="ws",stop_reason="other"}`},
		{"long channel", event.Event{Kind: event.Progress, Channel: strings.Repeat("c", 41)},
			`turnguard_progress_notices_total{channel="other"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := metrics.New("test")
			m.Handle(tt.ev)
			if got := series(scrape(t, m.Handler()))[tt.want]; got != "1" {
				t.Errorf("%s = %q, want 1", tt.want, got)
			}
		})
	}
}

// TestStepWithoutStartTimeIsNotObserved: a completion without a start time
// (an event from elsewhere) adds no bogus duration.
func TestStepWithoutStartTimeIsNotObserved(t *testing.T) {
	m := metrics.New("test")
	m.Handle(event.Event{Kind: event.StepCompleted, Time: time.Now(), Step: event.Step{Kind: "tool", Name: "x"}})
	for k := range series(scrape(t, m.Handler())) {
		if strings.HasPrefix(k, "turnguard_step_duration_seconds") {
			t.Errorf("unexpected %s", k)
		}
	}
}

// TestOutboxQueryFailure: a failing outbox query costs only that metric;
// the rest of the scrape is served.
func TestOutboxQueryFailure(t *testing.T) {
	m := metrics.New("test")
	m.AddSources(metrics.Sources{WSClients: func() int { return 1 }, Outbox: fakeCounts{err: errors.New("database is locked")}})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	if !strings.Contains(body, "turnguard_ws_clients 1") {
		t.Errorf("ws_clients missing when the outbox query fails:\n%s", body)
	}
	if strings.Contains(body, "turnguard_outbox_messages{") {
		t.Errorf("outbox series served although the query failed")
	}
}

// TestBuildInfo: the binary's version is a label of turnguard_build_info,
// and so is the revision the build set (issue 22: revision="unknown" when
// Go's VCS stamp is off).
func TestBuildInfo(t *testing.T) {
	defer func(r string) { metrics.Revision = r }(metrics.Revision)
	metrics.Revision = "0123456789abcdef"
	fams := scrape(t, metrics.New("1.2.3").Handler())
	f := fams["turnguard_build_info"]
	if f == nil || len(f.GetMetric()) != 1 {
		t.Fatalf("turnguard_build_info missing")
	}
	var version, revision string
	for _, l := range f.GetMetric()[0].GetLabel() {
		switch l.GetName() {
		case "version":
			version = l.GetValue()
		case "revision":
			revision = l.GetValue()
		}
	}
	if version != "1.2.3" || revision != "0123456789abcdef" || f.GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Errorf("build_info %v", f.GetMetric()[0])
	}
	if fams["go_goroutines"] == nil || fams["process_start_time_seconds"] == nil {
		t.Errorf("Go runtime or process collector missing")
	}
}

// TestTelegramTransport: Bot API calls through the transport are counted
// by method and result, and the bot token never becomes a label.
func TestTelegramTransport(t *testing.T) {
	const token = "123456:SECRET-bot-token-value"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/sendMessage") && r.URL.Query().Get("fail") == "500":
			w.WriteHeader(http.StatusInternalServerError)
		case strings.HasSuffix(r.URL.Path, "/sendMessage") && r.URL.Query().Get("fail") == "429":
			w.WriteHeader(http.StatusTooManyRequests)
		case strings.HasSuffix(r.URL.Path, "/sendMessage") && r.URL.Query().Get("fail") == "403":
			w.WriteHeader(http.StatusForbidden)
		}
		_, _ = io.WriteString(w, `{"ok":true,"result":{}}`)
	}))
	defer srv.Close()
	m := metrics.New("test")
	client := &http.Client{Transport: m.TelegramTransport(nil)}
	call := func(method, query string) {
		t.Helper()
		res, err := client.Get(srv.URL + "/bot" + token + "/" + method + query)
		if err == nil {
			res.Body.Close()
		}
	}
	call("getMe", "")
	call("sendMessage", "")
	call("sendMessage", "")
	call("sendMessage", "?fail=500")
	call("sendMessage", "?fail=429")
	call("sendMessage", "?fail=403")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/bot"+token+"/getUpdates", nil)
	if res, err := client.Do(req); err == nil {
		res.Body.Close()
	}
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	if res, err := client.Get(deadURL + "/bot" + token + "/sendChatAction"); err == nil {
		res.Body.Close()
	}

	got := series(scrape(t, m.Handler()))
	want := map[string]string{
		`turnguard_telegram_api_calls_total{method="getMe",result="ok"}`:                     "1",
		`turnguard_telegram_api_calls_total{method="sendMessage",result="ok"}`:               "2",
		`turnguard_telegram_api_calls_total{method="sendMessage",result="server_error"}`:     "1",
		`turnguard_telegram_api_calls_total{method="sendMessage",result="rate_limited"}`:     "1",
		`turnguard_telegram_api_calls_total{method="sendMessage",result="client_error"}`:     "1",
		`turnguard_telegram_api_calls_total{method="getUpdates",result="canceled"}`:          "1",
		`turnguard_telegram_api_calls_total{method="sendChatAction",result="network_error"}`: "1",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %s", k, got[k], v)
		}
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if strings.Contains(rec.Body.String(), "SECRET") || strings.Contains(rec.Body.String(), "123456") {
		t.Errorf("the bot token leaked into /metrics")
	}
}

// fakeOutbox accepts every call except those on id 13.
type fakeOutbox struct{ metrics.Outbox }

func (fakeOutbox) check(id int64) error {
	if id == 13 {
		return store.ErrNotFound
	}
	return nil
}
func (f fakeOutbox) MarkDelivered(_ context.Context, id int64) error        { return f.check(id) }
func (f fakeOutbox) MarkAttempt(_ context.Context, id int64, _ error) error { return f.check(id) }
func (f fakeOutbox) MarkFailed(_ context.Context, id int64, _ string) error { return f.check(id) }

// TestOutboxCountsDeliveries: the wrapper counts what the outbox accepted.
func TestOutboxCountsDeliveries(t *testing.T) {
	m := metrics.New("test")
	ob := m.Outbox("telegram", fakeOutbox{})
	ctx := context.Background()
	_ = ob.MarkAttempt(ctx, 1, errors.New("HTTP 500"))
	_ = ob.MarkAttempt(ctx, 1, errors.New("HTTP 500"))
	_ = ob.MarkDelivered(ctx, 1)
	_ = ob.MarkFailed(ctx, 2, "chat not found")
	if err := ob.MarkDelivered(ctx, 13); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the inner error was not passed through: %v", err)
	}
	got := series(scrape(t, m.Handler()))
	for k, v := range map[string]string{
		`turnguard_deliveries_total{channel="telegram",result="retry"}`:     "2",
		`turnguard_deliveries_total{channel="telegram",result="delivered"}`: "1",
		`turnguard_deliveries_total{channel="telegram",result="failed"}`:    "1",
	} {
		if got[k] != v {
			t.Errorf("%s = %q, want %s", k, got[k], v)
		}
	}
}

// TestTurnsByClass: a gauge per stall class, from the engine's decision:
// a turn whose step completes is working; one whose step runs long but
// heartbeats is long-running; one silent past progressNotifyAfterSeconds
// is stalled; one that ignores its abort is stuck until force-finalized.
func TestTurnsByClass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := config.Default()
		c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(5)
		c.Agents.Defaults.StepTimeoutSeconds = secs(20)
		c.Agents.Defaults.AbortGraceSeconds = secs(10)
		m := metrics.New("test")
		d := demo.New(demo.WithStuckFor(time.Hour))
		eng, err := gateway.New(gateway.Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": d}, Log: quiet})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		eng.Start(ctx)
		defer func() { d.Release(); eng.Shutdown(context.Background()); cancel() }()
		m.AddSources(metrics.Sources{TurnClasses: eng.TurnClasses})
		for i, script := range []string{"/steps a:1s b:1s c:1s d:1s e:1s f:1s g:1s h:1s i:1s j:1s k:1s l:1s m:1s n:1s",
			"/steps build:1m:hb=1s", "/steps shell:hang", "/steps shell:stuck"} {
			if _, err := eng.Send(ctx, gateway.SendRequest{SessionKey: fmt.Sprint("s", i), Channel: "ws", Text: script}); err != nil {
				t.Fatal(err)
			}
		}
		byClass := func() string {
			s := series(scrape(t, m.Handler()))
			return fmt.Sprintf("working %s, long_running %s, stalled %s, stuck %s", s[`turnguard_turns_by_class{class="working"}`],
				s[`turnguard_turns_by_class{class="long_running"}`], s[`turnguard_turns_by_class{class="stalled"}`], s[`turnguard_turns_by_class{class="stuck"}`])
		}
		faketime.Advance(6500 * time.Millisecond)
		if got, want := byClass(), "working 1, long_running 1, stalled 2, stuck 0"; got != want {
			t.Errorf("at 6.5 s: %s, want %s", got, want)
		}
		faketime.Advance(15 * time.Second) // the silent ones pass their 20 s window: hang returns, stuck does not
		synctest.Wait()
		if got, want := byClass(), "working 0, long_running 1, stalled 0, stuck 1"; got != want {
			t.Errorf("at 21.5 s: %s, want %s", got, want)
		}
	})
}
