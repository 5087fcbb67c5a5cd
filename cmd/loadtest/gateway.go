package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"
	_ "modernc.org/sqlite" // reads the gateway's store after it stopped

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/testproc"
)

// gatewayStartTimeout bounds how long the gateway may take to answer
// /readyz; gatewayStopTimeout how long its shutdown (SIGTERM) may take.
const (
	gatewayStartTimeout = 30 * time.Second
	gatewayStopTimeout  = 60 * time.Second
)

// gatewayProc is the built gateway binary running as a child process of the
// load test: loopback only, the demo runner, and its store on a real SQLite
// file in a temporary directory — the product as `gateway -config` runs
// it, not an engine assembled in this process. Stop it with stop; remove
// its directory with cleanup.
type gatewayProc struct {
	dir, addr, db, opToken string
	cmd                    *exec.Cmd
	exited                 <-chan struct{}
	log                    *os.File // the gateway's stdout and stderr (warnings only)
}

// startGateway writes the configuration, starts bin and waits until its
// /readyz answers 200. clients sizes server.maxConnsPerIP (every client is
// on 127.0.0.1).
func startGateway(ctx context.Context, bin string, clients int) (_ *gatewayProc, err error) {
	dir, err := os.MkdirTemp("", "turnguard-load-")
	if err != nil {
		return nil, fmt.Errorf("gateway directory: %w", err)
	}
	g := &gatewayProc{dir: dir, db: filepath.Join(dir, "turnguard.db")}
	defer func() {
		if err != nil {
			g.kill()
			g.cleanup()
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("choosing a loopback port: %w", err)
	}
	g.addr = ln.Addr().String()
	ln.Close()
	tok := make([]byte, 24)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	g.opToken = hex.EncodeToString(tok)
	cfg := map[string]any{}
	clusterrig.Set(cfg, "server.listen", g.addr)
	clusterrig.Set(cfg, "server.operatorToken", g.opToken) // /metrics
	clusterrig.Set(cfg, "server.maxConnsPerIP", min(clients+16, 10000))
	clusterrig.Set(cfg, "server.requestsPerSecond", 1000)
	clusterrig.Set(cfg, "server.requestBurst", 1000)
	clusterrig.Set(cfg, "store.path", g.db)
	clusterrig.Set(cfg, "agents.defaults.runner", "demo")
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		return nil, fmt.Errorf("gateway configuration: %w", err)
	}
	if g.log, err = os.Create(filepath.Join(dir, "gateway.log")); err != nil {
		return nil, fmt.Errorf("gateway log: %w", err)
	}
	if bin, err = filepath.Abs(bin); err != nil { // the gateway runs in dir
		return nil, fmt.Errorf("gateway binary: %w", err)
	}
	g.cmd = exec.Command(bin, "-config", cfgPath)
	g.cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GATEWAY_") {
			g.cmd.Env = append(g.cmd.Env, kv)
		}
	}
	g.cmd.Env = append(g.cmd.Env, "GATEWAY_LOG_LEVEL=warn")
	g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
	// Killed by the kernel should this process die without stopping it.
	if g.exited, err = testproc.Start(g.cmd, syscall.SIGKILL); err != nil {
		g.cmd = nil
		return nil, fmt.Errorf("starting the gateway %s: %w", bin, err)
	}
	deadline := time.Now().Add(gatewayStartTimeout)
	for {
		if code, err := g.get("/readyz"); err == nil && code == http.StatusOK {
			return g, nil
		}
		select {
		case <-g.exited:
			return nil, fmt.Errorf("the gateway exited (%v) before it was ready:\n%s", g.cmd.ProcessState, g.logTail())
		case <-ctx.Done():
			return nil, ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the gateway was not ready within %v:\n%s", gatewayStartTimeout, g.logTail())
		}
		time.Sleep(20 * time.Millisecond) // real time: polling another process
	}
}

func (g *gatewayProc) pid() int { return g.cmd.Process.Pid }

// url is the WebSocket URL.
func (g *gatewayProc) url() string { return "ws://" + g.addr + "/" }

