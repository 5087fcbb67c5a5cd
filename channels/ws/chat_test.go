package ws

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
)

func TestChatSendStreamsToolsAndFinal(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("tui", "")
	c.call("sessions.subscribe", map[string]any{})
	ack := c.call("chat.send", map[string]any{"sessionKey": "agent:main:main", "message": "/steps shell:20ms llm:40ms say:Found_it",
		"idempotencyKey": "run-1"})
	if !ack.OK || ack.str("runId") != "run-1" || ack.str("status") != "started" {
		t.Fatalf("ack %s", ack.raw)
	}
	final := c.chat("run-1", "final")
	if got := final.str("message.content.0.text"); got != "Thinking about the next step. Found it" {
		t.Fatalf("final text %q", got)
	}
	if final.str("stopReason") != "stop" || final.str("sessionKey") != "agent:main:main" || final.get("endedAt") == nil {
		t.Fatalf("final %s", final.raw)
	}
	c.until("lifecycle end", func(f frame) bool { return f.Event == "agent" && f.str("data.phase") == "end" })

	got := c.runEvents("run-1")
	// Deltas: the llm step streams in chunks; collapse them for the comparison.
	got = slices.Compact(got)
	want := []string{"lifecycle:start", "tool:start:shell", "tool:result:shell", "chat:delta", "chat:final", "lifecycle:end"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v\nwant %v", got, want)
	}
	// Every delta carries its chunk and the full text so far.
	var text string
	for _, f := range c.all {
		if f.Event == "chat" && f.str("state") == "delta" {
			text += f.str("deltaText")
			if full := f.str("message.content.0.text"); full != text {
				t.Fatalf("delta message %q, want the full text so far %q", full, text)
			}
		}
	}
	// Tool events carry a toolCallId shared by start and result.
	var ids []string
	for _, f := range c.all {
		if f.Event == "agent" && f.str("stream") == "tool" {
			ids = append(ids, f.str("data.toolCallId"))
		}
	}
	if len(ids) != 2 || ids[0] != ids[1] || !strings.HasPrefix(ids[0], "run-1:") {
		t.Fatalf("toolCallIds %v", ids)
	}
}

func TestToolEventsOnlyForToolEventsCap(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	cli, _ := e.connect("cli", "")
	ack := cli.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:10ms", "idempotencyKey": "r"})
	if !ack.OK {
		t.Fatal(ack.raw)
	}
	cli.chat("r", "final")
	cli.until("lifecycle end", func(f frame) bool { return f.Event == "agent" && f.str("data.phase") == "end" })
	if got := cli.runEvents("r"); !slices.Equal(got, []string{"lifecycle:start", "chat:delta", "chat:final", "lifecycle:end"}) {
		t.Fatalf("cli (no tool-events cap) saw %v", got)
	}
}

func TestSessionKeysMainAndCanonicalAreOneSession(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("cli", "")
	c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps say:hello", "idempotencyKey": "k1"})
	f := c.chat("k1", "final")
	if f.str("sessionKey") != "agent:main:main" {
		t.Fatalf("event session key %q", f.str("sessionKey"))
	}
	h := c.call("chat.history", map[string]any{"sessionKey": "agent:main:main", "limit": 200})
	if !h.OK || h.str("sessionKey") != "agent:main:main" || h.str("verboseLevel") != "on" || h.str("sessionId") == "" {
		t.Fatalf("history %s", h.raw)
	}
	msgs, _ := h.get("messages").([]any)
	if len(msgs) != 2 || h.str("messages.0.role") != "user" || h.str("messages.0.content.0.text") != "/steps say:hello" ||
		h.str("messages.1.role") != "assistant" || h.str("messages.1.content.0.text") != "hello" ||
		h.get("messages.1.timestamp") == nil {
		t.Fatalf("history messages %s", h.raw)
	}
	// The session is busy/idle under either spelling.
	d := c.call("sessions.describe", map[string]any{"key": "main"})
	if d.str("session.key") != "agent:main:main" || d.str("session.sessionId") != h.str("sessionId") || d.str("session.verboseLevel") != "on" {
		t.Fatalf("describe %s", d.raw)
	}
}

