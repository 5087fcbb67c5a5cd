//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

const (
	token = "e2e-token-2f9c-7a1e"
	// stepTimeout is agents.defaults.stepTimeoutSeconds of the e2e gateway.
	stepTimeout = 2
)

// env holds what run.sh provides.
var env struct {
	gateway, node, openclaw, nodeModules, chromium, artifacts string
}

// gw is the gateway under test, shared by all tests.
var gw *gatewayProc

func TestMain(m *testing.M) {
	for _, v := range []struct {
		dst  *string
		name string
	}{{&env.gateway, "E2E_GATEWAY"}, {&env.node, "E2E_NODE"}, {&env.openclaw, "E2E_OPENCLAW"},
		{&env.nodeModules, "E2E_NODE_MODULES"}, {&env.chromium, "E2E_CHROMIUM"}, {&env.artifacts, "E2E_ARTIFACTS"}} {
		*v.dst = os.Getenv(v.name)
		if *v.dst == "" {
			fmt.Fprintf(os.Stderr, "e2e: %s is not set; run the end-to-end tests with `make e2e`\n", v.name)
			os.Exit(1)
		}
	}
	if err := os.MkdirAll(env.artifacts, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "turnguard-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := startGateway(dir); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n%s", err, gatewayLog())
		os.Exit(1)
	}
	code := m.Run()
	stopACPGateway()
	stopGateway()
	_ = os.WriteFile(filepath.Join(env.artifacts, "gateway.log"), []byte(gatewayLog()), 0o644)
	os.RemoveAll(dir)
	os.Exit(code)
}

func startGateway(dir string) error {
	var err error
	gw, err = launchGateway(dir, gatewayConfig(dir, ""))
	return err
}

// gatewayConfig is the e2e gateway's YAML with its store in dir; extra is
// appended (a top-level section, e.g. channels:).
func gatewayConfig(dir, extra string) string {
	return fmt.Sprintf(`# The e2e gateway: loopback, a token, a short step timeout, a short queue.
server:
  listen: 127.0.0.1:0
  token: %s
agents:
  defaults:
    runner: demo
    stepTimeoutSeconds: %d
    progressNotifyAfterSeconds: 1
    progressRepeatSeconds: 1
    abortGraceSeconds: 2
    busy:
      maxQueued: 1 # the default mode (queue), one message waiting: the next is refused
store:
  path: %s
`, token, stepTimeout, filepath.Join(dir, "e2e.db")) + extra
}

func stopGateway() { gw.stop() }

func gatewayLog() string { return gw.logs() }

func wsURL() string { return "ws://" + gw.addr }

// clientEnv is an isolated environment for the OpenClaw CLI/TUI: its own
// HOME and state directory, so nothing under ~ is read or written.
func clientEnv(t *testing.T) []string {
	t.Helper()
	home := t.TempDir()
	return []string{
		"HOME=" + home,
		"OPENCLAW_HOME=" + home,
		"OPENCLAW_STATE_DIR=" + filepath.Join(home, "state"),
		"OPENCLAW_CONFIG_PATH=" + filepath.Join(home, "state", "openclaw.json"),
		"OPENCLAW_NO_AUTO_UPDATE=1",
		"OPENCLAW_DISABLE_BONJOUR=1",
		"PATH=" + filepath.Dir(env.node) + ":/usr/bin:/bin",
		"TERM=xterm-256color",
		"LANG=C.UTF-8",
	}
}

// openclaw runs the real CLI with args and returns stdout, stderr and the
// exit code; it is bounded by 60s.
func openclaw(t *testing.T, extraEnv []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.node, append([]string{env.openclaw}, args...)...)
	cmd.Env = append(clientEnv(t), extraEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if ctx.Err() != nil {
			t.Fatalf("openclaw %s: no answer within 60s\nstdout: %s\nstderr: %s", strings.Join(args, " "), &stdout, &stderr)
		}
	}
	t.Logf("$ openclaw %s → exit %d\n%s%s", strings.Join(redactArgs(args), " "), code, &stdout, &stderr)
	return stdout.String(), stderr.String(), code
}

func redactArgs(args []string) []string {
	out := append([]string(nil), args...)
	for i := range out {
		if i > 0 && out[i-1] == "--token" {
			out[i] = "…"
		}
	}
	return out
}

// call is `openclaw gateway call METHOD --json` against the e2e gateway; it
// decodes the JSON it prints.
func call(t *testing.T, method string, params any, extra ...string) map[string]any {
	t.Helper()
	return callAt(t, wsURL(), method, params, extra...)
}

