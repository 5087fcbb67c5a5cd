package main

// These tests build the real binary and run it as a process: configuration
// on disk, a real listener, real signals, a WebSocket client speaking the
// protocol. They are bounded by deadlines on every wait; nothing sleeps to
// wait for a timer.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/testlog"
	"github.com/turnguard/turnguard/store"
)

var gatewayBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "turnguard-gateway-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gatewayBin = filepath.Join(dir, "gateway")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", gatewayBin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the gateway: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	pgtest.Stop() // the PostgreSQL test server, if a test started one
	os.RemoveAll(dir)
	os.Exit(code)
}

const testToken = "process-test-token"

// gatewayProc is a running gateway binary.
type gatewayProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	dir  string
	addr string

	mu   sync.Mutex
	logs strings.Builder

	done chan struct{} // closed when the process has exited
	code int
}

// startGateway runs the binary in a fresh directory with cfg as its
// configuration file ("" = no -config) and env added to a clean environment.
// It returns once the gateway logged the address it listens on.
func startGateway(t *testing.T, dir, cfg string, env ...string) *gatewayProc {
	t.Helper()
	return startGatewayCmd(t, dir, cfg, nil, env...)
}

// startGatewayCmd is startGateway with prepare adjusting the command before
// it starts (nil: nothing to adjust).
func startGatewayCmd(t *testing.T, dir, cfg string, prepare func(*exec.Cmd), env ...string) *gatewayProc {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	var args []string
	if cfg != "" {
		path := filepath.Join(dir, "gateway.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-config", path)
	}
	p := &gatewayProc{t: t, dir: dir, done: make(chan struct{})}
	p.cmd = exec.Command(gatewayBin, args...)
	p.cmd.Dir = dir
	p.cmd.Env = append(cleanEnv(), append([]string{"GATEWAY_LOG_FORMAT=json"}, env...)...)
	if prepare != nil {
		prepare(p.cmd)
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrCh := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.logs.WriteString(line + "\n")
			p.mu.Unlock()
			var rec struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" {
				addrCh <- rec.Addr
			}
		}
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", p.log())
		}
	})
	select {
	case p.addr = <-addrCh:
	case <-p.done:
		t.Fatalf("the gateway exited with %d before listening:\n%s", p.code, p.log())
	case <-time.After(30 * time.Second):
		t.Fatalf("the gateway did not log \"listening\" within 30s:\n%s", p.log())
	}
	return p
}

// cleanEnv is the test's environment without GATEWAY_ variables.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GATEWAY_") {
			out = append(out, kv)
		}
	}
	return out
}

func (p *gatewayProc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

func (p *gatewayProc) signal(s syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		p.t.Fatalf("signal %v: %v", s, err)
	}
}

// wait waits at most d for the process to exit and returns its exit code.
func (p *gatewayProc) wait(d time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		p.t.Fatalf("the gateway did not exit within %v", d)
		return -1
	}
}

