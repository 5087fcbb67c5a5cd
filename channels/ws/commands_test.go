package ws

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/acp"
	"github.com/turnguard/turnguard/runner/demo"
)

// words waits for the chat "final" event that carries a command's answer
// (its runId is the request's idempotencyKey) and returns its text.
func (c *client) words(run string) string {
	c.t.Helper()
	f := c.chat(run, "final")
	if f.str("sessionKey") != "agent:main:main" || f.str("message.role") != "assistant" {
		c.t.Fatalf("words event %s", f.raw)
	}
	return f.str("message.content.0.text")
}

func TestChatSendStopAbortsTheRunningTurn(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("tui", "")
	c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "r1"})
	e.waitStep("agent:main:main", "shell")
	res := c.call("chat.send", map[string]any{"sessionKey": "main", "message": " /stop ", "idempotencyKey": "s1"})
	if !res.OK || string(res.Payload) != `{"aborted":true,"ok":true,"runIds":["r1"]}` {
		t.Fatalf("/stop answered %s, want OpenClaw's {ok:true, aborted:true, runIds:[r1]}", res.raw)
	}
	ab := c.chat("r1", "aborted")
	if ab.str("stopReason") != "user" || !strings.HasPrefix(ab.str("errorMessage"), "⏹️ Stopped while shell was running") {
		t.Fatalf("aborted event %s", ab.raw)
	}
	if got := c.runEvents("s1"); len(got) != 0 {
		t.Fatalf("/stop that stopped a turn also sent %v; the stop notice is the answer", got)
	}
}

func TestChatSendStopWhenIdle(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("tui", "")
	res := c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/stop", "idempotencyKey": "s1"})
	if !res.OK || string(res.Payload) != `{"aborted":false,"ok":true,"runIds":[]}` {
		t.Fatalf("idle /stop answered %s", res.raw)
	}
	if got := c.words("s1"); got != conv.TextNothingToStop {
		t.Fatalf("idle /stop said %q", got)
	}
	if n := len(e.eng.Sessions()); n > 0 && e.eng.Sessions()[0].ActiveRun != "" {
		t.Fatal("/stop started a turn")
	}
}

func TestChatSendStatusNewHelp(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("tui", "")
	for _, tc := range []struct {
		message, run string
		want         func(string) bool
	}{
		{"/status", "st1", func(s string) bool { return s == conv.TextIdle }},
		{"/new", "n1", func(s string) bool { return s == conv.TextNew }},
		{"/HELP", "h1", func(s string) bool { return strings.Contains(s, "/stop — stop the request that is running") }},
	} {
		res := c.call("chat.send", map[string]any{"sessionKey": "main", "message": tc.message, "idempotencyKey": tc.run})
		if !res.OK || res.str("runId") != tc.run || res.str("status") != "ok" {
			t.Fatalf("%s answered %s", tc.message, res.raw)
		}
		if got := c.words(tc.run); !tc.want(got) {
			t.Errorf("%s said %q", tc.message, got)
		}
		if got := c.runEvents(tc.run); len(got) != 1 {
			t.Errorf("%s: events %v, want only the final with the words (no turn)", tc.message, got)
		}
	}
}

// A command sent while a turn runs is carried out, not refused as busy:
// /status describes the running step, /new stops the turn and resets.
func TestChatSendCommandWhileBusy(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("tui", "")
	c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "r1"})
	e.waitStep("agent:main:main", "shell")
	res := c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/status", "idempotencyKey": "st1"})
	if !res.OK {
		t.Fatalf("/status while busy refused: %s", res.raw)
	}
	if got := c.words("st1"); !strings.Contains(got, "⏳ Working — step 1: shell") {
		t.Fatalf("/status while busy said %q", got)
	}
	res = c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/new", "idempotencyKey": "n1"})
	if !res.OK {
		t.Fatalf("/new while busy refused: %s", res.raw)
	}
	if got := c.words("n1"); got != conv.TextNew {
		t.Fatalf("/new said %q", got)
	}
	if ab := c.chat("r1", "aborted"); ab.str("stopReason") != "user" {
		t.Fatalf("/new: aborted event %s", ab.raw)
	}
}

