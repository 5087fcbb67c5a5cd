package ws

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
)

// The demo runner's ask:deploy asks "Run deploy" with Allow / Deny.
const askScript = "/steps ask:deploy say:Finished"

func isApproval(state string) func(frame) bool {
	return func(f frame) bool { return f.Event == "approval" && f.str("state") == state }
}

func isNative(name string) func(frame) bool {
	return func(f frame) bool { return f.Event == name }
}

// ask starts the demo's question in session key from c and returns the
// requested approval event.
func ask(t *testing.T, c *client, key, run string) frame {
	t.Helper()
	ack := c.call("chat.send", map[string]any{"sessionKey": key, "message": askScript, "idempotencyKey": run})
	if !ack.OK {
		t.Fatalf("chat.send: %s", ack.raw)
	}
	f := c.until("approval requested", isApproval("requested"))
	if f.str("runId") != run || f.str("approval.title") != "Run deploy" || f.str("approval.tool") != "deploy" {
		t.Fatalf("requested %s", f.raw)
	}
	if !strings.Contains(f.str("text"), "Run deploy") {
		t.Fatalf("requested text %q", f.str("text"))
	}
	return f
}

func TestApprovalAllowOverWebSocketFinishesTheTurn(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("webchat", "")
	req := ask(t, c, "agent:main:main", "r1")
	id := req.str("approval.id")
	opts := req.get("approval.options").([]any)
	if len(opts) != 2 || lookup(opts[0], "id") != "allow" || lookup(opts[1], "kind") != "reject_once" {
		t.Fatalf("options %v", opts)
	}
	res := c.call("approval.resolve", map[string]any{"id": id, "optionId": "allow"})
	if !res.OK || res.get("already") != false || res.str("approval.outcome") != "selected" || res.str("approval.by") != "web chat" {
		t.Fatalf("resolve %s", res.raw)
	}
	done := c.until("approval resolved", isApproval("resolved"))
	if done.str("approval.id") != id || done.str("approval.optionId") != "allow" || !strings.Contains(done.str("text"), "Allowed in the web chat") {
		t.Fatalf("resolved %s", done.raw)
	}
	final := c.chat("r1", "final")
	if got := final.str("message.content.0.text"); got != "deploy ran (allowed). Finished" {
		t.Fatalf("final %q", got)
	}
	// The web chat (no approvals cap) never gets OpenClaw's approval events.
	for _, f := range c.all {
		if strings.HasPrefix(f.Event, "plugin.approval") {
			t.Fatalf("web chat got %s", f.raw)
		}
	}
	// Payload seq of the run counts the approval events with its others.
	var seqs []float64
	for _, f := range c.all {
		if f.str("runId") == "r1" && f.Type == "event" {
			seqs = append(seqs, f.get("seq").(float64))
		}
	}
	if !slices.IsSorted(seqs) || len(slices.Compact(slices.Clone(seqs))) != len(seqs) {
		t.Fatalf("run payload seqs %v", seqs)
	}
}