func (p *gatewayProc) get(path string) (int, string) {
	p.t.Helper()
	res, err := http.Get("http://" + p.addr + path)
	if err != nil {
		p.t.Fatalf("GET %s: %v", path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// frame is any protocol frame.
type frame struct {
	Type    string          `json:"type"`
	ID      string          `json:"id"`
	Method  string          `json:"method"`
	OK      bool            `json:"ok"`
	Event   string          `json:"event"`
	Payload json.RawMessage `json:"payload"`
	Error   *struct {
		Code      string `json:"code"`
		Message   string `json:"message"`
		Retryable bool   `json:"retryable"`
	} `json:"error"`
}

type chatPayload struct {
	RunID        string `json:"runId"`
	SessionKey   string `json:"sessionKey"`
	State        string `json:"state"`
	StopReason   string `json:"stopReason"`
	ErrorMessage string `json:"errorMessage"`
}

type agentPayload struct {
	RunID  string `json:"runId"`
	Stream string `json:"stream"`
	Data   struct {
		Phase      string `json:"phase"`
		Name       string `json:"name"`
		ToolCallID string `json:"toolCallId"`
	} `json:"data"`
}

// wsClient is a protocol client: one reader goroutine feeds frames.
type wsClient struct {
	t       *testing.T
	c       *websocket.Conn
	frames  chan frame
	closed  chan struct{}
	closeMu sync.Mutex
	closeEr error
	backlog []frame
	n       int
}

func dialGateway(t *testing.T, addr, token string) *wsClient {
	t.Helper()
	c, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/", nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	cl := &wsClient{t: t, c: c, frames: make(chan frame, 1024), closed: make(chan struct{})}
	t.Cleanup(func() { c.Close() })
	go func() {
		defer close(cl.closed)
		for {
			_, b, err := c.ReadMessage()
			if err != nil {
				cl.closeMu.Lock()
				cl.closeEr = err
				cl.closeMu.Unlock()
				return
			}
			var f frame
			if json.Unmarshal(b, &f) == nil {
				cl.frames <- f
			}
		}
	}()
	ch := cl.waitEvent("connect.challenge", 10*time.Second, nil)
	if !strings.Contains(string(ch.Payload), "nonce") {
		t.Fatalf("challenge without nonce: %s", ch.Payload)
	}
	params := map[string]any{
		"minProtocol": 4, "maxProtocol": 4,
		"client": map[string]any{"id": "turnguard-test", "version": "1", "platform": "linux", "mode": "cli"},
		"caps":   []string{"tool-events"}, "role": "operator",
		"scopes": []string{"operator.read", "operator.write", "operator.admin"},
	}
	if token != "" {
		params["auth"] = map[string]any{"token": token}
	}
	res := cl.call("connect", params)
	if !res.OK {
		t.Fatalf("connect refused: %+v", res.Error)
	}
	return cl
}

func (cl *wsClient) next(deadline <-chan time.Time) (frame, bool) {
	select {
	case f := <-cl.frames:
		return f, true
	case <-cl.closed:
		select {
		case f := <-cl.frames:
			return f, true
		default:
			return frame{}, false
		}
	case <-deadline:
		cl.t.Fatalf("no expected frame in time; seen events: %s", cl.seen())
		return frame{}, false
	}
}

func (cl *wsClient) seen() string {
	var b strings.Builder
	for _, f := range cl.backlog {
		fmt.Fprintf(&b, "\n  %s %s", f.Event, f.Payload)
	}
	return b.String()
}

// call sends a request and returns its response; events read meanwhile are
// kept for waitEvent.
func (cl *wsClient) call(method string, params any) frame {
	cl.t.Helper()
	cl.n++
	id := fmt.Sprintf("t%d", cl.n)
	if err := cl.c.WriteJSON(map[string]any{"type": "req", "id": id, "method": method, "params": params}); err != nil {
		cl.t.Fatalf("send %s: %v", method, err)
	}
	deadline := time.After(10 * time.Second)
	for {
		f, ok := cl.next(deadline)
		if !ok {
			cl.t.Fatalf("connection closed while waiting for the %s response", method)
		}
		if f.Type == "res" && f.ID == id {
			return f
		}
		if f.Type == "event" {
			cl.backlog = append(cl.backlog, f)
		}
	}
}

// waitEvent returns the first event named name (from the backlog, then the
// connection) that match accepts (nil accepts any).
func (cl *wsClient) waitEvent(name string, d time.Duration, match func(json.RawMessage) bool) frame {
	cl.t.Helper()
	for i, f := range cl.backlog {
		if f.Event == name && (match == nil || match(f.Payload)) {
			cl.backlog = append(cl.backlog[:i:i], cl.backlog[i+1:]...)
			return f
		}
	}
	deadline := time.After(d)
	for {
		f, ok := cl.next(deadline)
		if !ok {
			cl.t.Fatalf("connection closed while waiting for event %s; seen: %s", name, cl.seen())
		}
		if f.Type != "event" {
			continue
		}
		if f.Event == name && (match == nil || match(f.Payload)) {
			return f
		}
		cl.backlog = append(cl.backlog, f)
	}
}

// waitClosed waits for the server to close the connection and returns the
// close code (-1 if it was not a close frame).
func (cl *wsClient) waitClosed(d time.Duration) int {
	cl.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case f := <-cl.frames:
			cl.backlog = append(cl.backlog, f)
		case <-cl.closed:
			cl.closeMu.Lock()
			defer cl.closeMu.Unlock()
			var ce *websocket.CloseError
			if errors.As(cl.closeEr, &ce) {
				return ce.Code
			}
			return -1
		case <-deadline:
			cl.t.Fatalf("the connection was not closed within %v", d)
		}
	}
}

func chatSend(cl *wsClient, session, runID, text string) {
	cl.t.Helper()
	res := cl.call("chat.send", map[string]any{"sessionKey": session, "message": text, "idempotencyKey": runID})
	var ack struct{ RunID, Status string }
	_ = json.Unmarshal(res.Payload, &ack)
	if !res.OK || ack.RunID != runID || ack.Status != "started" {
		cl.t.Fatalf("chat.send ack: ok=%v %s %+v", res.OK, res.Payload, res.Error)
	}
}

func toolStarted(runID, name string) func(json.RawMessage) bool {
	return func(raw json.RawMessage) bool {
		var p agentPayload
		return json.Unmarshal(raw, &p) == nil && p.RunID == runID && p.Stream == "tool" &&
			p.Data.Phase == "start" && p.Data.Name == name
	}
}

func chatState(runID, state string) func(json.RawMessage) bool {
	return func(raw json.RawMessage) bool {
		var p chatPayload
		return json.Unmarshal(raw, &p) == nil && p.RunID == runID && p.State == state
	}
}

func aborted(t *testing.T, f frame) chatPayload {
	t.Helper()
	var p chatPayload
	if err := json.Unmarshal(f.Payload, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func testConfig(dir string, abortGrace float64) string {
	return fmt.Sprintf(`server:
  listen: 127.0.0.1:0
  token: %s
agents:
  defaults:
    abortGraceSeconds: %g
store:
  path: %s
`, testToken, abortGrace, filepath.Join(dir, "gateway.db"))
}

// TestGracefulShutdown: SIGTERM during a turn stops accepting, aborts the
// turn with stop reason shutdown and tells its user, closes the client with
// 1012 and exits 0 well within the grace.
func TestGracefulShutdown(t *testing.T) {
	dir := t.TempDir()
	p := startGateway(t, dir, testConfig(dir, 5))

	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := p.get(path); code != 200 {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
	}
	if code, body := p.get("/"); code != 200 || !strings.Contains(body, `id="input"`) {
		t.Fatalf("GET /: %d, web chat page missing", code)
	}

	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, "main", "run-shutdown", "/steps web_search:100ms shell:hang")
	cl.waitEvent("agent", 10*time.Second, toolStarted("run-shutdown", "shell"))

	began := time.Now()
	p.signal(syscall.SIGTERM)
	ab := aborted(t, cl.waitEvent("chat", 5*time.Second, chatState("run-shutdown", "aborted")))
	if ab.StopReason != "shutdown" {
		t.Errorf("stopReason %q, want shutdown", ab.StopReason)
	}
	if !strings.Contains(ab.ErrorMessage, "shutting down") || !strings.Contains(ab.ErrorMessage, "while shell was running") {
		t.Errorf("errorMessage %q: want the shutdown message naming the running step", ab.ErrorMessage)
	}
	if code := cl.waitClosed(5 * time.Second); code != websocket.CloseServiceRestart {
		t.Errorf("close code %d, want 1012", code)
	}
	if code := p.wait(5 * time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("shutdown took %v, beyond the 5s grace", took)
	}
	if !strings.Contains(p.log(), `"msg":"stopped"`) {
		t.Errorf("no \"stopped\" log line")
	}
}

// TestShutdownWaitsForGraceThenExits: a runner that ignores the abort holds
// the shutdown for abortGraceSeconds, no longer, and the exit is still 0.
func TestShutdownWaitsForGraceThenExits(t *testing.T) {
	dir := t.TempDir()
	p := startGateway(t, dir, testConfig(dir, 1))
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, "main", "run-stuck", "/steps shell:stuck")
	cl.waitEvent("agent", 10*time.Second, toolStarted("run-stuck", "shell"))

	began := time.Now()
	p.signal(syscall.SIGTERM)
	ab := aborted(t, cl.waitEvent("chat", 5*time.Second, chatState("run-stuck", "aborted")))
	if ab.StopReason != "shutdown" {
		t.Errorf("stopReason %q, want shutdown", ab.StopReason)
	}
	if code := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	took := time.Since(began)
	if took < 900*time.Millisecond || took > 6*time.Second {
		t.Errorf("exit after %v; want about the 1s grace", took)
	}
}

// TestSecondSignalExitsAtOnce: while the shutdown waits for a stuck runner
// (60s grace), a second signal ends the process immediately.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	dir := t.TempDir()
	p := startGateway(t, dir, testConfig(dir, 60))
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, "main", "run-stuck", "/steps shell:stuck")
	cl.waitEvent("agent", 10*time.Second, toolStarted("run-stuck", "shell"))

	p.signal(syscall.SIGTERM)
	cl.waitEvent("chat", 5*time.Second, chatState("run-stuck", "aborted"))
	if code, _ := probe(p.addr, "/readyz"); code == 200 {
		t.Errorf("/readyz still 200 during shutdown")
	}
	began := time.Now()
	p.signal(syscall.SIGINT)
	if code := p.wait(3 * time.Second); code != exitError {
		t.Errorf("exit code %d after a second signal, want %d", code, exitError)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("second signal took %v to exit", took)
	}
	if !strings.Contains(p.log(), "second signal") {
		t.Errorf("no log line about the second signal")
	}
}

