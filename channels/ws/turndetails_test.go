package ws

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
)

// detailsOf is a TurnDetails loader answering d for every run it is asked
// about, and recording the ids it was asked.
type detailsOf struct {
	d     event.TurnDetail
	mu    sync.Mutex
	asked []string
}

func (l *detailsOf) load(_ context.Context, runIDs []string) (map[string]event.TurnDetail, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked = append(l.asked, runIDs...)
	out := make(map[string]event.TurnDetail)
	for _, id := range runIDs {
		out[id] = l.d
	}
	return out, nil
}

// allowedDeploy is the demo's question settled by the web chat.
func allowedDeploy(title string) event.Approval {
	return event.Approval{ID: "ap_1", Title: title, Tool: "deploy",
		Options:   []event.ApprovalOption{{ID: "allow", Label: "Allow", Kind: "allow_once"}, {ID: "deny", Label: "Deny", Kind: "reject_once"}},
		CreatedAt: time.Now(), ExpiresAt: time.Now().Add(5 * time.Minute),
		Outcome: event.ApprovalSelected, OptionID: "allow", OptionKind: "allow_once", By: "web chat", ResolvedAt: time.Now()}
}

// TestChatHistoryShowsFinishedTurnsStepsAndApprovals (issue 22): after a
// reload, chat.history's message that ends a finished turn carries the
// turn's step lines (the live events' tool ids, names, how each ended and
// how long it took; no LLM calls, as live) and its settled approval cards
// with the settled words ("✅ Allowed in the web chat: …"), under
// `turnguard`; the user's message carries none. The details are asked for
// the turns the history holds.
func TestChatHistoryShowsFinishedTurnsStepsAndApprovals(t *testing.T) {
	l := &detailsOf{d: event.TurnDetail{
		Steps: []event.TurnStep{
			{Kind: "tool", Name: "deploy", Seq: 1, Completed: true, Elapsed: 1200 * time.Millisecond},
			{Kind: "llm", Name: "demo", Seq: 2, Completed: true},
			{Kind: "tool", Name: "shell", Seq: 3},
		},
		StepsOmitted: 2,
		Approvals:    []event.Approval{allowedDeploy("Run deploy")},
	}}
	e := newTCPEnv(t, envOpts{details: l.load})
	c, _ := e.connect("webchat", "")
	req := ask(t, c, "agent:main:main", "r1")
	c.call("approval.resolve", map[string]any{"id": req.str("approval.id"), "optionId": "allow"})
	c.chat("r1", "final")

	// A reload: a new connection reads the history.
	r, _ := e.connect("webchat", "")
	h := r.call("chat.history", map[string]any{"sessionKey": "main"})
	msgs, _ := h.get("messages").([]any)
	if !h.OK || len(msgs) != 2 {
		t.Fatalf("chat.history: %s", h.raw)
	}
	if lookup(msgs[0], "turnguard") != nil {
		t.Errorf("the user's message carries turnguard: %v", msgs[0])
	}
	for path, want := range map[string]any{
		"messages.1.turnguard.runId":               "r1",
		"messages.1.turnguard.stepsOmitted":        float64(2),
		"messages.1.turnguard.steps.0.toolCallId":  "r1:1",
		"messages.1.turnguard.steps.0.name":        "deploy",
		"messages.1.turnguard.steps.0.status":      "completed",
		"messages.1.turnguard.steps.0.durationMs":  float64(1200),
		"messages.1.turnguard.steps.1.toolCallId":  "r1:3",
		"messages.1.turnguard.steps.1.status":      "completed", // running when the turn finished: closed as completed, as live
		"messages.1.turnguard.approvals.0.id":      "ap_1",
		"messages.1.turnguard.approvals.0.outcome": "selected",
		"messages.1.turnguard.approvals.0.by":      "web chat",
		"messages.1.turnguard.approvals.0.text":    "✅ Allowed in the web chat: Run deploy",
	} {
		if got := h.get(path); got != want {
			t.Errorf("%s = %v, want %v", path, got, want)
		}
	}
	if got := h.get("messages.1.turnguard.steps.2"); got != nil {
		t.Errorf("an LLM call is a step line: %v", got)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if fmt.Sprint(l.asked) != "[r1]" {
		t.Errorf("details asked for %v, want [r1] (the turn that ended in the history)", l.asked)
	}
}

// TestChatHistoryFinishedTurnsFitTheAnswerBudget: the finished turns'
// details take at most a quarter of server.maxAnswerBytes, newest first;
// a turn whose details do not fit is answered without them, and the
// answer stays within the budget.
func TestChatHistoryFinishedTurnsFitTheAnswerBudget(t *testing.T) {
	const budget = 16 << 10
	l := &detailsOf{d: event.TurnDetail{Approvals: []event.Approval{allowedDeploy(strings.Repeat("deploy ", 150))}}}
	e := newTCPEnv(t, envOpts{details: l.load, adjust: func(c *config.Config) { c.Server.MaxAnswerBytes = budget }})
	c, _ := e.connect("webchat", "")
	for i := range 4 {
		run := fmt.Sprintf("b%d", i)
		c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps say:" + strings.Repeat("y", 1500), "idempotencyKey": run})
		c.chat(run, "final")
	}
	h := c.call("chat.history", map[string]any{"sessionKey": "main"})
	msgs, _ := h.get("messages").([]any)
	if !h.OK || len(h.raw) > budget || len(msgs) == 0 {
		t.Fatalf("chat.history: ok=%v, %d bytes (budget %d), %d messages", h.OK, len(h.raw), budget, len(msgs))
	}
	with := 0
	for _, m := range msgs {
		if lookup(m, "turnguard") != nil {
			with++
		}
	}
	// Each turn's details are about 2.4 KB: one fits in 4 KB, not two.
	if with != 1 || h.str(fmt.Sprintf("messages.%d.turnguard.runId", len(msgs)-1)) != "b3" {
		t.Errorf("%d of %d messages carry details, want 1: the newest turn's (b3)", with, len(msgs))
	}
}