func TestApprovalOpenClawNativeEventsListAndResolve(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	tui, _ := e.connect("tui", "")
	tui.call("sessions.subscribe", map[string]any{})
	if l := tui.call("plugin.approval.list", map[string]any{}); !l.OK || string(l.Payload) != "[]" {
		t.Fatalf("empty list %s", l.raw)
	}
	ask(t, tui, "agent:main:main", "r1")
	n := tui.until("plugin.approval.requested", isNative("plugin.approval.requested"))
	id := n.str("id")
	if n.str("request.title") != "Run deploy" || n.str("request.sessionKey") != "agent:main:main" || n.str("request.agentId") != "main" ||
		n.str("request.toolName") != "deploy" || n.str("approvalKind") != "plugin" {
		t.Fatalf("native requested %s", n.raw)
	}
	if d := n.get("request.allowedDecisions").([]any); len(d) != 2 || d[0] != "allow-once" || d[1] != "deny" {
		t.Fatalf("allowedDecisions %v", d)
	}
	if c, x := n.get("createdAtMs").(float64), n.get("expiresAtMs").(float64); c <= 0 || x-c != 300000 {
		t.Fatalf("createdAtMs %v expiresAtMs %v", c, x)
	}
	// What the TUI reloads after a (re)connect.
	l := tui.call("plugin.approval.list", map[string]any{})
	var list []map[string]any
	if err := jsonUnmarshal(l.Payload, &list); err != nil || len(list) != 1 || list[0]["id"] != id ||
		lookup(list[0], "request.sessionKey") != "agent:main:main" {
		t.Fatalf("list %s", l.raw)
	}
	// A decision the question does not offer, and one that is not a decision.
	if r := tui.call("plugin.approval.resolve", map[string]any{"id": id, "decision": "allow-always"}); r.OK ||
		r.Error.Code != CodeInvalidRequest || !strings.Contains(r.Error.Message, "unavailable") {
		t.Fatalf("allow-always %s", r.raw)
	}
	if r := tui.call("plugin.approval.resolve", map[string]any{"id": id, "decision": "yes"}); r.OK || r.Error.Message != "invalid decision: use allow-once, allow-always or deny" {
		t.Fatalf("bad decision %s", r.raw)
	}
	// Deny (the TUI's Esc).
	r := tui.call("plugin.approval.resolve", map[string]any{"id": id, "decision": "deny"})
	if !r.OK || r.get("ok") != true {
		t.Fatalf("deny %s", r.raw)
	}
	res := tui.until("plugin.approval.resolved", isNative("plugin.approval.resolved"))
	if res.str("id") != id || res.str("decision") != "deny" || res.str("resolvedBy") != "TUI" || res.str("outcome") != "selected" {
		t.Fatalf("native resolved %s", res.raw)
	}
	if got := tui.chat("r1", "final").str("message.content.0.text"); got != "deploy was not run: denied. Finished" {
		t.Fatalf("final %q", got)
	}
	// The same decision again is ok (as OpenClaw's gateway); another is
	// "already resolved", which the TUI reads as "no longer pending".
	if r := tui.call("plugin.approval.resolve", map[string]any{"id": id, "decision": "deny"}); !r.OK {
		t.Fatalf("repeat %s", r.raw)
	}
	r = tui.call("plugin.approval.resolve", map[string]any{"id": id, "decision": "allow-once"})
	if r.OK || r.Error.Code != CodeInvalidRequest || !strings.HasPrefix(r.Error.Message, "approval already resolved") ||
		lookup(r.Error.Details, "reason") != "APPROVAL_ALREADY_RESOLVED" {
		t.Fatalf("late allow %s", r.raw)
	}
	if l := tui.call("plugin.approval.list", map[string]any{}); string(l.Payload) != "[]" {
		t.Fatalf("list after %s", l.raw)
	}
}

