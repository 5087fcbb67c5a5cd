//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWebChatApproval drives the web chat's approval card in headless
// Chromium (webchat-approval.mjs): the question "Run deploy" as a card with
// Allow and Deny, a click on Allow finishing the turn (webchat-approval.png),
// the open card redrawn after a reload and answered with Deny, a card
// settled by another client, and Stop while the question is open.
func TestWebChatApproval(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	script, err := filepath.Abs("webchat-approval.mjs")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, env.node, script, "http://"+gw.addr+"/#token="+token, env.artifacts)
	cmd.Env = append(os.Environ(), "E2E_CHROMIUM="+env.chromium, "E2E_NODE_MODULES="+env.nodeModules, "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	t.Logf("webchat-approval.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("web chat approval in Chromium failed: %v (screenshot: %s)", err,
			filepath.Join(env.artifacts, "webchat-approval-failure.png"))
	}
}

// TestTUIApproval: the real OpenClaw TUI shows turnguard's question as its
// own approval prompt (plugin.approval.requested: "plugin approval: Run
// deploy", Allow once / Deny) and answers it with plugin.approval.resolve;
// the turn finishes. A second question is denied with Esc.
func TestTUIApproval(t *testing.T) {
	x := &tmux{t: t, socket: filepath.Join(t.TempDir(), "tmux.sock")}
	cmdline := append([]string{"new-session", "-d", "-s", "tui", "-x", "160", "-y", "48", "--", "env"}, clientEnv(t)...)
	cmdline = append(cmdline, env.node, env.openclaw, "tui", "--url", wsURL(), "--token", token, "--session", "e2e-tui-approval")
	x.run(cmdline...)
	t.Cleanup(func() {
		x.save("tui-approval-last.txt")
		_ = exec.Command("tmux", "-S", x.socket, "kill-server").Run()
	})
	x.waitFor("the connected, idle status line", 90*time.Second, func(s string) bool {
		return strings.Contains(s, "connected | idle")
	})

	// 1. Allow once: select it (Deny is preselected) and confirm.
	x.send("/steps ask:deploy say:Finished")
	s := x.waitFor("the approval prompt", 30*time.Second, func(s string) bool {
		return strings.Contains(s, "plugin approval: Run deploy") && strings.Contains(s, "Allow once") && strings.Contains(s, "Deny")
	})
	x.save("tui-approval-prompt.txt")
	if !strings.Contains(s, "Tool: deploy") {
		t.Errorf("TUI: the prompt does not name the tool; screen:\n%s", s)
	}
	x.run("send-keys", "-t", "tui", "Up")
	x.run("send-keys", "-t", "tui", "Enter")
	x.waitFor("the answer or the confirmation", 10*time.Second, func(s string) bool {
		if strings.Contains(s, "Press Enter again to confirm") && !strings.Contains(s, "plugin approval: allowed once") {
			x.run("send-keys", "-t", "tui", "Enter")
			return false
		}
		return strings.Contains(s, "plugin approval: allowed once")
	})
	x.waitFor("the reply after Allow", 30*time.Second, func(s string) bool {
		return strings.Contains(s, "deploy ran (allowed). Finished")
	})
	x.save("tui-approval-allowed.txt")

	// 2. Esc on the prompt denies.
	x.send("/steps ask:release say:Done_asking")
	x.waitFor("the second prompt", 30*time.Second, func(s string) bool {
		return strings.Contains(s, "plugin approval: Run release")
	})
	x.run("send-keys", "-t", "tui", "Escape")
	x.waitFor("the reply after Esc", 30*time.Second, func(s string) bool {
		return strings.Contains(s, "plugin approval: denied") && strings.Contains(s, "release was not run: denied. Done asking")
	})
	x.save("tui-approval-denied.txt")
}
