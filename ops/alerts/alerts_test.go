package alerts_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/ops/alerts"

	"github.com/turnguard/turnguard/internal/faketime"
)

const (
	hookSecret = "HOOKSECRET-4f1e"
	hookURL    = "https://hooks.example.test/turnguard?token=" + hookSecret
	chatID     = int64(-1001234)
)

// delivery is one message an operator received.
type delivery struct {
	at     time.Duration // since the test started
	target string        // "telegram" or "webhook"
	alert  alerts.Alert  // for the webhook: the decoded body; for Telegram: Text only
}

func (d delivery) String() string {
	kind := string(d.alert.Kind)
	if d.target == "telegram" {
		kind = "text"
	}
	return fmt.Sprintf("%v %s %s count=%d", d.at, d.target, kind, d.alert.Count)
}

// operator records what the Telegram chat and the webhook received.
type operator struct {
	start time.Time
	mu    sync.Mutex
	got   []delivery

	// failures: the next n calls of each target fail.
	tgFail   int
	hookCode []int // status codes answered in turn; 200 once exhausted
	hookReqs []*http.Request
}

func (o *operator) SendText(_ context.Context, chat int64, text string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if chat != chatID {
		return fmt.Errorf("unexpected chat %d", chat)
	}
	if o.tgFail > 0 {
		o.tgFail--
		return errors.New("telegram server error: HTTP 502")
	}
	o.got = append(o.got, delivery{at: time.Since(o.start), target: "telegram", alert: alerts.Alert{Text: text}})
	return nil
}

// ServeHTTP is the webhook receiver.
func (o *operator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.hookReqs = append(o.hookReqs, r)
	if len(o.hookCode) > 0 {
		code := o.hookCode[0]
		o.hookCode = o.hookCode[1:]
		if code != http.StatusOK {
			if code == http.StatusFound {
				w.Header().Set("Location", "https://elsewhere.example.test/")
			}
			w.WriteHeader(code)
			return
		}
	}
	var al alerts.Alert
	if err := json.NewDecoder(r.Body).Decode(&al); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	o.got = append(o.got, delivery{at: time.Since(o.start), target: "webhook", alert: al})
}

func (o *operator) deliveries() []delivery {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.got)
}

// memTransport serves requests with a handler in memory: no sockets, so the
// synctest bubble's clock is never held up by network I/O.
type memTransport struct{ h http.Handler }

func (m memTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	body, _ := io.ReadAll(r.Body)
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(bytes.NewReader(body))
	m.h.ServeHTTP(rec, r2)
	return rec.Result(), nil
}

type harness struct {
	a    *alerts.Alerter
	op   *operator
	logs *bytes.Buffer
	stop func()
}

