package acp_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
)

// fakeEnv, in the environment of this test binary, makes it a fake ACP
// agent (fakeAgent) instead of running the tests.
const fakeEnv = "ACP_FAKE_AGENT"

func TestMain(m *testing.M) {
	// The recording stand-in first: it may be recording a fake agent.
	if path := os.Getenv(teeEnv); path != "" {
		os.Exit(teeAgent(path, os.Args[1:]))
	}
	if mode := os.Getenv(fakeEnv); mode != "" {
		fakeAgent(mode)
		os.Exit(0)
	}
	code := m.Run()
	removeGoAgent()
	os.Exit(code)
}

// fakeAgent speaks just enough ACP, byte by byte, to misbehave in one way:
//
//	silent        never answers anything
//	version2      answers initialize with protocol version 2
//	newhang       answers initialize, never session/new
//	asks          on a prompt, calls methods the client does not have and
//	              replies with what it got back
//	script        runs each prompt as a command (see scriptAgent)
//	dup           script, but every session/new answers the same sessionId
func fakeAgent(mode string) {
	if mode == "script" || mode == "dup" {
		scriptAgent(mode == "dup")
		return
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	send := func(v map[string]any) {
		v["jsonrpc"] = "2.0"
		_ = out.Encode(v)
	}
	var asked []string
	for in.Scan() {
		var m fakeMessage
		if json.Unmarshal(in.Bytes(), &m) != nil {
			continue
		}
		switch {
		case mode == "silent":
		case m.Method == "initialize":
			v := 1
			if mode == "version2" {
				v = 2
			}
			send(map[string]any{"id": m.ID, "result": map[string]any{"protocolVersion": v}})
		case m.Method == "session/new" && mode == "newhang":
		case m.Method == "session/new":
			send(map[string]any{"id": m.ID, "result": map[string]any{"sessionId": "fake-1"}})
		case m.Method == "session/prompt":
			asked = append(asked, string(m.ID))
			send(map[string]any{"id": "t1", "method": "fs/list_directory", "params": map[string]any{"sessionId": m.Params.SessionID, "path": "/"}})
			send(map[string]any{"id": "t2", "method": "fs/delete_file", "params": map[string]any{"sessionId": m.Params.SessionID, "path": "/"}})
		case m.Error != nil && len(asked) > 0:
			txt := fmt.Sprintf("%s: %d %s; ", strings.Trim(string(m.ID), `"`), m.Error.Code, m.Error.Message)
			send(map[string]any{"method": "session/update", "params": map[string]any{"sessionId": "fake-1",
				"update": map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": txt}}}})
			if string(m.ID) == `"t2"` {
				send(map[string]any{"id": json.RawMessage(asked[0]), "result": map[string]any{"stopReason": "end_turn"}})
				asked = asked[1:]
			}
		}
	}
}

// fakeMessage is what the fake agents read of the client's messages.
type fakeMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		SessionID string `json:"sessionId"`
		Prompt    []struct {
			Text string `json:"text"`
		} `json:"prompt"`
	} `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// fakeRunner returns a runner whose agent is this test binary in mode.
func fakeRunner(t *testing.T, mode string, startTimeout float64) (*logBuffer, func(msg string) (string, error)) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.ACP{Command: exe, Workdir: t.TempDir(), Env: map[string]string{fakeEnv: mode},
		IdleSeconds: 60, StartTimeoutSeconds: startTimeout}
	r, logs, _ := build(t, cfg, 200*time.Millisecond)
	c := &conv{key: "k", id: "c"}
	return logs, func(msg string) (string, error) { return say(t, r, c.turn(msg)) }
}

// TestFakeAgents: agents that never answer start-up, speak another
// protocol version or call methods the client does not offer: the user
// gets plain words (bounded by startTimeoutSeconds), the agent gets
// JSON-RPC errors, and every next message is tried afresh.
func TestFakeAgents(t *testing.T) {
	tests := []struct {
		mode    string
		userErr string
		reply   string
		log     string
	}{
		{mode: "silent", userErr: "The agent did not answer within 300 ms while starting, so it was stopped. Try again later.",
			log: "acp: initialize failed; stopping the agent"},
		{mode: "version2", userErr: "The agent speaks ACP version 2; turnguard speaks version 1.",
			log: "another protocol version"},
		{mode: "newhang", userErr: "The agent did not answer within 300 ms while starting, so it was stopped. Try again later.",
			log: "acp: session/new failed"},
		{mode: "asks", reply: "t1: -32601 method not found: fs/list_directory; t2: -32601 method not found: fs/delete_file; "},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			// A short start-up bound where it is what is tested; room for a
			// loaded machine elsewhere.
			startTimeout := 20.0
			if strings.Contains(tc.userErr, "did not answer") {
				startTimeout = 0.3
			}
			logs, send := fakeRunner(t, tc.mode, startTimeout)
			for i := range 2 { // the second message meets the same, not a wedged runner
				text, err := send("hi")
				if tc.userErr != "" {
					if got := userError(t, err); got != tc.userErr {
						t.Errorf("message %d: user sees %q, want %q", i, got, tc.userErr)
					}
				} else if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				if text != tc.reply {
					t.Errorf("message %d: reply %q, want %q", i, text, tc.reply)
				}
			}
			if !strings.Contains(logs.String(), tc.log) {
				t.Errorf("log lacks %q:\n%s", tc.log, cutLog(logs.String()))
			}
			if tc.mode != "asks" && strings.Count(logs.String(), "acp: agent started") != 2 {
				t.Errorf("want one agent process per message after a failed start:\n%s", cutLog(logs.String()))
			}
		})
	}
}