// probe is a GET that tolerates a refused connection (code 0).
func probe(addr, path string) (int, error) {
	res, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err
	}
	res.Body.Close()
	return res.StatusCode, nil
}

// TestDefaultsRun is `make run` on a fresh machine: no configuration file,
// no token, the demo runner, the store created as turnguard.db in the
// working directory. (Only the port is moved off 18789, which a developer's
// own gateway may hold.)
func TestDefaultsRun(t *testing.T) {
	dir := t.TempDir()
	p := startGateway(t, dir, "", "GATEWAY_SERVER__LISTEN=127.0.0.1:0")
	cl := dialGateway(t, p.addr, "")
	chatSend(cl, "main", "run-hello", "/steps web_search:50ms say:hello_from_the_demo_runner")
	fin := cl.waitEvent("chat", 10*time.Second, chatState("run-hello", "final"))
	if !strings.Contains(string(fin.Payload), "hello from the demo runner") {
		t.Errorf("final %s: want the demo reply", fin.Payload)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if _, err := os.Stat(filepath.Join(dir, "turnguard.db")); err != nil {
		t.Errorf("default store: %v", err)
	}
}

// TestInterruptedTurnAfterCrash: a turn cut off by a crash (SIGKILL) is
// ended as interrupted at the next start, and its user finds the notice in
// the session's history.
func TestInterruptedTurnAfterCrash(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 5)
	p := startGateway(t, dir, cfg)
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, "main", "run-crash", "/steps web_search:50ms shell:hang")
	cl.waitEvent("agent", 10*time.Second, toolStarted("run-crash", "shell"))
	waitRecorded(t, filepath.Join(dir, "gateway.db"), "run-crash", "web_search")
	p.signal(syscall.SIGKILL)
	p.wait(5 * time.Second)

	p2 := startGateway(t, dir, cfg)
	cl2 := dialGateway(t, p2.addr, testToken)
	res := cl2.call("chat.history", map[string]any{"sessionKey": "main", "limit": 50})
	if !res.OK {
		t.Fatalf("chat.history: %+v", res.Error)
	}
	want := "Your request was interrupted by a server problem — last action was shell"
	if !strings.Contains(string(res.Payload), want) {
		t.Fatalf("history %s\nlacks %q", res.Payload, want)
	}
	if !strings.Contains(p2.log(), "turn interrupted by the last stop") {
		t.Errorf("no log line for the interrupted turn")
	}
}

