//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The ACP gateway: a second gateway of the suite, on the acp runner with
// runner/acp's test agent (a real ACP agent on the official SDK, Node 24;
// run.sh installs it with `make deps-node` and names it in E2E_ACP_NODE and
// E2E_ACP_AGENT). Started by the first test that needs it, stopped by
// TestMain (stopACPGateway); its log goes to artifacts/e2e/gateway-acp.log.
var acpGW struct {
	once sync.Once
	g    *gatewayProc
	err  error
}

// acpGateway returns the ACP gateway, starting it on first use.
func acpGateway(t *testing.T) *gatewayProc {
	t.Helper()
	node, agent := os.Getenv("E2E_ACP_NODE"), os.Getenv("E2E_ACP_AGENT")
	if node == "" || agent == "" {
		t.Fatal("E2E_ACP_NODE and E2E_ACP_AGENT are not set; run the end-to-end tests with `make e2e` (it installs the ACP test agent)")
	}
	acpGW.once.Do(func() {
		dir, err := os.MkdirTemp("", "turnguard-e2e-acp")
		if err != nil {
			acpGW.err = err
			return
		}
		acpGW.g, acpGW.err = launchGateway(dir, fmt.Sprintf(`# The e2e gateway on the acp runner with the ACP test agent.
server:
  listen: 127.0.0.1:0
  token: %s
agents:
  defaults:
    runner: acp
    stepTimeoutSeconds: 30
    abortGraceSeconds: 2
  acp:
    command: %q
    args: [%q]
    workdir: %q
    startTimeoutSeconds: 30
store:
  path: %s
`, token, node, agent, dir, filepath.Join(dir, "e2e-acp.db")))
	})
	if acpGW.err != nil {
		t.Fatalf("the ACP gateway: %v\n%s", acpGW.err, acpGW.g.logs())
	}
	return acpGW.g
}

// stopACPGateway stops the ACP gateway if a test started it and saves its
// log.
func stopACPGateway() {
	if acpGW.g == nil {
		return
	}
	acpGW.g.stop()
	_ = os.WriteFile(filepath.Join(env.artifacts, "gateway-acp.log"), []byte(acpGW.g.logs()), 0o644)
}

// TestWebChatApproval drives the web chat's approval card in headless
// Chromium (webchat-approval.mjs).
//
// demo (the demo runner): the question "Run deploy" as a card with Allow
// and Deny, a click on Allow finishing the turn (webchat-approval.png), a
// finished turn's step lines and settled card ("✅ Allowed in the web chat:
// Run deploy") drawn again after a reload as they were live (issue 22), the
// open card redrawn after a reload and answered with Deny, a card settled by
// another client, and Stop while the question is open.
//
// acp (the acp runner driving the real ACP test agent): its permission
// request "Delete build/" as a card with Allow once and Reject; Allow once
// finishes the agent's turn with "Tool output: deleted 3 files"
// (webchat-approval-acp.png), Reject with "Permission denied (no).", Stop
// while asking stops the turn and the agent asks again next time.
func TestWebChatApproval(t *testing.T) {
	script, err := filepath.Abs("webchat-approval.mjs")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"demo", "acp"} {
		t.Run(mode, func(t *testing.T) {
			addr := gw.addr
			if mode == "acp" {
				addr = acpGateway(t).addr
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, env.node, script, "http://"+addr+"/#token="+token, env.artifacts, mode)
			cmd.Env = append(os.Environ(), "E2E_CHROMIUM="+env.chromium, "E2E_NODE_MODULES="+env.nodeModules, "HOME="+t.TempDir())
			out, err := cmd.CombinedOutput()
			t.Logf("webchat-approval.mjs %s:\n%s", mode, out)
			if err != nil {
				shot := "webchat-approval-failure.png"
				if mode == "acp" {
					shot = "webchat-approval-acp-failure.png"
				}
				t.Fatalf("web chat approval (%s) in Chromium failed: %v (screenshot: %s)", mode, err, filepath.Join(env.artifacts, shot))
			}
		})
	}
}