func TestIdempotency(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("tui", "")
	send := func() frame {
		return c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "same"})
	}
	if a := send(); a.str("status") != "started" {
		t.Fatalf("first %s", a.raw)
	}
	if a := send(); !a.OK || a.str("status") != "in_flight" || a.str("runId") != "same" {
		t.Fatalf("repeat while running %s", a.raw)
	}
	c.call("chat.abort", map[string]any{"sessionKey": "main", "runId": "same"})
	c.chat("same", "aborted")
	a := send()
	if !a.OK || a.str("status") != "timeout" || a.str("stopReason") != "user" || !strings.HasPrefix(a.str("summary"), "⏹️ Stopped") {
		t.Fatalf("repeat after the end %s", a.raw)
	}
	starts := 0
	for _, f := range c.all {
		if f.Event == "agent" && f.str("stream") == "lifecycle" && f.str("data.phase") == "start" {
			starts++
		}
	}
	if starts != 1 {
		t.Fatalf("%d turns started for one idempotencyKey", starts)
	}
	// A finished ok run answers "ok".
	e.waitIdle() // the aborted runner has returned: the session is free
	c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps say:x", "idempotencyKey": "done"})
	c.chat("done", "final")
	if a := c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps say:x", "idempotencyKey": "done"}); a.str("status") != "ok" {
		t.Fatalf("repeat of a finished run %s", a.raw)
	}
}

func TestBusySessionRefused(t *testing.T) {
	e := newTCPEnv(t, envOpts{adjust: func(c *config.Config) { c.Channels.WS.Busy.Mode = config.BusyReject }})
	c, _ := e.connect("tui", "")
	c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "a"})
	r := c.call("chat.send", map[string]any{"sessionKey": "agent:main:main", "message": "hello?", "idempotencyKey": "b"})
	if r.OK || r.Error.Code != "UNAVAILABLE" || !strings.Contains(r.Error.Message, "still working on your previous message") {
		t.Fatalf("busy %s", r.raw)
	}
	// Another session is not busy.
	if r := c.call("chat.send", map[string]any{"sessionKey": "other", "message": "/steps say:hi", "idempotencyKey": "c"}); r.str("status") != "started" {
		t.Fatalf("other session %s", r.raw)
	}
}

func TestFanOutToTwoClientsOnOneSession(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	a, _ := e.connect("tui", "")
	b, _ := e.connect("tui", "")
	// b watches the way the TUI does at start-up (history of its session);
	// a third client watches another session and must see nothing.
	b.call("chat.history", map[string]any{"sessionKey": "agent:main:main", "limit": 200})
	other, _ := e.connect("tui", "")
	other.call("chat.history", map[string]any{"sessionKey": "agent:main:elsewhere"})

	a.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps web_search:10ms say:Shared_reply", "idempotencyKey": "fan"})
	fa := a.chat("fan", "final")
	fb := b.chat("fan", "final")
	if fa.str("message.content.0.text") != "Shared reply" || fb.str("message.content.0.text") != "Shared reply" {
		t.Fatalf("finals %s / %s", fa.raw, fb.raw)
	}
	b.until("lifecycle end", func(f frame) bool { return f.Event == "agent" && f.str("data.phase") == "end" })
	if got := b.runEvents("fan"); !slices.Equal(got, []string{"lifecycle:start", "tool:start:web_search", "tool:result:web_search", "chat:delta", "chat:final", "lifecycle:end"}) {
		t.Fatalf("watcher saw %v", got)
	}
	if h := other.call("health", nil); !h.OK {
		t.Fatal(h.raw)
	}
	if got := other.runEvents("fan"); len(got) != 0 {
		t.Fatalf("a client watching another session saw %v", got)
	}
}

