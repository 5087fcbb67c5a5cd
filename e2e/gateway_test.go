//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// gatewayProc is a gateway binary under test, started with its own YAML
// config in dir; its JSON log is kept for failure messages and artifacts.
type gatewayProc struct {
	cmd  *exec.Cmd
	addr string
	mu   sync.Mutex
	log  bytes.Buffer
	done chan struct{}
}

// launchGateway writes yaml to dir/gateway.yaml, starts env.gateway on it
// and returns once it logs that it listens (at most 30 s).
func launchGateway(dir, yaml string) (*gatewayProc, error) {
	path := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	g := &gatewayProc{done: make(chan struct{})}
	g.cmd = exec.Command(env.gateway, "-config", path)
	g.cmd.Dir = dir
	g.cmd.Env = append(os.Environ(), "GATEWAY_LOG_FORMAT=json", "GATEWAY_LOG_LEVEL=debug")
	stderr, err := g.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := g.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", env.gateway, err)
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
	select {
	case g.addr = <-addr:
		return g, nil
	case <-g.done:
		return g, fmt.Errorf("the gateway exited before listening")
	case <-time.After(30 * time.Second):
		g.stop()
		return g, fmt.Errorf("the gateway did not listen within 30s")
	}
}

// stop sends SIGTERM and waits for the exit (SIGKILL after 15 s).
func (g *gatewayProc) stop() {
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(15 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
	}
}

// logs returns what the gateway has logged so far.
func (g *gatewayProc) logs() string {
	if g == nil {
		return ""
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.log.String()
}
