package telegram

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gatewayProc is the gateway binary running against the fake API.
type gatewayProc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan error
}

// buildGateway builds cmd/gateway once per test run.
func buildGateway(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	bin := filepath.Join(t.TempDir(), "gateway")
	build := exec.Command("go", "build", "-o", bin, "./cmd/gateway")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/gateway: %v\n%s", err, out)
	}
	return bin
}

func startGateway(t *testing.T, bin, cfgPath string) *gatewayProc {
	t.Helper()
	p := &gatewayProc{stderr: &syncBuffer{}, done: make(chan error, 1)}
	p.cmd = exec.Command(bin, "-config", cfgPath)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GATEWAY_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Env = append(p.cmd.Env, "GATEWAY_LOG_LEVEL=debug")
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// stop sends sig and waits for the process to exit.
func (p *gatewayProc) stop(t *testing.T, sig syscall.Signal) error {
	t.Helper()
	_ = p.cmd.Process.Signal(sig)
	select {
	case err := <-p.done:
		return err
	case <-time.After(30 * time.Second): // real time: a process, not a bubble
		t.Fatalf("the gateway did not exit after %v:\n%s", sig, p.stderr.String())
		return nil
	}
}

func writeConfig(t *testing.T, dir, name, apiURL, db, timeouts string) string {
	t.Helper()
	return writeYAML(t, dir, name, fmt.Sprintf(`server:
  listen: 127.0.0.1:0
store:
  path: %s
agents:
  defaults:
    runner: demo
channels:
  telegram:
    enabled: true
    token: %q
    apiURL: %s
    mode: polling
    timeouts:
%s
`, db, testToken, apiURL, timeouts))
}

func writeYAML(t *testing.T, dir, name, yaml string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestScenarioBinary runs the built gateway binary (polling mode) against
// the fake Bot API with the demo runner's /steps scripts, in real time
// with short limits: the happy path, heartbeats keeping a long step alive
// (with its progress notice edited in place), the step timeout, the wall
// clock, a stuck runner, /stop, a graceful restart (the shutdown notice,
// then the gateway answers again), the ceiling, and a crash (the
// "interrupted" notice from the outbox at the next start).
func TestScenarioBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the gateway binary for about half a minute of real time")
	}
	t0 := time.Now()
	bin := buildGateway(t)
	mark := func(what string) { t.Logf("%6.1fs %s", time.Since(t0).Seconds(), what) }
	mark("built")
	api := newFakeAPI(testToken)
	srv := httptest.NewServer(api)
	defer srv.Close()
	dir := t.TempDir()
	db := filepath.Join(dir, "turnguard.db")
	cfg1 := writeConfig(t, dir, "gateway.yaml", srv.URL, db, `      stepTimeoutSeconds: 2
      timeoutSeconds: 6
      maxTurnTimeSeconds: 20
      progressNotifyAfterSeconds: 1
      progressRepeatSeconds: 1
      abortGraceSeconds: 1`)
	cfg2 := writeConfig(t, dir, "ceiling.yaml", srv.URL, db, `      stepTimeoutSeconds: 2
      timeoutSeconds: 100
      maxTurnTimeSeconds: 3
      progressNotifyAfterSeconds: 10
      abortGraceSeconds: 1`)

	last := func(chat int64) string {
		s := api.screen(chat)
		if len(s) == 0 {
			return ""
		}
		return s[len(s)-1]
	}
	waitLast := func(p *gatewayProc, chat int64, what string, ok func(string) bool) {
		t.Helper()
		deadline := time.After(20 * time.Second) // real time: the gateway runs real timeouts
		for !ok(last(chat)) {
			select {
			case <-api.notify:
			case <-deadline:
				t.Fatalf("chat %d: no %s; it shows %q\ngateway log:\n%s", chat, what, api.screen(chat), p.stderr.String())
			}
		}
	}
	is := func(want string) func(string) bool { return func(s string) bool { return s == want } }
	prefix := func(want string) func(string) bool { return func(s string) bool { return strings.HasPrefix(s, want) } }
	waitTyping := func(p *gatewayProc, chat int64) {
		t.Helper()
		deadline := time.After(20 * time.Second) // real time
		for len(api.callsTo("sendChatAction", chat)) == 0 {
			select {
			case <-api.notify:
			case <-deadline:
				t.Fatalf("chat %d: the turn never started\n%s", chat, p.stderr.String())
			}
		}
	}
	waitPolling := func(p *gatewayProc) {
		t.Helper()
		deadline := time.After(60 * time.Second) // real time: start-up of a process
		for {
			api.mu.Lock()
			n := api.getUpdates
			api.mu.Unlock()
			if n > 0 {
				return
			}
			select {
			case <-api.notify:
			case <-deadline:
				t.Fatalf("the gateway never polled:\n%s", p.stderr.String())
			}
		}
	}
	pollsNow := func() int {
		api.mu.Lock()
		defer api.mu.Unlock()
		return api.getUpdates
	}

	p := startGateway(t, bin, cfg1)
	waitPolling(p)

	// Happy path.
	api.say(1, "/steps web_search:200ms say:Hello_from_the_binary")
	waitLast(p, 1, "reply", is("Hello from the binary"))

	mark("next: Liveness: heartbe")
	// Liveness: heartbeats keep a 3 s step alive past the 2 s liveness
	// window; its progress notice is one message, edited in place.
	api.say(2, "/steps build:3s:hb=500ms say:Built")
	waitLast(p, 2, "reply", is("Built"))
	deadline := time.After(10 * time.Second) // real time
	for !strings.HasPrefix(api.screen(2)[0], "✅ build finished after 3") {
		select {
		case <-api.notify:
		case <-deadline:
			t.Fatalf("the notice was not closed: %q", api.screen(2))
		}
	}
	if n := len(api.callsTo("sendMessage", 2)); n != 2 {
		t.Errorf("chat 2 got %d messages, want 2 (the notice, edited in place, and the reply): %q", n, api.screen(2))
	}
	if len(api.callsTo("editMessageText", 2)) < 2 {
		t.Errorf("the notice was not edited in place: %q", callLines(api.callsTo("editMessageText", 2)))
	}

	mark("next: Step timeout.")
	// Step timeout.
	api.say(3, "/steps web_search:100ms shell:hang")
	waitLast(p, 3, "step timeout", is("⚠️ No progress for 2 s — shell never finished (last completed: web_search). The task may be stuck. Retry or ask for a simpler approach."))

	mark("next: Wall clock.")
	// Wall clock.
	api.say(4, "/steps build:1m:hb=500ms")
	waitLast(p, 4, "wall-clock timeout", is("⚠️ This request was stopped at its time limit of 6 s while build was running. Try again, or ask for something smaller."))

	mark("next: A stuck runner")
	// A stuck runner: stopped by the liveness limit, the session is free
	// again after the abort grace.
	api.say(5, "/steps shell:stuck")
	waitLast(p, 5, "step timeout", prefix("⚠️ No progress for 2 s — shell never finished."))
	time.Sleep(1500 * time.Millisecond) // real time: the 1 s abort grace of the stuck runner
	api.say(5, "/steps say:Free_again")
	waitLast(p, 5, "reply after the grace", is("Free again"))

	mark("next: /stop.")
	// /stop.
	api.say(6, "/steps shell:hang:hb=500ms")
	waitTyping(p, 6)
	api.say(6, "/stop")
	waitLast(p, 6, "stop notice", prefix("⏹️ Stopped"))

	mark("next: Graceful restart")
	// Graceful restart: the running turn ends with the shutdown notice.
	api.say(7, "/steps build:1m:hb=500ms")
	waitTyping(p, 7)
	if err := p.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("gateway exit after SIGTERM: %v\n%s", err, p.stderr.String())
	}
	if got := last(7); !strings.HasPrefix(got, "⚠️ The gateway is shutting down, so your request was stopped after") {
		t.Errorf("after SIGTERM chat 7 shows %q, want the shutdown notice\n%s", api.screen(7), p.stderr.String())
	}
	checkNoToken(t, p)

	mark("next: Start again")
	// Start again (with a ceiling below the wall clock): it answers, and
	// the ceiling stops a long turn.
	polls := pollsNow()
	p = startGateway(t, bin, cfg2)
	for pollsNow() == polls {
		select {
		case <-api.notify:
		case <-time.After(60 * time.Second): // real time: process start-up
			t.Fatalf("the restarted gateway never polled:\n%s", p.stderr.String())
		}
	}
	api.say(7, "/steps say:Back")
	waitLast(p, 7, "reply after the restart", is("Back"))
	api.say(8, "/steps build:1m:hb=500ms")
	waitLast(p, 8, "ceiling", is("⚠️ This request reached the maximum time of 3 s while build was running. It was stopped; please split it into smaller requests."))

	mark("next: Crash: the turn")
	// Crash: the turn is cut off without a shutdown; at the next start the
	// gateway sends the "interrupted" notice from the outbox.
	api.say(9, "/steps build:1m:hb=500ms")
	waitTyping(p, 9)
	time.Sleep(500 * time.Millisecond) // real time: let the store record the running turn
	_ = p.stop(t, syscall.SIGKILL)
	checkNoToken(t, p)
	mark("killed")
	p = startGateway(t, bin, cfg1)
	waitLast(p, 9, "interrupted notice", prefix("⚠️ Your request was interrupted by a server problem"))
	mark("interrupted notice")
	if err := p.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("gateway exit: %v", err)
	}
	mark("stopped")
	checkNoToken(t, p)
	for chat := int64(1); chat <= 9; chat++ {
		for _, m := range api.screen(chat) {
			if slices.Contains([]string{"", "…"}, m) {
				t.Errorf("chat %d got an empty message", chat)
			}
		}
	}
}