func TestAbortAuthorization(t *testing.T) {
	e := newTCPEnv(t, envOpts{opts: Options{Token: "T", OperatorToken: "OP"}})
	owner := e.connectDevice(deviceKey(11), "T", nil)
	stranger := e.connectDevice(deviceKey(12), "T", nil) // clients without a device key share one identity
	op, _ := e.connect("probe", "OP")

	owner.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "r1"})
	if r := stranger.call("chat.abort", map[string]any{"sessionKey": "main", "runId": "r1"}); r.OK || r.Error.Code != "FORBIDDEN" {
		t.Fatalf("stranger abort %s", r.raw)
	}
	if r := stranger.call("chat.abort", map[string]any{"sessionKey": "main"}); r.OK || r.Error.Code != "FORBIDDEN" {
		t.Fatalf("stranger abort without runId %s", r.raw)
	}
	if r := owner.call("chat.abort", map[string]any{"sessionKey": "agent:main:other", "runId": "r1"}); r.OK ||
		r.Error.Message != "runId does not match sessionKey" {
		t.Fatalf("wrong session %s", r.raw)
	}
	// The owner aborts without a runId (the TUI's Esc); the aborted event
	// arrives before the response.
	id := owner.request("chat.abort", map[string]any{"sessionKey": "agent:main:main", "preserveSideRuns": true})
	ab := owner.chat("r1", "aborted")
	res := owner.response(id)
	if !res.OK || res.get("aborted") != true || res.str("runIds") != "[r1]" {
		t.Fatalf("owner abort %s", res.raw)
	}
	if ab.str("stopReason") != "user" || !strings.HasPrefix(ab.str("errorMessage"), "⏹️ Stopped while shell was running") {
		t.Fatalf("aborted event %s", ab.raw)
	}
	if i, j := indexOf(owner.all, ab.raw), indexOf(owner.all, res.raw); i > j {
		t.Fatal("aborted event came after the abort response")
	}
	// Nothing running: aborted false, no run ids.
	if r := owner.call("chat.abort", map[string]any{"sessionKey": "main"}); !r.OK || r.get("aborted") != false || r.str("runIds") != "[]" {
		t.Fatalf("idle abort %s", r.raw)
	}
	// An operator may abort anyone's run.
	e.waitIdle()
	owner.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "r2"})
	if r := op.call("chat.abort", map[string]any{"sessionKey": "main", "runId": "r2"}); !r.OK || r.get("aborted") != true {
		t.Fatalf("operator abort %s", r.raw)
	}
	owner.chat("r2", "aborted")
}

// A TUI that reconnects (same device key, a new connection) may still stop
// the run it started: the identity is the device it proved, not the
// connection.
func TestAbortSurvivesReconnectOfTheSameDevice(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	key := deviceKey(1)
	first := e.connectDevice(key, "", nil)
	first.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "r1"})
	first.ws.Close()
	again := e.connectDevice(key, "", nil)
	if r := again.call("chat.abort", map[string]any{"sessionKey": "main"}); !r.OK || r.get("aborted") != true {
		t.Fatalf("abort after reconnect %s", r.raw)
	}
}

// The web chat signs the challenge the way chat.js does (its client id,
// mode, platform "web", deviceFamily "browser", its scopes, the token, the
// challenge's ts and nonce), with a key the browser keeps: after its socket
// drops, the page's Stop still stops the turn it started. Without the
// device block (a browser without WebCrypto Ed25519) the run belongs to
// every holder of the token without a device key, so the reloaded page may
// stop it too (TestNoDeviceConnectionsShareRunOwnership).
func TestWebChatOwnsItsRunAcrossReconnect(t *testing.T) {
	const token = "web-token-5e1d"
	e := newTCPEnv(t, envOpts{opts: Options{Token: token}})
	key := deviceKey(3)

	first := e.connectSigned("webchat", key, token, nil)
	first.call("chat.send", map[string]any{"sessionKey": "agent:main:web", "message": "/steps shell:hang", "idempotencyKey": "w1"})
	e.waitStep("agent:main:web", "shell")
	first.ws.Close()
	if r := e.connectSigned("webchat", deviceKey(4), token, nil).call("chat.abort",
		map[string]any{"sessionKey": "agent:main:web", "runId": "w1"}); r.OK || r.Error.Code != CodeForbidden {
		t.Fatalf("another browser's key stopped the run: %s", r.raw)
	}
	again := e.connectSigned("webchat", key, token, nil)
	id := again.request("chat.abort", map[string]any{"sessionKey": "agent:main:web", "runId": "w1"})
	ab := again.chat("w1", "aborted")
	if r := again.response(id); !r.OK || r.get("aborted") != true {
		t.Fatalf("the reconnected page's Stop: %s", r.raw)
	}
	if ab.str("stopReason") != "user" || !strings.HasPrefix(ab.str("errorMessage"), "⏹️ Stopped") {
		t.Fatalf("aborted event %s", ab.raw)
	}

	// Unsigned: the run is every unsigned token holder's; the reloaded
	// page may stop it.
	e.waitIdle()
	plain, _ := e.connect("webchat", token)
	plain.call("chat.send", map[string]any{"sessionKey": "agent:main:web", "message": "/steps shell:hang", "idempotencyKey": "w2"})
	plain.ws.Close()
	back, _ := e.connect("webchat", token)
	if r := back.call("chat.abort", map[string]any{"sessionKey": "agent:main:web", "runId": "w2"}); !r.OK || r.get("aborted") != true {
		t.Fatalf("an unsigned page's new connection could not stop its run: %s", r.raw)
	}
}

