package acp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/acp"
	"github.com/turnguard/turnguard/store"
)

// teeEnv, in the environment of this test binary, makes it a recording
// stand-in for the agent command in its arguments: it runs that command
// and passes every line between the runner and it through, appending each
// to the file teeEnv names, prefixed "> " (to the agent) or "< " (from it).
const teeEnv = "ACP_WIRE_TEE"

// teeAgent is the recording stand-in (see teeEnv); it returns the agent's
// exit status.
func teeAgent(path string, argv []string) int {
	rec, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tee:", err)
		return 2
	}
	var mu sync.Mutex
	record := func(dir string, line []byte) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = rec.Write(append(append([]byte(dir), line...), '\n'))
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, teeEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return 2
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 2
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "tee:", err)
		return 2
	}
	pass := func(dir string, r io.Reader, w io.Writer) {
		br := bufio.NewReaderSize(r, 1<<20)
		for {
			line, err := br.ReadBytes('\n')
			if len(line) > 0 {
				if t := bytes.TrimSpace(line); len(t) > 0 && len(t) < 1<<20 {
					record(dir, t)
				}
				if _, err := w.Write(line); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go func() {
		pass("> ", os.Stdin, in)
		in.Close()
	}()
	pass("< ", out, os.Stdout)
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return 0
}

// testVersion is the gateway version of the recorded runners.
const testVersion = "1.2.3-test"

// recorded returns a runner whose agent command (command, args) is run
// through the recording stand-in, and the file it records to. The runner
// has version testVersion.
func recorded(t *testing.T, command string, args []string, adjust func(*config.ACP), opts ...acp.Option) (*logBuffer, runner.Runner, string, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	wire := filepath.Join(t.TempDir(), "wire.log")
	cfg := config.ACP{Command: exe, Args: append([]string{command}, args...), Workdir: t.TempDir(),
		Env: map[string]string{teeEnv: wire}, IdleSeconds: 60, StartTimeoutSeconds: 20}
	if adjust != nil {
		adjust(&cfg)
	}
	r, logs, dir := build(t, cfg, grace, append([]acp.Option{acp.WithVersion(testVersion)}, opts...)...)
	return logs, r, dir, wire
}

// acpSchema compiles the ACP v1 JSON schema in testdata/schema/v1 (a copy
// of schema/v1/schema.json of the agentclientprotocol/agent-client-protocol
// repository, schema version 1.21.0) and returns a validator of its
// definition def ("" for the whole: any message of either side).
func acpSchema(t *testing.T) func(def string, msg json.RawMessage) error {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "schema", "v1", "schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	const url = "file:///acp/v1/schema.json"
	c := jsonschema.NewCompiler()
	if err := c.AddResource(url, doc); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	compiled := map[string]*jsonschema.Schema{}
	return func(def string, msg json.RawMessage) error {
		mu.Lock()
		sch, ok := compiled[def]
		if !ok {
			loc := url
			if def != "" {
				loc += "#/$defs/" + def
			}
			if sch, err = c.Compile(loc); err != nil {
				mu.Unlock()
				return fmt.Errorf("compile %s: %w", def, err)
			}
			compiled[def] = sch
		}
		mu.Unlock()
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(msg))
		if err != nil {
			return err
		}
		return sch.Validate(v)
	}
}

// What the runner may send, by method: its requests and notifications,
// and its answers to the agent's requests. The schema definition of each.
var (
	clientRequests = map[string]string{
		"initialize":     "InitializeRequest",
		"session/new":    "NewSessionRequest",
		"session/prompt": "PromptRequest",
		"session/load":   "LoadSessionRequest",
		"session/resume": "ResumeSessionRequest",
		"session/close":  "CloseSessionRequest",
		"authenticate":   "AuthenticateRequest",
		// /mode <id> (modes.go)
		"session/set_mode": "SetSessionModeRequest",
		// /mode <option> <value> (options.go)
		"session/set_config_option": "SetSessionConfigOptionRequest",
		// /status (list.go)
		"session/list": "ListSessionsRequest",
	}
	clientNotifications = map[string]string{"session/cancel": "CancelNotification", "$/cancel_request": "CancelRequestNotification"}
	clientResults       = map[string]string{
		"session/request_permission": "RequestPermissionResponse",
		"fs/read_text_file":          "ReadTextFileResponse",
		"fs/write_text_file":         "WriteTextFileResponse",
		"terminal/create":            "CreateTerminalResponse",
		"terminal/output":            "TerminalOutputResponse",
		"terminal/wait_for_exit":     "WaitForTerminalExitResponse",
		"terminal/kill":              "KillTerminalResponse",
		"terminal/release":           "ReleaseTerminalResponse",
		"elicitation/create":         "CreateElicitationResponse",
	}
)

// checkWire validates every message the runner sent in the recording at
// path against the ACP schema — the message as a whole, and its params or
// result against the definition of its method — and returns what it saw,
// as "initialize", "session/cancel", "session/request_permission result",
// "fs/read_text_file error" and so on.
func checkWire(t *testing.T, valid func(string, json.RawMessage) error, path string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type msg struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  string          `json:"method"`
		Params  json.RawMessage `json:"params"`
		Result  json.RawMessage `json:"result"`
		Error   json.RawMessage `json:"error"`
	}
	asked := map[string]string{} // the agent's request ids → their methods
	seen := map[string]int{}
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		dir, raw, _ := strings.Cut(line, " ")
		var m msg
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			if dir == ">" {
				t.Errorf("line %d to the agent is not JSON: %v: %s", i+1, err, cutLog(raw))
			}
			continue
		}
		if dir == "<" {
			if m.Method != "" && m.ID != nil {
				asked[string(m.ID)] = m.Method
			}
			continue
		}
		fail := func(what string, err error) {
			t.Helper()
			t.Errorf("%s does not match the ACP v1 schema: %v\nmessage: %s", what, err, cutLog(raw))
		}
		if err := valid("", json.RawMessage(raw)); err != nil {
			fail("message", err)
		}
		if m.JSONRPC != "2.0" {
			t.Errorf("jsonrpc %q: %s", m.JSONRPC, raw)
		}
		if m.Method == "initialize" {
			var p struct {
				ClientInfo struct{ Name, Version string } `json:"clientInfo"`
			}
			_ = json.Unmarshal(m.Params, &p) // unreadable params fail the schema check
			if p.ClientInfo.Name != "turnguard" || p.ClientInfo.Version != testVersion {
				t.Errorf("initialize's clientInfo %+v, want turnguard %s (acp.WithVersion)", p.ClientInfo, testVersion)
			}
		}
		var kind, def string
		var body json.RawMessage
		switch {
		case m.Method != "" && m.ID != nil:
			kind, def, body = m.Method, clientRequests[m.Method], m.Params
		case m.Method != "":
			kind, def, body = m.Method, clientNotifications[m.Method], m.Params
		case m.Error != nil:
			kind, def, body = asked[string(m.ID)]+" error", "Error", m.Error
		default:
			kind, def, body = asked[string(m.ID)]+" result", clientResults[asked[string(m.ID)]], m.Result
		}
		seen[kind]++
		if def == "" {
			t.Errorf("the runner sent %q, which this test does not know: %s", kind, cutLog(raw))
			continue
		}
		if err := valid(def, body); err != nil {
			fail(kind+" ("+def+")", err)
		}
	}
	return seen
}