func checkNoToken(t *testing.T, p *gatewayProc) {
	t.Helper()
	if logs := p.stderr.String(); strings.Contains(logs, testToken) {
		t.Errorf("the bot token is in the gateway's log:\n%s", logs)
	}
}

// TestScenarioWebhook runs the built gateway in webhook mode: it registers
// the webhook with its secret, serves POST /telegram/webhook on its own
// router, refuses a wrong secret and answers an accepted update.
func TestScenarioWebhook(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the gateway binary")
	}
	bin := buildGateway(t)
	api := newFakeAPI(testToken)
	srv := httptest.NewServer(api)
	defer srv.Close()
	dir := t.TempDir()
	const secret = "scenario_webhook-secret"
	cfg := writeYAML(t, dir, "webhook.yaml", fmt.Sprintf(`server:
  listen: 127.0.0.1:0
store:
  path: %s
channels:
  telegram:
    enabled: true
    token: %q
    apiURL: %s
    mode: webhook
    webhookSecret: %s
    webhookURL: https://bot.example.com/telegram/webhook
`, filepath.Join(dir, "turnguard.db"), testToken, srv.URL, secret))
	p := startGateway(t, bin, cfg)

	// The address the gateway bound, from its "listening" line.
	var addr string
	deadline := time.After(60 * time.Second) // real time: process start-up
	for addr == "" {
		if m := listenAddr.FindStringSubmatch(p.stderr.String()); m != nil {
			addr = m[1]
			break
		}
		select {
		case <-api.notify:
		case <-deadline:
			t.Fatalf("the gateway did not start:\n%s", p.stderr.String())
		case <-time.After(100 * time.Millisecond): // real time: polling the process's log
		}
	}
	waitUntil(t, api, 20*time.Second, "setWebhook", func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		return api.webhook != nil
	})
	api.mu.Lock()
	wh := api.webhook
	api.mu.Unlock()
	if wh["url"] != "https://bot.example.com/telegram/webhook" || wh["secret_token"] != secret {
		t.Errorf("setWebhook got %v", wh)
	}

	update := `{"update_id":1,"message":{"message_id":1,"date":1,"chat":{"id":31,"type":"private"},"from":{"id":31,"first_name":"A"},"text":"/steps say:Hooked"}}`
	post := func(secretHeader string) int {
		t.Helper()
		// Start-up calls finish just before the webhook accepts updates:
		// a 503 asks to come back, as Telegram would.
		for range 50 {
			req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/telegram/webhook", strings.NewReader(update))
			req.Header.Set(SecretHeader, secretHeader)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				return resp.StatusCode
			}
			time.Sleep(100 * time.Millisecond) // real time: Retry-After of a starting process
		}
		return http.StatusServiceUnavailable
	}
	if code := post("wrong"); code != http.StatusUnauthorized {
		t.Errorf("wrong secret: status %d, want 401", code)
	}
	if code := post(secret); code != http.StatusOK {
		t.Errorf("right secret: status %d, want 200", code)
	}
	waitUntil(t, api, 20*time.Second, "the reply", func() bool { return slices.Equal(api.screen(31), []string{"Hooked"}) })
	if err := p.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("gateway exit: %v", err)
	}
	checkNoToken(t, p)
	if strings.Contains(p.stderr.String(), secret) {
		t.Errorf("the webhook secret is in the gateway's log")
	}
}

var listenAddr = regexp.MustCompile(`msg=listening addr=(\S+)`)