func indexOf(fs []frame, raw string) int {
	for i, f := range fs {
		if f.raw == raw {
			return i
		}
	}
	return -1
}

func TestErrorRunAndHistoryKeepsNotices(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("tui", "")
	c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:abc", "idempotencyKey": "bad"})
	f := c.chat("bad", "error")
	if !strings.Contains(f.str("errorMessage"), `token 1 "shell:abc"`) {
		t.Fatalf("error event %s", f.raw)
	}
	c.until("lifecycle error", func(f frame) bool { return f.Event == "agent" && f.str("data.phase") == "error" })

	c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps say:partial shell:hang", "idempotencyKey": "stop"})
	c.until("delta", func(f frame) bool { return f.Event == "chat" && f.str("state") == "delta" && f.str("runId") == "stop" })
	e.waitStep("agent:main:main", "shell")
	c.call("chat.abort", map[string]any{"sessionKey": "main", "runId": "stop"})
	ab := c.chat("stop", "aborted")
	if ab.str("message.content.0.text") != "partial" {
		t.Fatalf("aborted event lacks the partial text: %s", ab.raw)
	}
	h := c.call("chat.history", map[string]any{"sessionKey": "main"})
	var texts []string
	for _, m := range h.get("messages").([]any) {
		texts = append(texts, lookup(m, "role").(string)+": "+lookup(m, "content.0.text").(string))
	}
	want := []string{
		"user: /steps shell:abc",
		`assistant: bad /steps script: token 1 "shell:abc": "abc" is not a duration (use 300ms, 2s, hang or stuck)`,
		"user: /steps say:partial shell:hang",
		"assistant: partial",
	}
	if len(texts) != 5 || !slices.Equal(texts[:4], want) || !strings.HasPrefix(texts[4], "assistant: ⏹️ Stopped while shell was running") {
		t.Fatalf("history:\n%s", strings.Join(texts, "\n"))
	}
	if h.str("messages.4.stopReason") != "user" {
		t.Fatalf("notice stopReason %q", h.str("messages.4.stopReason"))
	}
}

func TestMethodsAnswerTruthfully(t *testing.T) {
	e := newTCPEnv(t, envOpts{opts: Options{Version: "turnguard 0.1.0"}})
	c, _ := e.connect("tui", "")
	cases := []struct {
		method string
		params any
		want   map[string]any // payload path → value
	}{
		{"health", nil, map[string]any{"ok": true}},
		{"status", nil, map[string]any{"runtimeVersion": "turnguard 0.1.0", "heartbeat.defaultAgentId": "main", "sessions.defaults.model": "demo"}},
		{"sessions.subscribe", map[string]any{}, map[string]any{"subscribed": true}},
		{"agents.list", map[string]any{}, map[string]any{"defaultId": "main", "agents.0.id": "main", "mainKey": "main"}},
		{"question.list", map[string]any{}, map[string]any{"questions": []any{}}},
		{"commands.list", map[string]any{"agentId": "main", "scope": "text", "includeArgs": false}, map[string]any{"commands.0.name": "stop", "commands.4.name": "help"}},
		{"models.list", map[string]any{}, map[string]any{"models.0.id": "demo", "models.0.provider": "turnguard"}},
		{"sessions.list", map[string]any{"agentId": "main", "limit": 1}, map[string]any{"defaults.model": "demo", "defaults.contextTokens": float64(100000)}},
		{"sessions.describe", map[string]any{"key": "agent:main:main"}, map[string]any{"session.key": "agent:main:main", "session.verboseLevel": "on", "session.kind": "direct"}},
		{"sessions.patch", map[string]any{"key": "main", "verboseLevel": "full"}, map[string]any{"ok": true, "key": "agent:main:main", "entry.verboseLevel": "on"}},
		{"sessions.reset", map[string]any{"key": "main"}, map[string]any{"ok": true, "key": "agent:main:main"}},
		{"sessions.create", map[string]any{"key": "scratch"}, map[string]any{"key": "agent:main:scratch"}},
	}
	for _, tc := range cases {
		r := c.call(tc.method, tc.params)
		if !r.OK {
			t.Errorf("%s: %s", tc.method, r.raw)
			continue
		}
		for path, v := range tc.want {
			got := r.get(path)
			if gs, ok := v.([]any); ok {
				if a, ok := got.([]any); !ok || len(a) != len(gs) {
					t.Errorf("%s %s = %v, want %v", tc.method, path, got, v)
				}
				continue
			}
			if got != v {
				t.Errorf("%s %s = %v, want %v", tc.method, path, got, v)
			}
		}
	}
	if r := c.call("plugin.approval.list", map[string]any{}); !r.OK || string(r.Payload) != "[]" {
		t.Errorf("plugin.approval.list %s", r.raw)
	}
}