// callAt is call against the gateway at url (one a test launched).
func callAt(t *testing.T, url, method string, params any, extra ...string) map[string]any {
	t.Helper()
	p := []byte("{}")
	if params != nil {
		p, _ = json.Marshal(params)
	}
	args := append([]string{"gateway", "call", method, "--url", url, "--token", token, "--json", "--params", string(p)}, extra...)
	stdout, stderr, code := openclaw(t, nil, args...)
	if code != 0 {
		t.Fatalf("openclaw gateway call %s: exit %d\n%s%s", method, code, stdout, stderr)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(jsonPart(stdout)), &v); err != nil {
		t.Fatalf("openclaw gateway call %s printed no JSON object: %v\n%s", method, err, stdout)
	}
	return v
}

// jsonPart skips anything the CLI prints before the JSON document.
func jsonPart(s string) string {
	if i := strings.Index(s, "{"); i >= 0 {
		return s[i:]
	}
	return s
}

func TestCLIHealth(t *testing.T) {
	v := call(t, "health", nil)
	if v["ok"] != true {
		t.Fatalf("health: %v, want ok:true", v)
	}
}

func TestCLIStatus(t *testing.T) {
	v := call(t, "status", nil)
	if len(v) == 0 {
		t.Fatal("status: empty object")
	}
	b, _ := json.Marshal(v)
	if !strings.Contains(string(b), "turnguard") {
		t.Errorf("status %s does not name turnguard", b)
	}
}

// TestCLIChatSend: chat.send is acknowledged at once; the final reply is then
// waited for (agent.wait) and read back (chat.history).
func TestCLIChatSend(t *testing.T) {
	runID := uuid.NewString()
	ack := call(t, "chat.send", map[string]any{"sessionKey": "e2e-cli", "message": "/steps web_search:200ms say:Reply_to_the_CLI",
		"idempotencyKey": runID})
	if ack["runId"] != runID || ack["status"] != "started" {
		t.Fatalf("chat.send ack %v, want {runId:%s, status:started}", ack, runID)
	}
	waited := call(t, "agent.wait", map[string]any{"runId": runID, "timeoutMs": 15000}, "--timeout", "20000")
	if waited["status"] != "ok" {
		t.Fatalf("agent.wait %v, want status ok", waited)
	}
	hist := call(t, "chat.history", map[string]any{"sessionKey": "e2e-cli", "limit": 10})
	b, _ := json.Marshal(hist["messages"])
	if !strings.Contains(string(b), "Reply to the CLI") {
		t.Fatalf("chat.history %s lacks the final reply", b)
	}
	again := call(t, "chat.send", map[string]any{"sessionKey": "e2e-cli", "message": "/steps say:twice", "idempotencyKey": runID})
	if again["status"] != "ok" {
		t.Errorf("repeated idempotencyKey: %v, want the cached status ok", again)
	}
}

// TestCLIAgentExpectFinal: `gateway call agent --expect-final` skips the
// "accepted" answer and prints the final one.
func TestCLIAgentExpectFinal(t *testing.T) {
	v := call(t, "agent", map[string]any{"message": "/steps web_search:200ms say:Agent_final_answer",
		"idempotencyKey": uuid.NewString(), "sessionKey": "e2e-agent"}, "--expect-final", "--timeout", "20000")
	if v["status"] != "ok" {
		t.Fatalf("agent: %v, want status ok", v)
	}
	b, _ := json.Marshal(v["result"])
	if !strings.Contains(string(b), "Agent final answer") {
		t.Fatalf("agent result %s lacks the reply", b)
	}
}

// TestCLIAgentCommand: `openclaw agent` (the user-facing command) prints the
// reply, and for a step timeout exits 1 printing the step timeout message.
func TestCLIAgentCommand(t *testing.T) {
	gwEnv := []string{"OPENCLAW_GATEWAY_URL=" + wsURL(), "OPENCLAW_GATEWAY_TOKEN=" + token}
	stdout, stderr, code := openclaw(t, gwEnv, "agent", "--agent", "main", "--session-key", "agent:main:e2e-agent-cmd",
		"-m", "/steps say:Hello_from_openclaw_agent")
	if code != 0 || !strings.Contains(stdout, "Hello from openclaw agent") {
		t.Fatalf("openclaw agent: exit %d\n%s%s", code, stdout, stderr)
	}
	stdout, stderr, code = openclaw(t, gwEnv, "agent", "--agent", "main", "--session-key", "agent:main:e2e-agent-cmd",
		"-m", "/steps web_search:200ms shell:hang")
	if code != 1 || !strings.Contains(stdout+stderr, "⚠️ No progress for 2 s") {
		t.Fatalf("openclaw agent with a step timeout: exit %d, want 1 and the step timeout message\n%s%s", code, stdout, stderr)
	}
}