// TestWebChatCommandSuggestions drives the web chat's command suggestions
// in headless Chromium (webchat-commands.mjs) against the ACP gateway:
// "/" lists the gateway's commands, then, once the agent has a session,
// its /echo with its description; typing filters, Tab fills, Escape
// closes (webchat-commands.png).
func TestWebChatCommandSuggestions(t *testing.T) {
	script, err := filepath.Abs("webchat-commands.mjs")
	if err != nil {
		t.Fatal(err)
	}
	addr := acpGateway(t).addr
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.node, script, "http://"+addr+"/#token="+token, env.artifacts)
	cmd.Env = append(os.Environ(), "E2E_CHROMIUM="+env.chromium, "E2E_NODE_MODULES="+env.nodeModules, "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	t.Logf("webchat-commands.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("web chat command suggestions in Chromium failed: %v (screenshot: %s)", err,
			filepath.Join(env.artifacts, "webchat-commands-failure.png"))
	}
}

// TestTUIApproval: the real OpenClaw TUI shows turnguard's question as its
// own approval prompt (plugin.approval.requested: "plugin approval: <title>",
// Allow once / Deny) and answers it with plugin.approval.resolve; the turn
// finishes. A second question is denied with Esc. demo: the demo runner's
// "Run deploy"; acp: the acp runner driving the real ACP test agent, whose
// permission request "Delete build/" is allowed ("Tool output: deleted 3
// files") and then rejected ("Permission denied (no).").
func TestTUIApproval(t *testing.T) {
	cases := []struct {
		name, ask, ask2, title, title2, tool, allowed, denied string
	}{
		{name: "demo", ask: "/steps ask:deploy say:Finished", ask2: "/steps ask:release say:Done_asking",
			title: "Run deploy", title2: "Run release", tool: "deploy",
			allowed: "deploy ran (allowed). Finished", denied: "release was not run: denied. Done asking"},
		{name: "acp", ask: "ask permission", ask2: "ask permission", title: "Delete build/", title2: "Delete build/", tool: "delete",
			allowed: "Tool output: deleted 3 files", denied: "Permission denied (no)."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url, session, files := wsURL(), "e2e-tui-approval", "tui-approval"
			if tc.name == "acp" {
				url, session, files = "ws://"+acpGateway(t).addr, "e2e-tui-approval-acp", "tui-approval-acp"
			}
			x := &tmux{t: t, socket: filepath.Join(t.TempDir(), "tmux.sock")}
			cmdline := append([]string{"new-session", "-d", "-s", "tui", "-x", "160", "-y", "48", "--", "env"}, clientEnv(t)...)
			cmdline = append(cmdline, env.node, env.openclaw, "tui", "--url", url, "--token", token, "--session", session)
			x.run(cmdline...)
			t.Cleanup(func() {
				x.save(files + "-last.txt")
				_ = exec.Command("tmux", "-S", x.socket, "kill-server").Run()
			})
			x.waitFor("the connected, idle status line", 90*time.Second, func(s string) bool {
				return strings.Contains(s, "connected | idle")
			})

			// 1. Allow once: select it (Deny is preselected) and confirm.
			x.send(tc.ask)
			s := x.waitFor("the approval prompt", 30*time.Second, func(s string) bool {
				return strings.Contains(s, "plugin approval: "+tc.title) && strings.Contains(s, "Allow once") && strings.Contains(s, "Deny")
			})
			x.save(files + "-prompt.txt")
			if !strings.Contains(s, "Tool: "+tc.tool) {
				t.Errorf("TUI: the prompt does not name the tool %s; screen:\n%s", tc.tool, s)
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
				return strings.Contains(s, tc.allowed)
			})
			x.save(files + "-allowed.txt")

			// 2. Esc on the prompt denies. The same title may still be on
			// the screen from the first question: wait for one more.
			before := strings.Count(x.screen(), "plugin approval: "+tc.title2)
			x.send(tc.ask2)
			x.waitFor("the second prompt", 30*time.Second, func(s string) bool {
				return strings.Count(s, "plugin approval: "+tc.title2) > before
			})
			x.run("send-keys", "-t", "tui", "Escape")
			x.waitFor("the reply after Esc", 30*time.Second, func(s string) bool {
				return strings.Contains(s, "plugin approval: denied") && strings.Contains(s, tc.denied)
			})
			x.save(files + "-denied.txt")
		})
	}
}