func TestApprovalOtherSessionRefusedOperatorAllowed(t *testing.T) {
	e := newTCPEnv(t, envOpts{opts: Options{Token: "T", OperatorToken: "OP"}})
	a, _ := e.connect("webchat", "")
	req := ask(t, a, "agent:main:a", "r1")
	id := req.str("approval.id")

	b, _ := e.connect("webchat", "")
	b.call("chat.history", map[string]any{"sessionKey": "agent:main:b"})
	for _, params := range []map[string]any{
		{"id": id, "optionId": "allow"},
		{"id": id, "optionId": "allow", "sessionKey": "agent:main:a"}, // naming it is not having opened it
	} {
		r := b.call("approval.resolve", params)
		if r.OK || r.Error.Code != CodeForbidden || lookup(r.Error.Details, "code") != "APPROVAL_FORBIDDEN" {
			t.Fatalf("other session %v: %s", params, r.raw)
		}
	}
	// A TUI with the shared token is not an operator, whatever scopes it claims.
	tui, _ := e.connect("tui", "")
	tui.call("sessions.subscribe", map[string]any{})
	if r := tui.call("plugin.approval.resolve", map[string]any{"id": id, "decision": "allow-once"}); r.OK || r.Error.Code != CodeForbidden {
		t.Fatalf("tui: %s", r.raw)
	}
	// An operator lists every session's and answers.
	op, _ := e.connect("tui", "OP")
	l := op.call("approval.list", map[string]any{})
	if got := l.get("approvals").([]any); len(got) != 1 || lookup(got[0], "id") != id || lookup(got[0], "sessionKey") != "agent:main:a" {
		t.Fatalf("operator list %s", l.raw)
	}
	r := op.call("approval.resolve", map[string]any{"id": id, "optionId": "deny"})
	if !r.OK || r.str("approval.by") != "operator" || r.str("approval.optionId") != "deny" {
		t.Fatalf("operator %s", r.raw)
	}
	if got := a.chat("r1", "final").str("message.content.0.text"); got != "deploy was not run: denied. Finished" {
		t.Fatalf("final %q", got)
	}
	if !strings.Contains(a.until("resolved", isApproval("resolved")).str("text"), "Denied by the operator") {
		t.Fatal("the chat is not told who answered")
	}
}

// TestSharedTokenHolderIsTheOperator: with server.operatorToken not set
// (config makes it server.token), a client presenting server.token with an
// approvals scope is the operator, as on /api and /admin with the same
// token: it lists every session's questions and answers one of a
// conversation it has not opened (issue 22: the OpenClaw CLI's
// plugin.approval.resolve got FORBIDDEN while plugin.approval.list worked);
// the web chat answering its own question is still shown as the web chat.
func TestSharedTokenHolderIsTheOperator(t *testing.T) {
	e := newTCPEnv(t, envOpts{opts: Options{Token: "T", OperatorToken: "T"}})
	a, _ := e.connect("webchat", "T")
	id := ask(t, a, "agent:main:a", "r1").str("approval.id")

	cli := e.connectRaw("")
	cli.read()
	params := connectFixture(t, "cli", "T")
	params["scopes"] = []any{"operator.read", "operator.approvals"}
	if hello := cli.call("connect", params); !hello.OK || hello.get("auth.operator") != true {
		t.Fatalf("connect with the shared token: %s", hello.raw)
	}
	r := cli.call("plugin.approval.resolve", map[string]any{"id": id, "decision": "allow-once"})
	if !r.OK {
		t.Fatalf("plugin.approval.resolve with the shared token: %s", r.raw)
	}
	if !strings.Contains(a.until("resolved", isApproval("resolved")).str("text"), "✅ Allowed by the operator: Run deploy") {
		t.Fatal("the chat is not told the operator answered")
	}

	// The web chat answers its own next question: shown as the web chat.
	id2 := ask(t, a, "agent:main:a", "r2").str("approval.id")
	if r := a.call("approval.resolve", map[string]any{"id": id2, "optionId": "allow"}); !r.OK ||
		r.str("text") != "✅ Allowed in the web chat: Run deploy" {
		t.Fatalf("the web chat's own answer: %s", r.raw)
	}
}

func TestApprovalSecondAnswerIsANoOp(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("webchat", "")
	id := ask(t, c, "main", "r1").str("approval.id")
	if r := c.call("approval.resolve", map[string]any{"id": id, "optionId": "allow", "sessionKey": "main"}); !r.OK || r.get("already") != false {
		t.Fatalf("first %s", r.raw)
	}
	c.chat("r1", "final")
	r := c.call("approval.resolve", map[string]any{"id": id, "optionId": "deny"})
	if !r.OK || r.get("already") != true || r.str("approval.optionId") != "allow" || !strings.HasPrefix(r.str("text"), "✅ Allow") {
		t.Fatalf("second %s", r.raw)
	}
	n := 0
	for _, f := range c.all {
		if f.Event == "approval" && f.str("state") == "resolved" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d resolved events, want 1", n)
	}
}

