//go:build e2e

package e2e

// The admin dashboard end to end: a gateway of its own (so the shared
// gateway's short step timeout cannot end the stalled turn first), the web
// chat as the user and the dashboard as the operator in headless Chromium
// (admin.mjs). Screenshots: artifacts/e2e/admin-stalled.png and
// admin-aborted.png.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	adminGatewayToken  = "e2e-admin-gateway-7d1a"
	adminOperatorToken = "e2e-admin-operator-93bc"
)

// startAdminGateway runs the gateway with progress notices after 1s and a
// step timeout of 2 minutes, and returns once it listens.
func startAdminGateway(t *testing.T) *gatewayProc {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`server:
  listen: 127.0.0.1:0
  token: %s
  operatorToken: %s
agents:
  defaults:
    runner: demo
    progressNotifyAfterSeconds: 1
    progressRepeatSeconds: 30
    stepTimeoutSeconds: 120
    abortGraceSeconds: 2
store:
  path: %s
`, adminGatewayToken, adminOperatorToken, filepath.Join(dir, "admin.db"))
	g, err := launchGateway(dir, cfg)
	if err != nil {
		t.Fatalf("the admin gateway: %v\n%s", err, g.logs())
	}
	t.Cleanup(func() {
		g.stop()
		_ = os.WriteFile(filepath.Join(env.artifacts, "admin-gateway.log"), []byte(g.logs()), 0o644)
	})
	return g
}

// TestAdminDashboard drives /admin in headless Chromium: a stalled demo turn
// appears with its warning, the abort button ends it, the user is told; an
// open question is listed, the operator answers it, the user sees who did.
func TestAdminDashboard(t *testing.T) {
	g := startAdminGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	script, err := filepath.Abs("admin.mjs")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, env.node, script, "http://"+g.addr, env.artifacts)
	cmd.Env = append(os.Environ(), "E2E_CHROMIUM="+env.chromium, "E2E_NODE_MODULES="+env.nodeModules, "HOME="+t.TempDir(),
		"ADMIN_GATEWAY_TOKEN="+adminGatewayToken, "ADMIN_OPERATOR_TOKEN="+adminOperatorToken)
	out, err := cmd.CombinedOutput()
	t.Logf("admin.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("admin dashboard in Chromium failed: %v (screenshot of the failure: %s)", err,
			filepath.Join(env.artifacts, "admin-failure.png"))
	}
	for _, name := range []string{"admin-stalled.png", "admin-aborted.png", "admin-approval.png"} {
		if fi, err := os.Stat(filepath.Join(env.artifacts, name)); err != nil || fi.Size() == 0 {
			t.Errorf("screenshot %s missing: %v", name, err)
		}
	}

	// The operator API agrees with what the page showed.
	req, _ := http.NewRequest(http.MethodGet, "http://"+g.addr+"/api/stall-history", nil)
	req.Header.Set("Authorization", "Bearer "+adminOperatorToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var sh struct {
		Episodes []struct {
			Outcome, StopReason string
			Step                struct{ Name string }
		}
	}
	if err := json.Unmarshal(body, &sh); err != nil || len(sh.Episodes) != 1 {
		t.Fatalf("stall history %s: %v", body, err)
	}
	if ep := sh.Episodes[0]; ep.Outcome != "aborted" || ep.StopReason != "user" || ep.Step.Name != "shell" {
		t.Errorf("episode %+v, want shell aborted by the user", ep)
	}
	if strings.Contains(g.logs(), adminOperatorToken) || strings.Contains(g.logs(), adminGatewayToken) {
		t.Errorf("a token is in the gateway log")
	}
	if !strings.Contains(g.logs(), "operator aborted a turn") {
		t.Errorf("the operator's abort is not logged")
	}
}
