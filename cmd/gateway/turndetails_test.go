package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// turnDetails is the turnguard field chat.history sets on a finished
// turn's reply.
type turnDetails struct {
	RunID string `json:"runId"`
	Steps []struct {
		Name, Status string
	} `json:"steps"`
	Approvals []struct {
		Outcome, Text string
	} `json:"approvals"`
}

// replyDetails returns the turnguard field of session's messages.
func replyDetails(t *testing.T, cl *wsClient, session string) []turnDetails {
	t.Helper()
	res := cl.call("chat.history", map[string]any{"sessionKey": session})
	var p struct {
		Messages []struct {
			Turnguard *turnDetails `json:"turnguard"`
		}
	}
	if !res.OK || json.Unmarshal(res.Payload, &p) != nil {
		t.Fatalf("chat.history: %s", res.Payload)
	}
	var out []turnDetails
	for _, m := range p.Messages {
		if m.Turnguard != nil {
			out = append(out, *m.Turnguard)
		}
	}
	return out
}

// TestHistoryKeepsStepsAndApprovalsAcrossRestart (issue 22): with the built
// gateway and its SQLite store, a turn that ran steps and asked is read
// back by chat.history with its step lines and its settled card ("✅
// Allowed …: Run deploy") — right after it ended, and after a restart,
// when the history comes from the store.
func TestHistoryKeepsStepsAndApprovalsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := crashConfigStore("  path: " + filepath.Join(dir, "gateway.db") + "\n")
	const within = 15 * time.Second
	p := startGateway(t, dir, cfg)
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, "reload", "run-ask", "/steps web_search:50ms ask:deploy say:Finished")
	asked := cl.waitEvent("approval", within, func(raw json.RawMessage) bool { return strings.Contains(string(raw), `"requested"`) })
	var q struct{ Approval struct{ ID string } }
	if err := json.Unmarshal(asked.Payload, &q); err != nil || q.Approval.ID == "" {
		t.Fatalf("approval event %s: %v", asked.Payload, err)
	}
	if res := cl.call("approval.resolve", map[string]any{"id": q.Approval.ID, "optionId": "allow", "sessionKey": "reload"}); !res.OK {
		t.Fatalf("approval.resolve: %s", res.Payload)
	}
	cl.waitEvent("chat", within, chatState("run-ask", "final"))

	check := func(when string, got []turnDetails) {
		t.Helper()
		if len(got) != 1 || got[0].RunID != "run-ask" || len(got[0].Steps) != 2 || len(got[0].Approvals) != 1 {
			t.Fatalf("%s: turn details %+v, want run-ask's 2 steps and 1 approval", when, got)
		}
		d := got[0]
		if d.Steps[0].Name != "web_search" || d.Steps[0].Status != "completed" || d.Steps[1].Name != "deploy" || d.Steps[1].Status != "completed" {
			t.Errorf("%s: steps %+v, want web_search and deploy completed", when, d.Steps)
		}
		if a := d.Approvals[0]; a.Outcome != "selected" || !strings.HasPrefix(a.Text, "✅ Allowed") || !strings.HasSuffix(a.Text, ": Run deploy") {
			t.Errorf("%s: approval %+v, want \"✅ Allowed …: Run deploy\"", when, a)
		}
	}
	check("right after the turn", replyDetails(t, cl, "reload"))

	p.signal(syscall.SIGTERM)
	if code := p.wait(within); code != 0 {
		t.Fatalf("the gateway exited with %d:\n%s", code, p.log())
	}
	p = startGateway(t, dir, cfg)
	check("after a restart", replyDetails(t, dialGateway(t, p.addr, testToken), "reload"))
}