func TestApprovalReattachShowsOpenQuestion(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	a, _ := e.connect("webchat", "")
	id := ask(t, a, "agent:main:main", "r1").str("approval.id")
	a.ws.Close() // the page reloads mid-turn

	b, _ := e.connect("webchat", "")
	h := b.call("chat.history", map[string]any{"sessionKey": "agent:main:main", "limit": 200})
	aps, _ := h.get("turnguard.approvals").([]any)
	if len(aps) != 1 || lookup(aps[0], "id") != id || lookup(aps[0], "runId") != "r1" ||
		!strings.Contains(lookup(aps[0], "text").(string), "Run deploy") || len(lookup(aps[0], "options").([]any)) != 2 {
		t.Fatalf("history turnguard %s", h.raw)
	}
	if l := b.call("approval.list", map[string]any{}); len(l.get("approvals").([]any)) != 1 {
		t.Fatalf("list %s", l.raw)
	}
	if r := b.call("approval.resolve", map[string]any{"id": id, "optionId": "allow"}); !r.OK {
		t.Fatalf("resolve after reattach %s", r.raw)
	}
	if got := b.chat("r1", "final").str("message.content.0.text"); got != "deploy ran (allowed). Finished" {
		t.Fatalf("final %q", got)
	}
	h = b.call("chat.history", map[string]any{"sessionKey": "agent:main:main"})
	if h.get("turnguard") != nil {
		t.Fatalf("idle history %s", h.raw)
	}
}

func TestApprovalStopSettlesTheQuestionAsStopped(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	tui, _ := e.connect("tui", "")
	tui.call("sessions.subscribe", map[string]any{})
	id := ask(t, tui, "agent:main:main", "r1").str("approval.id")
	if r := tui.call("chat.abort", map[string]any{"sessionKey": "agent:main:main"}); !r.OK || r.get("aborted") != true {
		t.Fatalf("abort %s", r.raw)
	}
	res := tui.until("resolved", isApproval("resolved"))
	if res.str("approval.outcome") != "cancelled" || !strings.HasPrefix(res.str("text"), "⏹️") {
		t.Fatalf("resolved %s", res.raw)
	}
	n := tui.until("native resolved", isNative("plugin.approval.resolved"))
	if n.str("id") != id || n.str("decision") != "deny" || n.str("outcome") != "cancelled" {
		t.Fatalf("native %s", n.raw)
	}
	tui.chat("r1", "aborted")
	// Resolved before the aborted chat event, so a client closes the card first.
	iRes, iAb := -1, -1
	for i, f := range tui.all {
		switch {
		case f.Event == "approval" && f.str("state") == "resolved":
			iRes = i
		case f.Event == "chat" && f.str("state") == "aborted":
			iAb = i
		}
	}
	if iRes < 0 || iRes > iAb {
		t.Fatalf("resolved at %d, aborted at %d", iRes, iAb)
	}
	e.waitIdle()
	if r := tui.call("approval.resolve", map[string]any{"id": id, "optionId": "allow"}); !r.OK || r.get("already") != true || r.str("approval.outcome") != "cancelled" {
		t.Fatalf("late answer %s", r.raw)
	}
}