func newHarness(t *testing.T, c config.Alerts, op *operator, tg alerts.TelegramSender) *harness {
	t.Helper()
	cfg := config.Default()
	cfg.Alerts = c
	logs := &bytes.Buffer{}
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, logs}, nil))
	op.start = time.Now()
	a, err := alerts.New(alerts.Options{Config: config.NewSource(cfg), Telegram: tg,
		HTTPClient: &http.Client{Transport: memTransport{op}}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Run(ctx)
	}()
	h := &harness{a: a, op: op, logs: logs, stop: func() { cancel(); <-done }}
	t.Cleanup(h.stop)
	return h
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Event constructors.
func forced(run string) event.Event {
	return event.Event{Kind: event.ForceFinalized, RunID: run, SessionKey: "agent:main:" + run, Channel: "ws",
		StopReason: event.ReasonStepTimeout, Elapsed: 5 * time.Second, Step: event.Step{Kind: "tool", Name: "shell"}}
}

func stepTimeout(run string) event.Event {
	return event.Event{Kind: event.Aborted, RunID: run, SessionKey: "telegram:42", Channel: "telegram",
		StopReason: event.ReasonStepTimeout, Step: event.Step{Kind: "tool", Name: "web_search"}}
}

// at is one input of a timeline: ev is handled at offset from the start.
type at struct {
	offset time.Duration
	ev     event.Event
}

var defaults = config.Alerts{TelegramChatIDs: []int64{chatID}, WebhookURL: hookURL, StepTimeoutBurst: 3, Window: 10 * time.Minute}

// TestEpisodes: one alert when an episode begins, nothing while it lasts,
// one recovered message when a whole window has passed quietly. Both
// targets get every message.
func TestEpisodes(t *testing.T) {
	tests := []struct {
		name   string
		events []at
		until  time.Duration
		want   []string // webhook deliveries; Telegram must get the same times
	}{
		{
			name:   "one force-finalization, then quiet",
			events: []at{{0, forced("r1")}},
			until:  time.Hour,
			want:   []string{"0s webhook force_finalized count=1", "10m0s webhook recovered count=1"},
		},
		{
			name:   "force-finalizations within the episode are not repeated",
			events: []at{{0, forced("r1")}, {3 * time.Minute, forced("r2")}, {9 * time.Minute, forced("r3")}},
			until:  time.Hour,
			want:   []string{"0s webhook force_finalized count=1", "19m0s webhook recovered count=3"},
		},
		{
			name:   "a new episode after recovery alerts again",
			events: []at{{0, forced("r1")}, {30 * time.Minute, forced("r2")}},
			until:  time.Hour,
			want: []string{"0s webhook force_finalized count=1", "10m0s webhook recovered count=1",
				"30m0s webhook force_finalized count=1", "40m0s webhook recovered count=1"},
		},
		{
			name:   "step timeouts below the burst raise nothing",
			events: []at{{0, stepTimeout("r1")}, {time.Minute, stepTimeout("r2")}},
			until:  time.Hour,
			want:   nil,
		},
		{
			name:   "a burst within the window alerts once; later ones extend it",
			events: []at{{0, stepTimeout("r1")}, {time.Minute, stepTimeout("r2")}, {2 * time.Minute, stepTimeout("r3")}, {5 * time.Minute, stepTimeout("r4")}},
			until:  time.Hour,
			want:   []string{"2m0s webhook step_timeout_burst count=3", "15m0s webhook recovered count=4"},
		},
		{
			name:   "step timeouts spread wider than the window are no burst",
			events: []at{{0, stepTimeout("r1")}, {6 * time.Minute, stepTimeout("r2")}, {12 * time.Minute, stepTimeout("r3")}, {18 * time.Minute, stepTimeout("r4")}},
			until:  time.Hour,
			want:   nil,
		},
		{
			name: "the two kinds are independent episodes",
			events: []at{{0, stepTimeout("r1")}, {time.Minute, forced("r2")}, {time.Minute, stepTimeout("r3")},
				{2 * time.Minute, stepTimeout("r4")}},
			until: time.Hour,
			want: []string{"1m0s webhook force_finalized count=1", "2m0s webhook step_timeout_burst count=3",
				"11m0s webhook recovered count=1", "12m0s webhook recovered count=3"},
		},
		{
			name: "other endings are ignored",
			events: []at{{0, event.Event{Kind: event.Aborted, StopReason: event.ReasonTimeout}}, {0, event.Event{Kind: event.Aborted, StopReason: event.ReasonUser}},
				{0, event.Event{Kind: event.Finished, StopReason: event.ReasonError}}, {0, event.Event{Kind: event.Progress}}},
			until: time.Hour,
			want:  nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				op := &operator{}
				h := newHarness(t, defaults, op, op)
				var now time.Duration
				for _, in := range tt.events {
					faketime.Advance(in.offset - now)
					now = in.offset
					h.a.Handle(in.ev)
					synctest.Wait()
				}
				faketime.Advance(tt.until - now)
				synctest.Wait()

				var hook, tg []string
				for _, d := range op.deliveries() {
					if d.target == "webhook" {
						hook = append(hook, d.String())
					} else {
						tg = append(tg, d.at.String())
					}
				}
				if !slices.Equal(hook, tt.want) {
					t.Errorf("webhook got\n  %s\nwant\n  %s", strings.Join(hook, "\n  "), strings.Join(tt.want, "\n  "))
				}
				var wantTimes []string
				for _, w := range tt.want {
					wantTimes = append(wantTimes, strings.Fields(w)[0])
				}
				if !slices.Equal(tg, wantTimes) {
					t.Errorf("telegram got messages at %v, want at %v", tg, wantTimes)
				}
			})
		})
	}
}