func TestResetStartsFreshHistory(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("cli", "")
	c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps say:one", "idempotencyKey": "1"})
	c.chat("1", "final")
	before := c.call("chat.history", map[string]any{"sessionKey": "main"})
	c.call("sessions.reset", map[string]any{"key": "main"})
	after := c.call("chat.history", map[string]any{"sessionKey": "main"})
	if after.str("sessionId") == before.str("sessionId") || len(after.get("messages").([]any)) != 0 {
		t.Fatalf("after reset %s", after.raw)
	}
}

func TestAgentMethodAnswersTwice(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("cli", "")
	id := c.request("agent", map[string]any{"message": "/steps web_search:10ms say:All_good", "idempotencyKey": "ag1", "agentId": "main"})
	first := c.response(id)
	if !first.OK || first.str("status") != "accepted" || first.str("runId") != "ag1" || first.str("sessionKey") != "agent:main:main" ||
		first.get("acceptedAt") == nil {
		t.Fatalf("first response %s", first.raw)
	}
	second := c.response(id)
	if !second.OK || second.str("status") != "ok" || second.str("summary") != "completed" ||
		second.str("result.payloads.0.text") != "All good" || second.get("result.meta.durationMs") == nil {
		t.Fatalf("second response %s", second.raw)
	}
	// agent.wait on a finished run answers at once.
	w := c.call("agent.wait", map[string]any{"runId": "ag1", "timeoutMs": 1000})
	if w.str("status") != "ok" || w.get("startedAt") == nil || w.get("endedAt") == nil {
		t.Fatalf("agent.wait %s", w.raw)
	}
	// An aborted run: status timeout, summary the notice.
	id = c.request("agent", map[string]any{"message": "/steps shell:hang", "idempotencyKey": "ag2", "sessionKey": "main"})
	c.response(id)
	waitID := c.request("agent.wait", map[string]any{"runId": "ag2", "timeoutMs": 60000})
	c.call("chat.abort", map[string]any{"sessionKey": "main", "runId": "ag2"})
	second = c.response(id)
	if !second.OK || second.str("status") != "timeout" || second.str("stopReason") != "user" || !strings.HasPrefix(second.str("summary"), "⏹️ Stopped") {
		t.Fatalf("aborted agent %s", second.raw)
	}
	if w := c.response(waitID); w.str("status") != "timeout" || w.str("stopReason") != "user" {
		t.Fatalf("agent.wait of the aborted run %s", w.raw)
	}
	// A failing run: ok:false with the payload.
	id = c.request("agent", map[string]any{"message": "/steps shell:xyz", "idempotencyKey": "ag3"})
	c.response(id)
	second = c.response(id)
	if second.OK || second.Error.Code != "UNAVAILABLE" || second.str("status") != "error" {
		t.Fatalf("failed agent %s", second.raw)
	}
	// Unknown run: timeout.
	if w := c.call("agent.wait", map[string]any{"runId": "nope", "timeoutMs": 10}); w.str("status") != "timeout" {
		t.Fatalf("agent.wait unknown %s", w.raw)
	}
}