// get requests path on the gateway's HTTP port with the operator token.
func (g *gatewayProc) get(path string) (int, error) {
	code, _, err := g.fetch(path)
	return code, err
}

func (g *gatewayProc) fetch(path string) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+g.addr+path, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+g.opToken)
	cl := http.Client{Timeout: 10 * time.Second}
	res, err := cl.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	return res.StatusCode, b, err
}

// storeCounters are the gateway's store counters from /metrics
// (turnguard_store_events_{written,dropped,failed}_total) and its queue
// (turnguard_store_queue_depth: events not yet written, which the writer
// writes before the gateway exits).
type storeCounters struct{ written, dropped, failed, queued int64 }

func (g *gatewayProc) storeCounters() (storeCounters, error) {
	code, b, err := g.fetch("/metrics")
	if err != nil {
		return storeCounters{}, fmt.Errorf("gateway /metrics: %w", err)
	}
	if code != http.StatusOK {
		return storeCounters{}, fmt.Errorf("gateway /metrics: status %d", code)
	}
	var c storeCounters
	dst := map[string]*int64{
		"turnguard_store_events_written_total": &c.written,
		"turnguard_store_events_dropped_total": &c.dropped,
		"turnguard_store_events_failed_total":  &c.failed,
		"turnguard_store_queue_depth":          &c.queued,
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			if p, ok := dst[f[0]]; ok {
				v, _ := strconv.ParseFloat(f[1], 64)
				*p = int64(v)
			}
		}
	}
	return c, sc.Err()
}

// stop ends the gateway as an operator does (SIGTERM: it finishes its
// shutdown, the store's writer flushes) and waits for it, at most
// gatewayStopTimeout, then kills it. It returns the gateway's CPU time over
// its whole life (its rusage, from Wait).
func (g *gatewayProc) stop() (time.Duration, error) {
	if err := g.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return 0, fmt.Errorf("stopping the gateway: %w", err)
	}
	select {
	case <-g.exited:
	case <-time.After(gatewayStopTimeout):
		g.kill()
		return 0, fmt.Errorf("the gateway did not stop within %v:\n%s", gatewayStopTimeout, g.logTail())
	}
	st := g.cmd.ProcessState
	cpu := st.UserTime() + st.SystemTime()
	if !st.Success() {
		return cpu, fmt.Errorf("the gateway exited with %v:\n%s", st, g.logTail())
	}
	return cpu, nil
}

// kill ends the gateway at once, if it runs.
func (g *gatewayProc) kill() {
	if g.cmd == nil {
		return
	}
	select {
	case <-g.exited:
	default:
		_ = g.cmd.Process.Kill()
		<-g.exited
	}
}

// ends reads, from the stopped gateway's SQLite file, the end time of every
// turn the store recorded as ended (turns.ended_at: the terminal event's
// time, unix nanoseconds).
func (g *gatewayProc) ends() (map[string]int64, error) {
	db, err := sql.Open("sqlite", "file:"+g.db+"?mode=ro")
	if err != nil {
		return nil, fmt.Errorf("opening the gateway's store: %w", err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT run_id, ended_at FROM turns WHERE ended_at IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("reading the gateway's turns: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var run string
		var ns int64
		if err := rows.Scan(&run, &ns); err != nil {
			return nil, fmt.Errorf("reading the gateway's turns: %w", err)
		}
		out[run] = ns
	}
	return out, rows.Err()
}

// logTail is the end of the gateway's log, for an error.
func (g *gatewayProc) logTail() string {
	b, err := os.ReadFile(filepath.Join(g.dir, "gateway.log"))
	if err != nil {
		return ""
	}
	const n = 4000
	if len(b) > n {
		b = append([]byte("…"), b[len(b)-n:]...)
	}
	return string(b)
}

// cleanup removes the gateway's directory (its configuration, store, log).
func (g *gatewayProc) cleanup() {
	if g.log != nil {
		g.log.Close()
	}
	if err := os.RemoveAll(g.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintln(os.Stderr, "loadtest: removing", g.dir+":", err)
	}
}