// TestAlertContent: what the operator reads and what the webhook gets.
func TestAlertContent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		op := &operator{}
		h := newHarness(t, defaults, op, op)
		h.a.Handle(forced("run-7"))
		synctest.Wait()
		faketime.Advance(10 * time.Minute)
		synctest.Wait()
		got := op.deliveries()
		if len(got) != 4 {
			t.Fatalf("got %d deliveries, want 4: %v", len(got), got)
		}
		tgAlert, hookAlert, tgRecovered, hookRecovered := got[0].alert, got[1].alert, got[2].alert, got[3].alert
		for _, want := range []string{"run-7", "agent:main:run-7", "force-finalized", "step_timeout", "5 s", "shell was running", "10 min"} {
			if !strings.Contains(tgAlert.Text, want) {
				t.Errorf("Telegram alert %q lacks %q", tgAlert.Text, want)
			}
		}
		if !strings.Contains(tgRecovered.Text, "recovered") || !strings.Contains(tgRecovered.Text, "1 force-finalized") {
			t.Errorf("recovered text %q", tgRecovered.Text)
		}
		if hookAlert.Text != tgAlert.Text || hookAlert.Source != "turnguard" || hookAlert.RunID != "run-7" ||
			hookAlert.SessionKey != "agent:main:run-7" || hookAlert.Channel != "ws" || hookAlert.Step != "shell" ||
			hookAlert.StopReason != event.ReasonStepTimeout || hookAlert.WindowSeconds != 600 || hookAlert.Count != 1 {
			t.Errorf("webhook alert %+v", hookAlert)
		}
		if hookRecovered.Kind != alerts.KindRecovered || hookRecovered.Episode != hookAlert.Episode || hookRecovered.RunID != "" {
			t.Errorf("recovered %+v does not close episode %s", hookRecovered, hookAlert.Episode)
		}
		op.mu.Lock()
		req := op.hookReqs[0]
		op.mu.Unlock()
		if req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json" ||
			req.URL.String() != hookURL {
			t.Errorf("webhook request %s %s %s", req.Method, req.URL, req.Header.Get("Content-Type"))
		}
	})
}