func TestBadRequestsAfterHello(t *testing.T) {
	e := newTCPEnv(t, envOpts{adjust: func(c *config.Config) { c.Server.MaxMessageChars = 20 }})
	c, _ := e.connect("cli", "")
	cases := []struct {
		name  string
		frame string
		code  string
		msg   string
	}{
		{"unknown method", `{"type":"req","id":"1","method":"frobnicate"}`, "INVALID_REQUEST", "unknown method: frobnicate"},
		{"malformed JSON", `{"type":"req","id":"2",`, "INVALID_REQUEST", "invalid frame: malformed JSON at byte"},
		{"not a request", `{"type":"event","event":"x"}`, "INVALID_REQUEST", `invalid frame: type must be "req"`},
		{"id not a string", `{"type":"req","id":5,"method":"health"}`, "INVALID_REQUEST", "invalid frame: id must be a string"},
		{"params not an object", `{"type":"req","id":"3","method":"chat.send","params":[1]}`, "INVALID_REQUEST", "invalid chat.send params: must be an object"},
		{"message of wrong type", `{"type":"req","id":"4","method":"chat.send","params":{"message":5,"idempotencyKey":"k"}}`, "INVALID_REQUEST", "invalid chat.send params: message must be a string, not number"},
		{"no idempotencyKey", `{"type":"req","id":"5","method":"chat.send","params":{"message":"hi"}}`, "INVALID_REQUEST", "invalid chat.send params: idempotencyKey is required"},
		{"no message", `{"type":"req","id":"6","method":"chat.send","params":{"idempotencyKey":"k"}}`, "INVALID_REQUEST", "invalid chat.send params: message is required"},
		{"blank message", `{"type":"req","id":"7","method":"chat.send","params":{"message":"  ","idempotencyKey":"k"}}`, "INVALID_REQUEST", "invalid chat.send params: message is empty"},
		{"message too long", `{"type":"req","id":"8","method":"chat.send","params":{"message":"` + strings.Repeat("x", 21) + `","idempotencyKey":"k"}}`, "INVALID_REQUEST", "✂️ That message is too long (21 characters; the limit is 20). Please shorten it or split it."},
		{"negative timeoutMs", `{"type":"req","id":"9","method":"chat.send","params":{"message":"hi","idempotencyKey":"k","timeoutMs":-1}}`, "INVALID_REQUEST", "invalid chat.send params: timeoutMs must be ≥ 0"},
		{"bad session key", `{"type":"req","id":"10","method":"chat.history","params":{"sessionKey":"agent:main"}}`, "INVALID_REQUEST", `invalid chat.history params: sessionKey "agent:main" is not agent:<agentId>:<key>`},
		{"session key with spaces", `{"type":"req","id":"11","method":"chat.history","params":{"sessionKey":"a b"}}`, "INVALID_REQUEST", "invalid chat.history params: sessionKey must not contain spaces"},
		{"agent without message", `{"type":"req","id":"12","method":"agent","params":{"idempotencyKey":"k"}}`, "INVALID_REQUEST", "invalid agent params: message is required"},
		{"agent.wait without runId", `{"type":"req","id":"13","method":"agent.wait","params":{}}`, "INVALID_REQUEST", "invalid agent.wait params: runId is required"},
		{"second connect", `{"type":"req","id":"14","method":"connect","params":{"minProtocol":4,"maxProtocol":4}}`, "INVALID_REQUEST", "already connected"},
	}
	for _, tc := range cases {
		if err := c.ws.WriteMessage(1, []byte(tc.frame)); err != nil {
			t.Fatal(err)
		}
		r := c.until(tc.name, func(f frame) bool { return f.Type == "res" })
		if r.OK || r.Error.Code != tc.code || !strings.HasPrefix(r.Error.Message, tc.msg) {
			t.Errorf("%s: %s, want %s %q", tc.name, r.raw, tc.code, tc.msg)
		}
	}
	// The connection is still usable.
	if r := c.call("health", nil); !r.OK {
		t.Fatalf("health after bad input: %s", r.raw)
	}
}

// TestChatSendRefusedWhileNotAcceptingTurns: while the gateway cannot take
// turns (its store cannot write), chat.send is refused with UNAVAILABLE,
// retryable, in words a person can read (no internal cause); once it can,
// the same request starts the turn.
func TestChatSendRefusedWhileNotAcceptingTurns(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	e := newTCPEnv(t, envOpts{admit: func() error {
		if refuse.Load() {
			return errors.New("store cannot write since 2000-01-01T00:00:00Z: the disk is full")
		}
		return nil
	}})
	c, _ := e.connect("tui", "")
	params := map[string]any{"sessionKey": "main", "message": "/steps say:hi", "idempotencyKey": "r1"}
	r := c.call("chat.send", params)
	if r.OK || r.Error == nil || r.Error.Code != CodeUnavailable || !r.Error.Retryable || r.Error.RetryAfterMs <= 0 ||
		!strings.Contains(r.Error.Message, "try again shortly") || strings.Contains(r.Error.Message, "disk") {
		t.Fatalf("chat.send while not accepting turns: %s", r.raw)
	}
	refuse.Store(false)
	if r := c.call("chat.send", params); !r.OK || r.str("status") != "started" {
		t.Fatalf("chat.send once accepting again: %s", r.raw)
	}
	c.chat("r1", "final")
}

