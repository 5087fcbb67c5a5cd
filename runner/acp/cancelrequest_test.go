package acp_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
)

// TestCancelRequestSent: a request the runner gives up on — here the
// session/new of a turn stopped while the agent has not answered it — is
// followed by ACP's $/cancel_request naming its id, valid against the ACP
// v1 schema; the agent (which ignores it) keeps running.
func TestCancelRequestSent(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	valid := acpSchema(t)
	logs, r, _, wire := recorded(t, exe, nil, func(c *config.ACP) { c.Env[fakeEnv] = "newhang" })
	// sent returns the request id of the first message of method sent to
	// the agent (for $/cancel_request: the id it names), nil when none.
	sent := func(method string) json.RawMessage {
		b, _ := os.ReadFile(wire)
		for _, line := range strings.Split(string(b), "\n") {
			raw, ok := strings.CutPrefix(line, "> ")
			if !ok {
				continue
			}
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
				Params struct {
					RequestID json.RawMessage `json:"requestId"`
				} `json:"params"`
			}
			if json.Unmarshal([]byte(raw), &m) != nil || m.Method != method {
				continue
			}
			if method == "$/cancel_request" {
				return m.Params.RequestID
			}
			return m.ID
		}
		return nil
	}
	// waitSent waits (10 s of real time at most) until method was sent.
	waitSent := func(method string) json.RawMessage {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if id := sent(method); id != nil {
				return id
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s sent\n%s", method, cutLog(logs.String()))
			}
			time.Sleep(10 * time.Millisecond) // real time: a real agent process writes the recording
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := start(ctx, r, (&conv{key: "k", id: "c"}).turn("hi"), nil)
	newID := waitSent("session/new")
	cancel()
	if o := await(t, ch); !errors.Is(o.err, context.Canceled) {
		t.Fatalf("stopped turn: %v", o.err)
	}
	if got := waitSent("$/cancel_request"); string(got) != string(newID) {
		t.Errorf("$/cancel_request names request %s, want %s (session/new)", got, newID)
	}
	if seen := checkWire(t, valid, wire); seen["$/cancel_request"] != 1 {
		t.Errorf("sent %v, want one $/cancel_request", seen)
	}
}