// TestDeliveryRetries: failures are retried with backoff, a bounded number
// of times; a refusal (4xx) or a redirect is not retried; nothing of this
// holds up the next alert's tracking. The webhook secret never reaches the
// log.
func TestDeliveryRetries(t *testing.T) {
	tests := []struct {
		name      string
		hookCodes []int
		tgFail    int
		wantHook  []time.Duration // when the webhook received the alert
		wantTG    []time.Duration
		wantStats alerts.Stats
		wantLog   string
	}{
		{
			name: "all well", wantHook: []time.Duration{0}, wantTG: []time.Duration{0},
			wantStats: alerts.Stats{Raised: 1, Delivered: 2},
		},
		{
			name: "webhook fails twice then succeeds", hookCodes: []int{500, 503},
			wantHook: []time.Duration{6 * time.Second}, wantTG: []time.Duration{0},
			wantStats: alerts.Stats{Raised: 1, Delivered: 2}, wantLog: "retrying",
		},
		{
			name: "webhook keeps failing: given up after three tries", hookCodes: []int{500, 500, 500, 500},
			wantHook: nil, wantTG: []time.Duration{0},
			wantStats: alerts.Stats{Raised: 1, Delivered: 1, Failed: 1}, wantLog: "not delivered",
		},
		{
			name: "webhook refuses: no retry", hookCodes: []int{403},
			wantHook: nil, wantTG: []time.Duration{0},
			wantStats: alerts.Stats{Raised: 1, Delivered: 1, Failed: 1}, wantLog: "HTTP 403",
		},
		{
			name: "webhook redirects: not followed, not retried", hookCodes: []int{302},
			wantHook: nil, wantTG: []time.Duration{0},
			wantStats: alerts.Stats{Raised: 1, Delivered: 1, Failed: 1}, wantLog: "redirect",
		},
		{
			name: "telegram fails once", tgFail: 1,
			wantHook: []time.Duration{2 * time.Second}, wantTG: []time.Duration{2 * time.Second},
			wantStats: alerts.Stats{Raised: 1, Delivered: 2}, wantLog: "retrying",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				op := &operator{hookCode: tt.hookCodes, tgFail: tt.tgFail}
				h := newHarness(t, defaults, op, op)
				h.a.Handle(forced("r1"))
				faketime.Advance(time.Minute)
				synctest.Wait()
				var hook, tg []time.Duration
				for _, d := range op.deliveries() {
					if d.alert.Kind == alerts.KindRecovered {
						continue
					}
					if d.target == "webhook" {
						hook = append(hook, d.at)
					} else if !strings.Contains(d.alert.Text, "recovered") {
						tg = append(tg, d.at)
					}
				}
				if !slices.Equal(hook, tt.wantHook) || !slices.Equal(tg, tt.wantTG) {
					t.Errorf("webhook at %v, telegram at %v; want %v and %v", hook, tg, tt.wantHook, tt.wantTG)
				}
				if got := h.a.Stats(); got != tt.wantStats {
					t.Errorf("stats %+v, want %+v", got, tt.wantStats)
				}
				logs := h.logs.String()
				if tt.wantLog != "" && !strings.Contains(logs, tt.wantLog) {
					t.Errorf("log lacks %q:\n%s", tt.wantLog, logs)
				}
				if strings.Contains(logs, hookSecret) {
					t.Errorf("the webhook secret is in the log:\n%s", logs)
				}
			})
		})
	}
}

// TestTelegramNotRunning: chats configured without a running Telegram
// channel are skipped (and logged); the webhook still gets the alert.
func TestTelegramNotRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		op := &operator{}
		h := newHarness(t, defaults, op, nil)
		h.a.Handle(forced("r1"))
		synctest.Wait()
		got := op.deliveries()
		if len(got) != 1 || got[0].target != "webhook" {
			t.Fatalf("deliveries %v, want the webhook only", got)
		}
		if !strings.Contains(h.logs.String(), "Telegram channel is not running") {
			t.Errorf("no log line for the skipped chat:\n%s", h.logs)
		}
	})
}

// slowOperator's webhook never answers until released.
type slowOperator struct{ release chan struct{} }

func (s slowOperator) RoundTrip(r *http.Request) (*http.Response, error) {
	select {
	case <-s.release:
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
}

// TestHandleNeverBlocks: with deliveries stuck, the bus handler still
// returns at once; events beyond the queue are counted as dropped.
func TestHandleNeverBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := config.Default()
		cfg.Alerts = config.Alerts{WebhookURL: hookURL, StepTimeoutBurst: 1, Window: time.Minute}
		slow := slowOperator{release: make(chan struct{})}
		a, err := alerts.New(alerts.Options{Config: config.NewSource(cfg), HTTPClient: &http.Client{Transport: slow},
			Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		// Not running: nothing consumes the queue.
		for i := range 1000 {
			a.Handle(stepTimeout(fmt.Sprint("r", i)))
		}
		if got := a.Stats().DroppedEvents; got != 1000-256 {
			t.Errorf("dropped %d events, want %d", got, 1000-256)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); a.Run(ctx) }()
		synctest.Wait()
		start := time.Now()
		for range 10 {
			a.Handle(forced("x"))
		}
		if time.Since(start) != 0 {
			t.Errorf("Handle blocked")
		}
		close(slow.release)
		cancel()
		<-done
	})
}

// TestNewRequiresConfig: a clear error, not a crash.
func TestNewRequiresConfig(t *testing.T) {
	if _, err := alerts.New(alerts.Options{}); err == nil || !strings.Contains(err.Error(), "config") {
		t.Errorf("New without config: %v", err)
	}
}