// waitRecorded polls the store file until the running turn has reached
// lastStep, so that killing the process cannot race the asynchronous writer.
func waitRecorded(t *testing.T, path, runID, lastStep string) {
	t.Helper()
	waitTurn(t, path, runID, "with last step "+lastStep, func(tr store.Turn) bool { return tr.LastStep.Name == lastStep })
}

// waitLog waits until the gateway's log contains s.
func (p *gatewayProc) waitLog(s string, d time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if strings.Contains(p.log(), s) {
			return
		}
		time.Sleep(20 * time.Millisecond) // real time: polling another process's log
	}
	p.t.Fatalf("log line %q did not appear within %v", s, d)
}

// TestHotReload: an edit of the configuration file applies to the next turn
// without a restart, and nothing is said to need a restart when no such key
// changed.
func TestHotReload(t *testing.T) {
	p, base := startReloadable(t)
	cl := dialGateway(t, p.addr, testToken)
	p.rewriteConfig(strings.Replace(base, "    abortGraceSeconds: 5\n", "    abortGraceSeconds: 5\n    stepTimeoutSeconds: 0.5\n", 1))
	p.waitLog("config reloaded", 10*time.Second)
	chatSend(cl, "main", "run-reloaded", "/steps shell:hang")
	ab := aborted(t, cl.waitEvent("chat", 10*time.Second, chatState("run-reloaded", "aborted")))
	if ab.StopReason != "step_timeout" || !strings.Contains(ab.ErrorMessage, "No progress for 500 ms") {
		t.Errorf("after the reload: stopReason %q, message %q; want the 0.5s step timeout", ab.StopReason, ab.ErrorMessage)
	}
	if strings.Contains(p.log(), "needs a restart") {
		t.Errorf("a restart was asked for though no restart-only key changed:\n%s", p.log())
	}
}