// A message sent while its session's turn runs is queued (the default busy
// mode): chat.send answers with its status, place and words, and the
// message runs as its own turn, with its idempotencyKey as runId, once the
// running turn has ended.
func TestBusySessionQueues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{})
		c, _ := e.connect("tui", "")
		c.wait = time.Hour
		c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps work:20s say:First", "idempotencyKey": "a"})
		r := c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps say:Second", "idempotencyKey": "b"})
		want := `{"runId":"b","status":"queued","busy":"queue","ahead":0,"text":"📥 Queued — I'll get to it right after the current request."}`
		if !r.OK || string(r.Payload) != want {
			t.Fatalf("busy chat.send answered %s, want %s", r.raw, want)
		}
		if r := c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps say:Second", "idempotencyKey": "b"}); r.str("status") != "queued" {
			t.Fatalf("a repeated idempotencyKey of a queued message answered %s", r.raw)
		}
		// The words name the same number as ahead (they said "(2 ahead)"
		// for ahead 1: the running request was counted too).
		r = c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps say:Third", "idempotencyKey": "c"})
		want = `{"runId":"c","status":"queued","busy":"queue","ahead":1,"text":"📥 Queued — I'll get to it after the current request and 1 queued before it."}`
		if !r.OK || string(r.Payload) != want {
			t.Fatalf("second queued chat.send answered %s, want %s", r.raw, want)
		}
		if got := c.chat("a", "final").str("message.content.0.text"); got != "First" {
			t.Fatalf("first reply %q", got)
		}
		if got := c.chat("b", "final").str("message.content.0.text"); got != "Second" {
			t.Fatalf("queued reply %q", got)
		}
	})
}

// One message more than busy.maxQueued, or one past busy.maxQueuedBytes, is
// refused with words and a code a client can branch on.
func TestBusyQueueFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		one, budget := 1, 10
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) {
			c.Agents.Defaults.Busy.MaxQueued = &one
			c.Agents.Defaults.Busy.MaxQueuedBytes = &budget
		}})
		c, _ := e.connect("tui", "")
		c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "a"})
		r := c.call("chat.send", map[string]any{"sessionKey": "main", "message": "eleven byte", "idempotencyKey": "big"})
		if r.OK || r.Error.Code != "UNAVAILABLE" || r.Error.Message != (&gateway.QueueFullError{Limit: 1, Bytes: 10}).UserText() ||
			fmt.Sprint(r.Error.Details) != "map[bytes:10 code:QUEUE_FULL limit:1]" {
			t.Fatalf("over the byte budget answered %s", r.raw)
		}
		c.call("chat.send", map[string]any{"sessionKey": "main", "message": "queued", "idempotencyKey": "b"})
		r = c.call("chat.send", map[string]any{"sessionKey": "main", "message": "too many", "idempotencyKey": "c"})
		if r.OK || r.Error.Code != "UNAVAILABLE" || r.Error.Message != (&gateway.QueueFullError{Limit: 1}).UserText() ||
			fmt.Sprint(r.Error.Details) != "map[code:QUEUE_FULL limit:1]" {
			t.Fatalf("queue full answered %s", r.raw)
		}
		res := c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/stop", "idempotencyKey": "s"})
		if string(res.Payload) != `{"aborted":true,"ok":true,"runIds":["a"]}` {
			t.Fatalf("/stop answered %s", res.raw)
		}
		if got := c.words("s"); got != "🗑️ 1 queued message was dropped." {
			t.Fatalf("/stop with a queue said %q", got)
		}
	})
}

// A failure of the gateway (not a refusal) is answered in words, never
// with the Go error: the cause goes to the log.
func TestChatSendFailureSaysWordsNotInternals(t *testing.T) {
	e := newTCPEnv(t, envOpts{adjust: func(c *config.Config) {
		c.Agents.Defaults.Runner, c.Agents.Exec.Command = config.RunnerExec, "/bin/true" // not registered: Send fails
	}})
	c, _ := e.connect("tui", "")
	r := c.call("chat.send", map[string]any{"sessionKey": "main", "message": "hello", "idempotencyKey": "a"})
	if r.OK || r.Error.Code != "UNAVAILABLE" || r.Error.Message != conv.TextCannotStart {
		t.Fatalf("a failed start answered %s, want UNAVAILABLE %q", r.raw, conv.TextCannotStart)
	}
	if !strings.Contains(e.logs.String(), "no such runner") {
		t.Fatalf("the cause is not in the log:\n%s", e.logs.String())
	}
}

