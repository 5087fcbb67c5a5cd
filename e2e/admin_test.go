//go:build e2e

package e2e

// The admin dashboard end to end: a gateway of its own (so the shared
// gateway's short step timeout cannot end the stalled turn first), the web
// chat as the user and the dashboard as the operator in headless Chromium
// (admin.mjs). Screenshots: artifacts/e2e/admin-stalled.png and
// admin-aborted.png.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	adminGatewayToken  = "e2e-admin-gateway-7d1a"
	adminOperatorToken = "e2e-admin-operator-93bc"
)

// adminGateway is the dashboard test's own gateway process.
type adminGateway struct {
	cmd  *exec.Cmd
	addr string
	mu   sync.Mutex
	log  bytes.Buffer
	done chan struct{}
}

func (g *adminGateway) logs() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.log.String()
}

// startAdminGateway runs the gateway with progress notices after 1s and a
// step timeout of 2 minutes, and returns once it listens.
func startAdminGateway(t *testing.T) *adminGateway {
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
	path := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	g := &adminGateway{done: make(chan struct{})}
	g.cmd = exec.Command(env.gateway, "-config", path)
	g.cmd.Dir = dir
	g.cmd.Env = append(os.Environ(), "GATEWAY_LOG_FORMAT=json", "GATEWAY_LOG_LEVEL=debug")
	stderr, err := g.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			g.mu.Lock()
			g.log.WriteString(sc.Text() + "\n")
			g.mu.Unlock()
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "listening" {
				addr <- rec.Addr
			}
		}
		_ = g.cmd.Wait()
		close(g.done)
	}()
	t.Cleanup(func() {
		_ = g.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.done:
		case <-time.After(15 * time.Second):
			_ = g.cmd.Process.Kill()
			<-g.done
		}
		_ = os.WriteFile(filepath.Join(env.artifacts, "admin-gateway.log"), []byte(g.logs()), 0o644)
	})
	select {
	case g.addr = <-addr:
	case <-g.done:
		t.Fatalf("the admin gateway exited before listening:\n%s", g.logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("the admin gateway did not listen within 30s:\n%s", g.logs())
	}
	return g
}

// TestAdminDashboard drives /admin in headless Chromium: a stalled demo turn
// appears with its warning, the abort button ends it, the user is told.
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
	for _, name := range []string{"admin-stalled.png", "admin-aborted.png"} {
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