// startReloadable starts a gateway on testConfig and returns it with that
// configuration's text, for tests that edit it.
func startReloadable(t *testing.T) (*gatewayProc, string) {
	t.Helper()
	dir := t.TempDir()
	base := testConfig(dir, 5)
	return startGateway(t, dir, base), base
}

// rewriteConfig replaces the gateway's configuration file (hot reload).
func (p *gatewayProc) rewriteConfig(content string) {
	p.t.Helper()
	if err := os.WriteFile(filepath.Join(p.dir, "gateway.yaml"), []byte(content), 0o600); err != nil {
		p.t.Fatal(err)
	}
}

// writeAgent writes an exec agent (the jsonl protocol) that answers text.
func writeAgent(t *testing.T, dir, text string) string {
	t.Helper()
	path := filepath.Join(dir, "agent.sh")
	script := "#!/bin/sh\ncat >/dev/null\necho '{\"type\":\"final\",\"text\":\"" + text + "\"}'\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestHotReloadBuildsRunner: a reload that names a runner the gateway did
// not build at start builds it before the configuration is swapped in, so
// the next turn runs on it (before: every turn failed until a restart); a
// runner that cannot be built refuses the reload, and turns keep running on
// the configuration in force.
func TestHotReloadBuildsRunner(t *testing.T) {
	p, base := startReloadable(t)
	cl := dialGateway(t, p.addr, testToken)

	// A command that does not exist: refused, the demo runner stays.
	missing := filepath.Join(p.dir, "no-such-agent")
	broken := strings.Replace(base, "agents:\n  defaults:\n",
		"agents:\n  exec:\n    command: "+missing+"\n  defaults:\n    runner: exec\n", 1)
	p.rewriteConfig(broken)
	p.waitLog("config reload refused; keeping the current configuration", 10*time.Second)
	if !strings.Contains(p.log(), "agents.exec.command") {
		t.Errorf("the refusal does not name the key:\n%s", p.log())
	}
	chatSend(cl, "main", "run-demo", "/steps say:still_the_demo")
	fin := cl.waitEvent("chat", 10*time.Second, chatState("run-demo", "final"))
	if !strings.Contains(string(fin.Payload), "still the demo") {
		t.Errorf("after a refused reload: %s, want the demo runner's answer", fin.Payload)
	}

	// A working command: built at reload, the next turn runs on it.
	agent := writeAgent(t, p.dir, "hello from exec")
	p.rewriteConfig(strings.Replace(broken, missing, agent, 1))
	p.waitLog("config reloaded", 10*time.Second)
	chatSend(cl, "main", "run-exec", "hi")
	fin = cl.waitEvent("chat", 10*time.Second, func(raw json.RawMessage) bool {
		return chatState("run-exec", "final")(raw) || chatState("run-exec", "error")(raw) || chatState("run-exec", "aborted")(raw)
	})
	if !strings.Contains(string(fin.Payload), "hello from exec") {
		t.Errorf("the turn after the reload: %s, want the exec agent's answer", fin.Payload)
	}
}

// TestHotReloadTokenNeedsRestart: a changed token is named as needing a
// restart (the log does not claim "config reloaded"), and the token in force
// stays the one the gateway started with.
func TestHotReloadTokenNeedsRestart(t *testing.T) {
	p, base := startReloadable(t)
	const newToken = "process-test-token-NEW-value"
	changed := strings.Replace(base, "token: "+testToken, "token: "+newToken, 1)
	p.rewriteConfig(strings.Replace(changed, "    abortGraceSeconds: 5\n", "    abortGraceSeconds: 5\n    stepTimeoutSeconds: 7\n", 1))
	p.waitLog("needs a restart", 10*time.Second)
	logs := p.log()
	if !strings.Contains(logs, "config applied except server.token, server.operatorToken: needs a restart") {
		t.Errorf("the log does not name the token keys as needing a restart:\n%s", logs)
	}
	if strings.Contains(logs, "config reloaded") {
		t.Errorf("the log claims the reload applied fully:\n%s", logs)
	}
	if strings.Contains(logs, newToken) || strings.Contains(logs, testToken) {
		t.Errorf("the log reveals a token:\n%s", logs)
	}
	// The token in force is still the one the gateway started with.
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, "main", "run-old-token", "/steps say:ok")
	cl.waitEvent("chat", 10*time.Second, chatState("run-old-token", "final"))
}