// tmux runs the TUI on a private tmux server.
type tmux struct {
	t      *testing.T
	socket string
}

func (x *tmux) run(args ...string) string {
	x.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-S", x.socket}, args...)...).CombinedOutput()
	if err != nil {
		x.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (x *tmux) screen() string { return x.run("capture-pane", "-p", "-J", "-t", "tui", "-S", "-300") }

// waitFor polls the screen until ok accepts it, at most d; each screen seen
// is passed to ok.
func (x *tmux) waitFor(what string, d time.Duration, ok func(string) bool) string {
	x.t.Helper()
	deadline := time.Now().Add(d)
	var s string
	for time.Now().Before(deadline) {
		s = x.screen()
		if ok(s) {
			return s
		}
		time.Sleep(100 * time.Millisecond) // real time: polling another program's screen
	}
	x.t.Fatalf("TUI: %s did not appear within %v; screen:\n%s", what, d, s)
	return s
}

func (x *tmux) send(text string) {
	x.t.Helper()
	// Text and Enter in separate calls, else the TUI takes it as a paste.
	x.run("send-keys", "-t", "tui", "-l", text)
	x.run("send-keys", "-t", "tui", "Enter")
}

func (x *tmux) save(name string) {
	_ = os.WriteFile(filepath.Join(env.artifacts, name), []byte(x.screen()), 0o644)
}

// TestTUI drives `openclaw tui` in tmux: a streamed reply with tool lines,
// a step timeout shown as "run aborted: ⚠️ No progress …", and Esc stopping
// a running turn.
func TestTUI(t *testing.T) {
	x := &tmux{t: t, socket: filepath.Join(t.TempDir(), "tmux.sock")}
	cmdline := append([]string{"new-session", "-d", "-s", "tui", "-x", "160", "-y", "48", "--", "env"}, clientEnv(t)...)
	cmdline = append(cmdline, env.node, env.openclaw, "tui", "--url", wsURL(), "--token", token, "--session", "e2e-tui")
	x.run(cmdline...)
	t.Cleanup(func() {
		x.save("tui-last.txt")
		_ = exec.Command("tmux", "-S", x.socket, "kill-server").Run()
	})

	// Typing before the TUI is connected would be refused; wait for its
	// status line ("gateway connected | idle").
	x.waitFor("the connected, idle status line", 90*time.Second, func(s string) bool {
		return strings.Contains(s, "connected | idle")
	})

	// 1. Streamed reply with tool lines.
	x.send("/steps web_search:300ms llm:1500ms say:TUI_reply_done")
	streamed := false
	final := x.waitFor("the final reply", 30*time.Second, func(s string) bool {
		if strings.Contains(s, "Thinking") && !strings.Contains(s, "TUI reply done") &&
			!strings.Contains(s, "Thinking about the next step.") {
			streamed = true // part of the llm text, not all of it yet
		}
		return strings.Contains(s, "TUI reply done")
	})
	x.save("tui-reply.txt")
	if !streamed {
		t.Errorf("TUI: the reply did not stream (no partial text seen); screen:\n%s", final)
	}
	if !strings.Contains(strings.ToLower(final), "web_search") && !strings.Contains(strings.ToLower(final), "web search") {
		t.Errorf("TUI: no tool line for web_search; screen:\n%s", final)
	}

	// 2. A step timeout.
	x.send("/steps web_search:300ms shell:hang")
	sawNotice := false
	s := x.waitFor("run aborted: ⚠️ No progress", time.Duration(stepTimeout+15)*time.Second, func(s string) bool {
		if strings.Contains(s, "Still working") {
			sawNotice = true
		}
		return strings.Contains(s, "run aborted: ⚠️ No progress")
	})
	x.save("tui-step-timeout.txt")
	t.Logf("TUI screen after the step timeout (still-working notice seen: %v):\n%s", sawNotice, s)

	// 3. Esc stops the running turn (chat.abort without a runId).
	x.send("/steps shell:hang")
	x.waitFor("the running shell step", 15*time.Second, func(s string) bool {
		i := strings.LastIndex(s, "/steps shell:hang")
		return i >= 0 && strings.Contains(strings.ToLower(s[i+len("/steps shell:hang"):]), "shell")
	})
	x.run("send-keys", "-t", "tui", "Escape")
	x.waitFor("run aborted: ⏹️ Stopped", 15*time.Second, func(s string) bool {
		return strings.Contains(s, "run aborted: ⏹️ Stopped")
	})
	x.save("tui-esc-abort.txt")
}

// TestWebChat drives the web chat page in headless Chromium (webchat.mjs),
// including Retry on a timed-out turn's notice, a reload during a running
// turn (the page re-attaches to it: steps, the still-working notice and a
// Stop that ends it: webchat-reattached.png), a message queued behind a
// running turn (shown as queued, also after a reload, then answered:
// webchat-queued.png; /stop drops it and says so), Stop after the page's socket
// dropped and reconnected (the page
// signs each challenge with its browser's device key), a browser without
// WebCrypto Ed25519, and a 390 px phone screen driven by accessible names
// (Markdown replies rendered safely, a refused message kept, stop reasons in
// words, no horizontal scroll: webchat-390.png); the welcome of an empty
// conversation (webchat-welcome.png, webchat-welcome-390.png), a second tab
// showing the message that started a turn, /new clearing the screen, a
// "#token=…" added to an open page, and a reloaded history drawing a
// timed-out turn's step lines as they ended live (issue 22).
func TestWebChat(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	script, err := filepath.Abs("webchat.mjs")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, env.node, script, "http://"+gw.addr+"/#token="+token, env.artifacts)
	cmd.Env = append(os.Environ(), "E2E_CHROMIUM="+env.chromium, "E2E_NODE_MODULES="+env.nodeModules, "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	t.Logf("webchat.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("web chat in Chromium failed: %v (screenshot of the failure: %s)", err,
			filepath.Join(env.artifacts, "webchat-failure.png"))
	}
	for _, name := range []string{"webchat-welcome.png", "webchat-welcome-390.png", "webchat-step-timeout.png", "webchat-reattached.png", "webchat-queued.png", "webchat-390.png"} {
		shot := filepath.Join(env.artifacts, name)
		if fi, err := os.Stat(shot); err != nil || fi.Size() == 0 {
			t.Fatalf("screenshot %s missing: %v", shot, err)
		}
	}
}

// TestWebChatBusyModes drives the web chat (webchat-busy.mjs) against a
// gateway per busy mode other than the default queue (channels.ws.busy.mode):
// interrupt (the running turn superseded, in words, with Retry; the new
// message answered), collect (two messages wait for one follow-up turn:
// webchat-collect.png), steer (handed to the demo runner's running turn,
// which notes it), queue (a queued message's Cancel button:
// webchat-cancel.png) and overflow (busy.overflow drop-old).
func TestWebChatBusyModes(t *testing.T) {
	script, err := filepath.Abs("webchat-busy.mjs")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"interrupt", "collect", "steer", "queue", "overflow"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			busy := "      mode: " + mode + "\n      maxQueued: 5\n"
			if mode == "overflow" {
				busy = "      mode: queue\n      maxQueued: 1\n      overflow: drop-old\n"
			}
			g, err := launchGateway(dir, gatewayConfig(dir, "channels:\n  ws:\n    busy:\n"+busy))
			if err != nil {
				t.Fatalf("gateway with busy mode %s: %v\n%s", mode, err, g.logs())
			}
			defer func() {
				g.stop()
				_ = os.WriteFile(filepath.Join(env.artifacts, "gateway-"+mode+".log"), []byte(g.logs()), 0o644)
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, env.node, script, "http://"+g.addr+"/#token="+token, env.artifacts, mode)
			cmd.Env = append(os.Environ(), "E2E_CHROMIUM="+env.chromium, "E2E_NODE_MODULES="+env.nodeModules, "HOME="+t.TempDir())
			out, err := cmd.CombinedOutput()
			t.Logf("webchat-busy.mjs %s:\n%s", mode, out)
			if err != nil {
				t.Fatalf("busy mode %s in Chromium failed: %v (screenshot: %s)", mode, err,
					filepath.Join(env.artifacts, "webchat-"+mode+"-failure.png"))
			}
		})
	}
}

