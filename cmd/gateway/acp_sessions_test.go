package main

// An ACP agent's conversation across a gateway restart, and its plan in
// the "⏳ Still working" notice, end to end: the built gateway on the acp
// runner drives the real Node test agent of runner/acp in the chat of
// internal/fakebot. Real processes, real time, bounded waits.

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/fakebot"
	"github.com/turnguard/turnguard/messages"
)

// acpChatConfig is a Telegram gateway on the ACP test agent in dir, whose
// sessions outlive its process (files in dir/agent-sessions) and who
// advertises caps; timeouts is added under agents.defaults.
func acpChatConfig(t *testing.T, dir string, bot *fakebot.Bot, caps, timeouts string) string {
	node, script := acpTestAgent(t)
	return fmt.Sprintf(`server:
  listen: 127.0.0.1:0
  token: %s
agents:
  defaults:
    runner: acp
    abortGraceSeconds: 5
%s
  acp:
    command: %q
    args: [%q]
    workdir: %q
    startTimeoutSeconds: 30
    env:
      ACP_TEST_SESSIONS: %q
      ACP_TEST_CAPS: %q
store:
  path: %s
channels:
  telegram:
    enabled: true
    token: %q
    apiURL: %s
    allowedChatIDs: [%d]
`, testToken, timeouts, node, script, dir, t.TempDir(), caps, filepath.Join(dir, "gateway.db"),
		fakebot.Token, bot.URL(), fakebot.Chat)
}

// TestTelegramACPSessionSurvivesRestart: the person tells the agent
// something, the gateway restarts (its agent process with it), and the
// agent still knows it: the gateway kept the conversation's agent session
// in its store and loaded it (session/load) into the new agent process —
// without replaying the old messages into the chat, and without a
// lost-context notice.
func TestTelegramACPSessionSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	bot := fakebot.New(t)
	cfg := acpChatConfig(t, dir, bot, "load", "")
	const within = 30 * time.Second

	p := startGateway(t, dir, cfg)
	bot.Say("remember the blue door")
	bot.WaitShown(within, "the agent's answer", func(s fakebot.Shown) bool { return s.Text == "OK, I will remember the blue door." })
	p.signal(syscall.SIGTERM)
	if code := p.wait(within); code != 0 {
		t.Fatalf("the gateway exited with %d:\n%s", code, p.log())
	}

	p = startGateway(t, dir, cfg)
	bot.Say("what did I say")
	bot.WaitShown(within, "the remembered text after the restart", func(s fakebot.Shown) bool {
		return strings.Contains(s.Text, "You said")
	})
	if n := bot.Count("You said: the blue door"); n != 1 {
		t.Errorf("the answer after the restart reached the chat %d times, want once:%s", n, bot)
	}
	if n := bot.Count("OK, I will remember the blue door."); n != 1 {
		t.Errorf("the first answer reached the chat %d times: session/load's replay was shown:%s", n, bot)
	}
	if n := bot.Count(messages.AgentContextLost); n != 0 {
		t.Errorf("the person was told the context was lost:%s", bot)
	}
	if !strings.Contains(p.log(), "acp: session restored") {
		t.Errorf("the log does not say the session was restored:\n%s", p.log())
	}
}

// TestTelegramACPPlanProgress: while the agent works on its plan, the
// person's "⏳ Still working" notice — the live status of the turn's draft
// (channels.telegram.streaming: draft, the default) — names the plan's
// entry in progress.
func TestTelegramACPPlanProgress(t *testing.T) {
	dir := t.TempDir()
	bot := fakebot.New(t)
	p := startGateway(t, dir, acpChatConfig(t, dir, bot, "", "    progressNotifyAfterSeconds: 0.5\n    stepTimeoutSeconds: 60"))
	bot.Say("plan hang")
	d := bot.WaitDraft(30*time.Second, "with the progress notice", func(d fakebot.Draft) bool {
		return strings.Contains(d.Text, "⏳ Still working")
	})
	if want := "⏳ Still working — 📋 2/5: Run tests has been running for"; !strings.Contains(d.Text, want) {
		t.Errorf("the draft %q, want the notice %q in it:\n%s", d.Text, want, p.log())
	}
	bot.Say("/stop")
	bot.WaitShown(30*time.Second, "the stop notice", func(s fakebot.Shown) bool { return strings.HasPrefix(s.Text, "⏹️ Stopped") })
}