func TestApprovalBadInput(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("tui", "")
	c.call("chat.history", map[string]any{"sessionKey": "main"})
	for _, tc := range []struct {
		method string
		params any
		code   string
		msg    string
	}{
		{"approval.resolve", []int{1}, CodeInvalidRequest, "invalid approval.resolve params: must be an object"},
		{"approval.resolve", map[string]any{"id": 5, "optionId": "allow"}, CodeInvalidRequest, "invalid approval.resolve params: id must be a string, not number"},
		{"approval.resolve", map[string]any{"optionId": "allow"}, CodeInvalidRequest, "invalid approval.resolve params: id is required"},
		{"approval.resolve", map[string]any{"id": "ap_x"}, CodeInvalidRequest, "invalid approval.resolve params: optionId is required"},
		{"approval.resolve", map[string]any{"id": strings.Repeat("x", 1<<16), "optionId": "allow"}, CodeInvalidRequest, "invalid approval.resolve params: id is longer than 128 bytes"},
		{"approval.resolve", map[string]any{"id": "ap_x", "optionId": strings.Repeat("y", 200)}, CodeInvalidRequest, "invalid approval.resolve params: optionId is longer than 128 bytes"},
		{"approval.resolve", map[string]any{"id": "ap_nope", "optionId": "allow"}, CodeInvalidRequest, "unknown or expired approval id"},
		{"approval.resolve", map[string]any{"id": "ap_x", "optionId": "allow", "sessionKey": "a b"}, CodeInvalidRequest, "invalid approval.resolve params: sessionKey must not contain spaces or control characters"},
		{"plugin.approval.resolve", map[string]any{"id": "ap_nope", "decision": "deny"}, CodeInvalidRequest, "unknown or expired approval id"},
		{"plugin.approval.resolve", map[string]any{"id": strings.Repeat("z", 1<<16), "decision": "deny"}, CodeInvalidRequest, "invalid plugin.approval.resolve params: id is longer than 128 bytes"},
		{"plugin.approval.resolve", "x", CodeInvalidRequest, "invalid plugin.approval.resolve params: must be an object"},
		{"approval.list", map[string]any{"sessionKey": 7}, CodeInvalidRequest, "invalid approval.list params: sessionKey must be a string, not number"},
	} {
		r := c.call(tc.method, tc.params)
		if r.OK || r.Error.Code != tc.code || r.Error.Message != tc.msg {
			t.Errorf("%s %v: %s", tc.method, tc.params, clip(r.raw, 300))
		}
	}
	// A question with a wrong option says which there are.
	id := ask(t, c, "main", "r1").str("approval.id")
	r := c.call("approval.resolve", map[string]any{"id": id, "optionId": "maybe"})
	if r.OK || lookup(r.Error.Details, "code") != "APPROVAL_OPTION" || len(lookup(r.Error.Details, "options").([]any)) != 2 {
		t.Fatalf("bad option %s", r.raw)
	}
	// A client that claims no approvals scope lists nothing.
	cli, _ := e.connect("cli", "")
	if r := cli.call("plugin.approval.list", nil); r.OK || r.Error.Code != CodeForbidden {
		t.Fatalf("cli list %s", r.raw)
	}
	c.call("approval.resolve", map[string]any{"id": id, "optionId": "allow"})
	c.chat("r1", "final")
}

// TestApprovalTimeoutDenies: unanswered, the question is denied after
// approvalTimeoutSeconds, and the client is told so.
func TestApprovalTimeoutDenies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{opts: Options{Token: "T"}, adjust: func(c *config.Config) {
			c.Agents.Defaults.ApprovalTimeoutSeconds = secs(60)
		}})
		c, _ := e.connect("tui", "")
		c.wait = 10 * time.Minute
		ask(t, c, "main", "r1")
		start := time.Now()
		// Reading lets the bubble's clock run to the next timer (net.Pipe has
		// no buffer: the client must read the ticks meanwhile).
		res := c.until("resolved", isApproval("resolved"))
		if res.str("approval.outcome") != "timeout" || time.Since(start) != 60*time.Second || !strings.HasPrefix(res.str("text"), "⌛") {
			t.Fatalf("after %v: %s", time.Since(start), res.raw)
		}
		if n := c.until("native", isNative("plugin.approval.resolved")); n.str("decision") != "deny" || n.str("outcome") != "timeout" {
			t.Fatalf("native %s", n.raw)
		}
		if got := c.chat("r1", "final").str("message.content.0.text"); got != "deploy was not run: no answer in time. Finished" {
			t.Fatalf("final %q", got)
		}
	})
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