// TestCLIResolvesAQuestionAsTheOperator (issue 22): with no separate
// operatorToken, the holder of server.token is the operator over WebSocket
// too, so the real OpenClaw CLI answers another session's question with
// `gateway call plugin.approval.resolve` (it got FORBIDDEN while
// plugin.approval.list worked), and the turn runs on.
func TestCLIResolvesAQuestionAsTheOperator(t *testing.T) {
	runID := uuid.NewString()
	ack := call(t, "chat.send", map[string]any{"sessionKey": "e2e-cli-ask", "message": "/steps ask:deploy say:Deployed_by_the_CLI",
		"idempotencyKey": runID})
	if ack["runId"] != runID {
		t.Fatalf("chat.send ack %v", ack)
	}
	var id string
	deadline := time.Now().Add(20 * time.Second)
	for id == "" {
		if time.Now().After(deadline) {
			t.Fatal("plugin.approval.list never listed the question")
		}
		stdout, stderr, code := openclaw(t, nil, "gateway", "call", "plugin.approval.list", "--url", wsURL(), "--token", token,
			"--json", "--params", "{}")
		if code != 0 {
			t.Fatalf("plugin.approval.list: exit %d\n%s%s", code, stdout, stderr)
		}
		out := stdout
		if i := strings.Index(out, "["); i >= 0 {
			out = out[i:]
		}
		var list []struct {
			ID      string `json:"id"`
			Request struct {
				Title string `json:"title"`
			} `json:"request"`
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("plugin.approval.list printed no list: %v\n%s", err, stdout)
		}
		for _, a := range list {
			if strings.Contains(a.Request.Title, "deploy") {
				id = a.ID
			}
		}
	}
	res := call(t, "plugin.approval.resolve", map[string]any{"id": id, "decision": "allow-once"})
	if len(res) == 0 {
		t.Fatalf("plugin.approval.resolve answered %v", res)
	}
	waited := call(t, "agent.wait", map[string]any{"runId": runID, "timeoutMs": 15000}, "--timeout", "20000")
	if waited["status"] != "ok" {
		t.Fatalf("agent.wait %v, want status ok after the CLI allowed the question", waited)
	}
	hist := call(t, "chat.history", map[string]any{"sessionKey": "e2e-cli-ask", "limit": 10})
	b, _ := json.Marshal(hist["messages"])
	if !strings.Contains(string(b), "Deployed by the CLI") {
		t.Fatalf("chat.history %s lacks the reply the allowed step led to", b)
	}
}