// TestStuckRunsAlert: a runner reaching its cap of stuck runs raises one
// stuck_runs alert (a repeated signal raises nothing), and dropping below the
// cap closes it with a recovered alert, whatever the window.
func TestStuckRunsAlert(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		op := &operator{}
		h := newHarness(t, config.Alerts{WebhookURL: hookURL, Window: 10 * time.Minute}, op, nil)
		h.a.StuckRuns("exec", 16, 16, true)
		h.a.StuckRuns("exec", 16, 16, true)
		synctest.Wait()
		faketime.Advance(time.Minute)
		h.a.StuckRuns("exec", 15, 16, false)
		synctest.Wait()
		got := op.deliveries()
		if lines := deliveryLines(got); lines != "0s webhook stuck_runs count=16; 1m0s webhook recovered count=16" {
			t.Fatalf("deliveries %s", lines)
		}
		if a := got[0].alert; !strings.Contains(a.Text, "runner exec has 16 turns") || !strings.Contains(a.Text, "refused") ||
			got[1].alert.Episode != a.Episode || !strings.Contains(got[1].alert.Text, "accepts new turns again") {
			t.Fatalf("alerts %+v", got)
		}
	})
}

// deliveryLines is got, one delivery per "; "-separated part.
func deliveryLines(got []delivery) string {
	var lines []string
	for _, d := range got {
		lines = append(lines, d.String())
	}
	return strings.Join(lines, "; ")
}

// TestAgentSignInAlert: runner acp's agent needs a sign-in (twice: one
// alert naming the runner and the reference; another runner's is its own
// episode), then it answers again (one recovered message closing that
// episode); a success with no episode open says nothing.
func TestAgentSignInAlert(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		op := &operator{}
		h := newHarness(t, config.Alerts{WebhookURL: hookURL, Window: 10 * time.Minute}, op, nil)
		need := errors.New("the ACP agent needs the operator to sign in (reference auth-0123abcd)")
		h.a.AgentSignIn("other", nil)
		h.a.AgentSignIn("acp", need)
		h.a.AgentSignIn("acp", need)
		synctest.Wait()
		faketime.Advance(2 * time.Minute)
		h.a.AgentSignIn("acp", nil)
		h.a.AgentSignIn("acp", nil)
		synctest.Wait()
		got := op.deliveries()
		if lines := deliveryLines(got); lines != "0s webhook agent_sign_in count=1; 2m0s webhook recovered count=1" {
			t.Fatalf("deliveries %s", lines)
		}
		if a := got[0].alert; !strings.Contains(a.Text, "runner acp") || !strings.Contains(a.Text, "auth-0123abcd") ||
			!strings.Contains(a.Text, "agents.acp.authMethod") || got[1].alert.Episode != a.Episode ||
			!strings.Contains(got[1].alert.Text, "after 2 min") {
			t.Fatalf("alerts %+v", got)
		}
	})
}

// TestStoreUnwritableAlert: the store reports it cannot write (twice: one
// alert), then that it writes again (one recovered message closing that
// episode).
func TestStoreUnwritableAlert(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		op := &operator{}
		h := newHarness(t, defaults, op, op)
		full := errors.New("store cannot write since 2000-01-01T00:00:00Z: the disk is full")
		h.a.StoreHealth(full)
		h.a.StoreHealth(full)
		synctest.Wait()
		faketime.Advance(90 * time.Second)
		h.a.StoreHealth(nil)
		h.a.StoreHealth(nil)
		synctest.Wait()
		got := op.deliveries()
		want := []string{"0s telegram text count=0", "0s webhook store_unwritable count=1",
			"1m30s telegram text count=0", "1m30s webhook recovered count=1"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("deliveries = %v, want %v", got, want)
		}
		if al := got[1].alert; !strings.Contains(al.Text, "disk is full") || !strings.Contains(al.Text, "New turns are refused") {
			t.Errorf("alert text %q", al.Text)
		}
		if rec := got[3].alert; rec.Episode != got[1].alert.Episode || !strings.Contains(rec.Text, "1 min 30 s") {
			t.Errorf("recovered %+v does not close episode %s after 1m30s", rec, got[1].alert.Episode)
		}
	})
}