// TestWireMatchesSchema: every message the runner sends — initialize,
// session/new, session/prompt, session/cancel, session/set_mode,
// session/set_config_option, and its answers to
// permission, elicitation, fs and terminal requests, results and errors alike — is valid ACP v1,
// checked against the protocol's JSON schema. The agent here is the Node
// test agent on the official SDK, which accepts much the schema does not
// (it dropped the clientInfo without a version that OpenCode refuses).
func TestWireMatchesSchema(t *testing.T) {
	node, args := nodeAgent(t)
	valid := acpSchema(t)
	_, r, dir, wire := recorded(t, node, args, nil)
	c := &conv{key: "k", id: "c"}
	allow := &approver{answer: func(runner.Question) (runner.Answer, error) {
		return runner.Answer{Outcome: runner.Selected, OptionID: "yes", Kind: runner.AllowOnce}, nil
	}}
	for _, msg := range []string{"hello", "ask permission", "write file " + dir + "/a.txt x", "read file a.txt", "read file /etc/hostname",
		"terminal run echo hi", "terminal kill", "terminal many 5", "elicit confirm", "elicit color", "elicit name", "elicit link"} {
		turn := c.turn(msg)
		turn.Approver = allow
		mustSay(t, r, turn)
	}
	// A turn stopped while its question is open: session/cancel, and the
	// question answered cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	asked := make(chan struct{})
	turn := c.turn("ask permission")
	turn.Approver = &approver{answer: func(runner.Question) (runner.Answer, error) {
		close(asked)
		<-ctx.Done()
		return runner.Answer{}, ctx.Err()
	}}
	ch := start(ctx, r, turn, nil)
	<-asked
	cancel()
	if o := await(t, ch); !errors.Is(o.err, context.Canceled) {
		t.Fatalf("stopped turn: %v", o.err)
	}
	mustSay(t, r, c.turn("what did I say"))
	if err := r.(*acp.Runner).SetMode(context.Background(), "k", "code"); err != nil {
		t.Fatalf("SetMode: %v", err)
	}
	for _, kv := range [][2]string{{"model", "smart"}, {"verbose", "on"}} {
		if err := r.(*acp.Runner).SetConfigOption(context.Background(), "k", kv[0], kv[1]); err != nil {
			t.Fatalf("SetConfigOption %s: %v", kv[0], err)
		}
	}

	seen := checkWire(t, valid, wire)
	for _, want := range []string{"initialize", "session/new", "session/prompt", "session/cancel",
		"session/request_permission result", "fs/write_text_file result", "fs/read_text_file result", "fs/read_text_file error",
		"terminal/create result", "terminal/create error", "terminal/output result", "terminal/wait_for_exit result",
		"terminal/kill result", "terminal/release result", "session/set_mode", "session/set_config_option",
		"elicitation/create result"} {
		if seen[want] == 0 {
			t.Errorf("the runner sent no %s here (saw %v): the test does not cover it", want, seen)
		}
	}
}