// Only the owner (or an operator) may stop a turn with /stop, as with
// chat.abort: the owner is a device-signed client, the stranger another
// device (clients without a device key share one identity per credential).
func TestChatSendStopOwnership(t *testing.T) {
	e := newTCPEnv(t, envOpts{opts: Options{Token: "T", OperatorToken: "OP"}})
	owner := e.connectDevice(deviceKey(11), "T", nil)
	stranger := e.connectDevice(deviceKey(12), "T", nil)
	op, _ := e.connect("probe", "OP")
	owner.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "r1"})
	if r := stranger.call("chat.send", map[string]any{"sessionKey": "main", "message": "/stop", "idempotencyKey": "s1"}); r.OK || r.Error.Code != "FORBIDDEN" {
		t.Fatalf("stranger /stop %s", r.raw)
	}
	if r := op.call("chat.send", map[string]any{"sessionKey": "main", "message": "/stop", "idempotencyKey": "s2"}); !r.OK || r.get("aborted") != true {
		t.Fatalf("operator /stop %s", r.raw)
	}
}

// agentDemo is the demo runner with an agent's commands and modes (what
// conv.Agent asks of *acp.Runner), for the protocol's part of the
// suggestions; channels/conv tests the real agent's.
type agentDemo struct {
	runner.Runner
	cmds []acp.Command
}

func (a agentDemo) Commands(string) []acp.Command                 { return a.cmds }
func (a agentDemo) Modes(string) (acp.Modes, bool)                { return acp.Modes{}, true }
func (a agentDemo) SetMode(context.Context, string, string) error { return acp.ErrNoModes }

// TestCommandsListSuggestsTheAgentsCommands: commands.list (what the web
// chat suggests when the person types "/") lists the gateway's commands
// first, then /mode and the agent's — one named like a gateway command
// left out, one without a description described as the agent's; with a
// runner that has no agent, the gateway's only. Before, it answered
// {commands:[]}.
func TestCommandsListSuggestsTheAgentsCommands(t *testing.T) {
	names := func(f frame) (out []string) {
		for i := range 20 {
			if n := f.str(fmt.Sprintf("commands.%d.name", i)); n != "" {
				out = append(out, n)
			}
		}
		return out
	}
	gateway := []string{"stop", "status", "new", "queue", "help"}
	c, _ := newTCPEnv(t, envOpts{}).connect("tui", "")
	if r := c.call("commands.list", map[string]any{"agentId": "main", "scope": "text"}); !r.OK || !slices.Equal(names(r), gateway) ||
		r.str("commands.0.description") != messages.MenuStop {
		t.Errorf("commands.list without an agent: %s, want the gateway's %v", r.raw, gateway)
	}
	ag := agentDemo{Runner: demo.New(), cmds: []acp.Command{{Name: "echo", Description: "Say the input back"},
		{Name: "stop", Description: "The agent's own stop"}, {Name: "review"}}}
	c, _ = newTCPEnv(t, envOpts{runner: ag}).connect("tui", "")
	r := c.call("commands.list", map[string]any{"sessionKey": "main"})
	if want := append(slices.Clone(gateway), "mode", "echo", "review"); !r.OK || !slices.Equal(names(r), want) {
		t.Fatalf("commands.list: %s, want %v", r.raw, want)
	}
	for path, want := range map[string]string{"commands.5.description": messages.MenuModeDescription,
		"commands.6.description": "Say the input back", "commands.7.description": messages.MenuAgentCommand} {
		if got := r.str(path); got != want {
			t.Errorf("%s = %q, want %q", path, got, want)
		}
	}
	if r := c.call("commands.list", map[string]any{"sessionKey": 7}); r.OK {
		t.Errorf("a sessionKey that is not a string: %s", r.raw)
	}
}
