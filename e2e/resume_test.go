//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/storetest"
)

// TestWebChatResumedNoticeHasNoRetry (issue 23): a web chat turn cut off
// by a SIGKILL while the model was answering is resumed at the next start
// (agents.defaults.resume). The page, opened after the restart, shows the
// "resuming it (attempt 2 of 3)" notice from chat.history with no Retry —
// a tap would run the request a second time — and the resumed attempt's
// reply (webchat-busy.mjs resumed: webchat-resumed.png).
func TestWebChatResumedNoticeHasNoRetry(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("GATEWAY_AGENTS__DEFAULTS__RESUME__ENABLED", "true")
	t.Setenv("GATEWAY_AGENTS__DEFAULTS__STEPTIMEOUTSECONDS", "30") // the model step outlasts the kill
	const run = "e2e-resumed"
	g, err := launchGateway(dir, gatewayConfig(dir, ""))
	if err != nil {
		t.Fatalf("gateway: %v\n%s", err, g.logs())
	}
	defer func() { _ = os.WriteFile(filepath.Join(env.artifacts, "gateway-resumed.log"), []byte(g.logs()), 0o644) }()
	ack := callAt(t, "ws://"+g.addr, "chat.send", map[string]any{"sessionKey": "main", "message": "/steps llm:6s say:Resumed_fine",
		"idempotencyKey": run})
	if ack["status"] != "started" {
		t.Fatalf("chat.send ack %v", ack)
	}
	storetest.WaitTurnFile(t, filepath.Join(dir, "e2e.db"), run, "in step demo", func(tr store.Turn) bool { return tr.CurrentStep.Name == "demo" })
	_ = g.cmd.Process.Kill()
	<-g.done

	g2, err := launchGateway(dir, gatewayConfig(dir, ""))
	if err != nil {
		t.Fatalf("gateway after the kill: %v\n%s", err, g2.logs())
	}
	defer func() {
		g2.stop()
		_ = os.WriteFile(filepath.Join(env.artifacts, "gateway-resumed-2.log"), []byte(g2.logs()), 0o644)
	}()
	script, err := filepath.Abs("webchat-busy.mjs")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.node, script, "http://"+g2.addr+"/#token="+token, env.artifacts, "resumed")
	cmd.Env = append(os.Environ(), "E2E_CHROMIUM="+env.chromium, "E2E_NODE_MODULES="+env.nodeModules, "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	t.Logf("webchat-busy.mjs resumed:\n%s", out)
	if err != nil {
		t.Fatalf("the resumed notice in Chromium failed: %v (screenshot: %s)", err,
			filepath.Join(env.artifacts, "webchat-resumed-failure.png"))
	}
}