// TestCLICancelsAQueuedRun (issue 23): the real OpenClaw CLI cancels one
// queued message by its runId — `gateway call chat.abort` answers
// {ok: true, aborted: true, runIds: [id]} — and only that one: the running
// turn runs on, the cancelled message's place is free for the next one,
// and the cancelled one never runs.
func TestCLICancelsAQueuedRun(t *testing.T) {
	const key = "e2e-cli-cancel"
	send := func(id, text string) map[string]any {
		t.Helper()
		return call(t, "chat.send", map[string]any{"sessionKey": key, "message": text, "idempotencyKey": id})
	}
	first, never, later := uuid.NewString(), uuid.NewString(), uuid.NewString()
	// Steps under the e2e gateway's 2 s step timeout; 12 s in all: each CLI
	// call starts a Node process, and the cancel must come while it runs.
	send(first, "/steps"+strings.Repeat(" web_search:1500ms", 8)+" say:First_done")
	if ack := send(never, "/steps say:Reply_never"); ack["status"] != "queued" {
		t.Fatalf("chat.send while busy answered %v, want queued", ack)
	}
	res := call(t, "chat.abort", map[string]any{"sessionKey": key, "runId": never})
	ids, _ := res["runIds"].([]any)
	if res["ok"] != true || res["aborted"] != true || len(ids) != 1 || ids[0] != never {
		t.Fatalf("chat.abort of the queued run answered %v, want {ok: true, aborted: true, runIds: [%s]}", res, never)
	}
	// The e2e gateway lets one message wait (busy.maxQueued 1): the cancel
	// made room, while the first turn still runs.
	if ack := send(later, "/steps say:Reply_later"); ack["status"] != "queued" {
		t.Fatalf("chat.send after the cancel answered %v, want queued", ack)
	}
	if waited := call(t, "agent.wait", map[string]any{"runId": later, "timeoutMs": 30000}, "--timeout", "35000"); waited["status"] != "ok" {
		t.Fatalf("agent.wait of the other queued run: %v, want ok", waited)
	}
	hist := call(t, "chat.history", map[string]any{"sessionKey": key, "limit": 20})
	b, _ := json.Marshal(hist["messages"])
	if !strings.Contains(string(b), "First done") || !strings.Contains(string(b), "Reply later") || strings.Contains(string(b), "Reply never") {
		t.Fatalf("chat.history %s: want the first and the later reply, never the cancelled one", b)
	}
}