// TestNoDeviceConnectionsShareRunOwnership: a page without a device
// identity (plain http off loopback: no WebCrypto) gets a new connection on
// every reload, and its Stop used to be refused ("another client started
// it"). Connections without a device key are one identity per credential:
// every holder of the shared token (every loopback client when there is no
// token) may stop the runs any of them started. A device-signed client is
// still its own identity: it may not stop theirs, and they may not stop its
// runs.
func TestNoDeviceConnectionsShareRunOwnership(t *testing.T) {
	for _, token := range []string{"shared-token-9f3e21", ""} {
		t.Run(map[bool]string{true: "shared token", false: "no token (loopback)"}[token != ""], func(t *testing.T) {
			e := newTCPEnv(t, envOpts{opts: Options{Token: token}})
			const key = "agent:main:web"
			page, _ := e.connect("webchat", token)
			page.call("chat.send", map[string]any{"sessionKey": key, "message": "/steps shell:hang", "idempotencyKey": "w1"})
			e.waitStep(key, "shell")
			page.ws.Close() // the reload

			signed := e.connectSigned("webchat", deviceKey(9), token, nil)
			if r := signed.call("chat.abort", map[string]any{"sessionKey": key, "runId": "w1"}); r.OK || r.Error.Code != CodeForbidden {
				t.Fatalf("a device-signed client stopped a run started without a device: %s", r.raw)
			}
			reloaded, _ := e.connect("webchat", token)
			id := reloaded.request("chat.abort", map[string]any{"sessionKey": key, "runId": "w1"})
			reloaded.chat("w1", "aborted")
			if r := reloaded.response(id); !r.OK || r.get("aborted") != true {
				t.Fatalf("the reloaded page's Stop: %s", r.raw)
			}

			// A device-signed client's run stays its own.
			e.waitIdle()
			signed.call("chat.send", map[string]any{"sessionKey": key, "message": "/steps shell:hang", "idempotencyKey": "d1"})
			e.waitStep(key, "shell")
			if r := reloaded.call("chat.abort", map[string]any{"sessionKey": key, "runId": "d1"}); r.OK || r.Error.Code != CodeForbidden {
				t.Fatalf("a client without a device stopped a device-signed client's run: %s", r.raw)
			}
			signed.call("chat.abort", map[string]any{"sessionKey": key, "runId": "d1"})
			e.waitIdle()
		})
	}
}

// TestTurnStartCarriesTheUserMessage: a second page watching the session
// (sessions.subscribe, as the web chat does) learns the message that started
// a turn it did not send from the turn's lifecycle start (userText), so it
// can draw the user's bubble above the steps and offer Retry; a message
// longer than an eighth of server.maxAnswerBytes is cut and says so.
func TestTurnStartCarriesTheUserMessage(t *testing.T) {
	long := "/steps say:" + strings.Repeat("x", 3000)
	for _, tc := range []struct {
		name, text, want string
		cut              bool
	}{
		{"short", "/steps say:hello_there", "/steps say:hello_there", false},
		{"long", long, long[:100], true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTCPEnv(t, envOpts{adjust: func(c *config.Config) { c.Server.MaxAnswerBytes = 16 << 10 }})
			sender, _ := e.connect("webchat", "")
			watcher, _ := e.connect("webchat", "")
			watcher.call("sessions.subscribe", map[string]any{})
			sender.call("chat.send", map[string]any{"sessionKey": "main", "message": tc.text, "idempotencyKey": "u1"})
			start := watcher.until("u1's start", func(f frame) bool {
				return f.Event == "agent" && f.str("runId") == "u1" && f.str("data.phase") == "start"
			})
			got := start.str("data.userText")
			if !strings.HasPrefix(got, tc.want) || strings.Contains(got, "[cut:") != tc.cut || len(got) > 2<<10 {
				t.Fatalf("lifecycle start userText %q (%d bytes), want %q (cut: %v)", clip(got, 120), len(got), tc.want, tc.cut)
			}
			watcher.chat("u1", "final")
		})
	}
}
