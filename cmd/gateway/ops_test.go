package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/fakebot"
)

// TestOperatorAlertOnForceFinalize: with the built binary, a turn whose
// runner ignores its step-timeout abort is force-finalized, and the operator
// gets one alert on the webhook and in the Telegram alert chat; the webhook
// secret never reaches the log; /api/diagnose counts it all.
func TestOperatorAlertOnForceFinalize(t *testing.T) {
	const hookSecret = "hook-key-SECRET-99"
	var mu sync.Mutex
	var hooks []map[string]any
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if r.Method != http.MethodPost || r.URL.Query().Get("key") != hookSecret || json.NewDecoder(r.Body).Decode(&body) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		hooks = append(hooks, body)
		mu.Unlock()
	}))
	defer hook.Close()
	bot := fakebot.New(t)

	dir := t.TempDir()
	cfg := fmt.Sprintf(`server:
  listen: 127.0.0.1:0
  token: %s
  operatorToken: %s
agents:
  defaults:
    stepTimeoutSeconds: 1
    abortGraceSeconds: 1
store:
  path: %s
channels:
  telegram:
    enabled: true
    token: %q
    apiURL: %s
    allowedChatIDs: [%d]
alerts:
  telegramChatIDs: [%d]
  webhookURL: %s/hook?key=%s
  window: 10m
`, testToken, crashOpToken, filepath.Join(dir, "gateway.db"), crashBotToken, bot.URL(), crashChat, crashChat, hook.URL, hookSecret)
	p := startGateway(t, dir, cfg)
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, "main", "run-stuck", "/steps shell:stuck")
	ab := aborted(t, cl.waitEvent("chat", 10*time.Second, chatState("run-stuck", "aborted")))
	if ab.StopReason != "step_timeout" {
		t.Fatalf("stop reason %q, want step_timeout", ab.StopReason)
	}

	// The alert: force-finalized after the 1s grace, then delivered.
	var alert map[string]any
	deadline := time.Now().Add(15 * time.Second)
	for alert == nil && time.Now().Before(deadline) {
		mu.Lock()
		if len(hooks) > 0 {
			alert = hooks[0]
		}
		mu.Unlock()
		time.Sleep(20 * time.Millisecond) // real time: waiting for another process
	}
	if alert == nil {
		t.Fatalf("no webhook alert within 15s")
	}
	if alert["kind"] != "force_finalized" || alert["runId"] != "run-stuck" || alert["step"] != "shell" || alert["stopReason"] != "step_timeout" {
		t.Errorf("webhook alert %v", alert)
	}
	waitSent(bot, "was force-finalized", 15*time.Second)

	var d struct {
		Counters struct{ ForceFinalizations, ProgressNotices int }
		Alerts   struct{ Raised, Delivered, Failed int }
	}
	operatorGet(t, p.addr, "/api/diagnose", &d)
	if d.Counters.ForceFinalizations != 1 || d.Alerts.Raised != 1 || d.Alerts.Delivered != 2 || d.Alerts.Failed != 0 {
		t.Errorf("diagnose counters %+v, alerts %+v", d.Counters, d.Alerts)
	}
	mu.Lock()
	n := len(hooks)
	mu.Unlock()
	if n != 1 {
		t.Errorf("%d webhook alerts, want exactly 1", n)
	}
	if strings.Contains(p.log(), hookSecret) || strings.Contains(p.log(), "SECRET") {
		t.Errorf("a secret is in the log")
	}
}