// TestCheckRefusesEndlessTemplate: -check reports the template of issue 10
// at once (before: minutes of CPU and 20 GB), together with every other
// problem of the file, and exits 1.
func TestCheckRefusesEndlessTemplate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.yaml")
	cfg := "server:\n  tickIntervalMs: 5e12\n  idempotencyTTLSeconds: 1e308\nmessages:\n  progress: \"{{range $i := .Elapsed}}x{{end}}\"\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gatewayBin, "-check", "-config", path)
	cmd.Env = cleanEnv()
	out, err := runWithin(t, cmd, 10*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitError {
		t.Fatalf("-check: %v, want exit status %d\n%s", err, exitError, out)
	}
	for _, want := range []string{
		"messages.progress: progress:1:8: {{range}} is not allowed in a message",
		"server.tickIntervalMs: must be a whole number from 1000 to 600000 (10m), got 5000000000000",
		"server.idempotencyTTLSeconds: must be a number > 0 and at most 86400 (24h), got 1e+308",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("-check output lacks %q:\n%s", want, out)
		}
	}
}

// TestCheckHonoursSignals: a -check that cannot finish (its file is a FIFO
// no one writes) ends promptly on SIGTERM with a message.
func TestCheckHonoursSignals(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "gateway.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	cmd := exec.Command(gatewayBin, "-check", "-config", fifo)
	cmd.Env = cleanEnv()
	out, done := startCmd(t, cmd)
	// Once -check has the FIFO open, its signal handler is installed.
	if !openedByReader(t, fifo) {
		_ = cmd.Process.Kill()
		t.Fatalf("-check never opened its file:\n%s", out.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitError {
			t.Fatalf("-check after SIGTERM: %v, want exit status %d\n%s", err, exitError, out.String())
		}
		if !strings.Contains(out.String(), "gateway: -check interrupted by signal terminated") {
			t.Errorf("no message about the interruption:\n%s", out.String())
		}
	case <-time.After(5 * time.Second): // real time: another process
		_ = cmd.Process.Kill()
		t.Fatalf("-check did not end within 5s of SIGTERM:\n%s", out.String())
	}
}

// startCmd starts cmd with its output collected; done delivers Wait's error.
func startCmd(t *testing.T, cmd *exec.Cmd) (*testlog.Buffer, <-chan error) {
	t.Helper()
	out := new(testlog.Buffer)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return out, done
}

// runWithin runs cmd and returns its combined output, failing the test if it
// runs longer than d.
func runWithin(t *testing.T, cmd *exec.Cmd, d time.Duration) (string, error) {
	t.Helper()
	out, done := startCmd(t, cmd)
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(d): // real time: another process
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not end within %v:\n%s", cmd.Args, d, out.String())
		return "", nil
	}
}

// TestShutdownWithReloadStuck: a reload that blocks reading the file (it
// was replaced by a FIFO no one writes) does not wedge the shutdown.
func TestShutdownWithReloadStuck(t *testing.T) {
	p, _ := startReloadable(t)
	path := filepath.Join(p.dir, "gateway.yaml")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	if !openedByReader(t, path) {
		t.Fatalf("the reload never opened the file:\n%s", p.log())
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if !strings.Contains(p.log(), "config hot reload did not stop in time") {
		t.Errorf("no log line about the stuck reload:\n%s", p.log())
	}
}

// openedByReader waits (at most 10s) until another process has the FIFO at
// path open for reading — a non-blocking open for writing succeeds only
// then — and keeps the write end open, without writing, until the test ends,
// so that the reader stays blocked in its read.
func openedByReader(t *testing.T, path string) bool {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if w, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			t.Cleanup(func() { w.Close() })
			return true
		}
		time.Sleep(10 * time.Millisecond) // real time: waiting for another process
	}
	return false
}