// TestWireRestoreMatchesSchema: session/load, session/resume,
// session/close and session/list, as the runner sends them to restore a conversation's
// session after the agent crashed and to close it after /new, are valid
// ACP v1.
func TestWireRestoreMatchesSchema(t *testing.T) {
	node, args := nodeAgent(t)
	valid := acpSchema(t)
	for _, caps := range []string{"load,close", "resume,list"} {
		t.Run(caps, func(t *testing.T) {
			st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "t.db"), store.Options{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			sessions := t.TempDir()
			_, r, _, wire := recorded(t, node, args, func(c *config.ACP) {
				c.Env["ACP_TEST_SESSIONS"], c.Env["ACP_TEST_CAPS"] = sessions, caps
			}, acp.WithSessions(st))
			c := &conv{key: "k", id: "c"}
			mustSay(t, r, c.turn("remember it"))
			if _, err := say(t, r, c.turn("crash")); err == nil {
				t.Fatal("the crash turn succeeded")
			}
			mustSay(t, r, c.turn("what did I say"))
			c.id = "c2" // /new
			mustSay(t, r, c.turn("hello"))
			if _, err := r.(*acp.Runner).ListSessions(context.Background(), "k"); (err != nil) != (caps == "load,close") {
				t.Errorf("ListSessions: %v", err)
			}
			seen := checkWire(t, valid, wire)
			want := []string{"session/resume", "session/list"}
			if caps == "load,close" {
				want = []string{"session/load", "session/close"}
			}
			for _, m := range want {
				if seen[m] == 0 {
					t.Errorf("the runner sent no %s here (saw %v)", m, seen)
				}
			}
		})
	}
}
