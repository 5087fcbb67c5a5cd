// Package clusterrig starts a whole turnguard cluster on loopback for
// end-to-end tests, from the project's own files only: three nats-server
// processes in a JetStream cluster (internal/natstest), one PostgreSQL
// (internal/pgtest, a fresh database per rig), N built gateway processes,
// each with its own YAML configuration (cluster.enabled, replicaID r1…rN, the
// lease, a runner chosen per test; NATS authenticated as docs/scaling.md
// sets it up: each replica its own NATS user with busauth.ReplicaUser's
// permissions, and the cluster secret), and optionally one fake Telegram Bot API
// (internal/fakebot) shared by every replica.
//
// The gateway binary is $TURNGUARD_GATEWAY_BIN when set (make cluster-e2e
// builds bin/gateway), otherwise built once per test binary into a temporary
// directory. Every process dies with the test: gateways are killed at the
// test's cleanup and, should the test binary itself die, by the kernel
// (parent-death signal). Each gateway's log is kept; when the test failed the
// tails are printed, and with $TURNGUARD_CLUSTER_ARTIFACTS every log is
// written there in full. Every wait is bounded.
//
// Call Main from TestMain (it stops the PostgreSQL server and removes the
// built binary at the end).
package clusterrig

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/turnguard/turnguard/cluster/busauth"
	"github.com/turnguard/turnguard/internal/fakebot"
	"github.com/turnguard/turnguard/internal/natstest"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/tb"
	"github.com/turnguard/turnguard/internal/testlog"
	"github.com/turnguard/turnguard/internal/testproc"
	"github.com/turnguard/turnguard/internal/testwait"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// Environment variables.
const (
	EnvGatewayBin = "TURNGUARD_GATEWAY_BIN"       // a built gateway; else built once per test binary
	EnvArtifacts  = "TURNGUARD_CLUSTER_ARTIFACTS" // a directory for every gateway's full log
)

// Tokens every replica is configured with.
const (
	Token         = "cluster-rig-token"
	OperatorToken = "cluster-rig-operator-token"
)

// Bounds.
const (
	StartTimeout = 45 * time.Second // a gateway's start until /readyz answers 200
	TermTimeout  = 30 * time.Second // SIGTERM until the process has exited
)

// Options describe the cluster.
type Options struct {
	Replicas int           // gateways; default 3
	Lease    time.Duration // cluster.leaseSeconds; default 3s
	Telegram bool          // one fake Bot API, the Telegram channel on in every replica
	// Config edits replica i's configuration (0-based) before it is
	// written; Set helps with dotted keys.
	Config func(i int, cfg map[string]any)
	Env    []string // added to every gateway's environment
}

// Cluster is a running rig.
type Cluster struct {
	t    tb.TB
	opts Options
	nats *natstest.Cluster
	db   string
	bot  *fakebot.Bot
	gws  []*Gateway
}

// Start brings the whole cluster up and returns once every gateway answers
// /readyz. It fails the test if anything is missing or does not come up.
func Start(t tb.TB, o Options) *Cluster {
	t.Helper()
	if o.Replicas == 0 {
		o.Replicas = 3
	}
	if o.Lease == 0 {
		o.Lease = 3 * time.Second
	}
	bin := Binary(t)
	c := &Cluster{t: t, opts: o}
	// NATS as docs/scaling.md runs it: each replica its own user, with
	// only its own subjects (busauth.ReplicaUser).
	users := make([]busauth.User, o.Replicas)
	for i := range users {
		users[i] = busauth.ReplicaUser(replicaName(i), natsPassword(i))
	}
	c.nats = natstest.StartAuth(t, 3, users)
	c.db = pgtest.New(t)
	if o.Telegram {
		c.bot = fakebot.New(t)
	}
	ports := natstest.FreePorts(t, o.Replicas)
	for i := range o.Replicas {
		g := &Gateway{t: t, c: c, i: i, ID: replicaName(i), bin: bin, dir: t.TempDir(),
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[i]))}
		g.writeConfig()
		c.gws = append(c.gws, g)
	}
	t.Cleanup(c.cleanup)
	// Started one after the other: the first creates the schema and the
	// streams, and two cores are busy enough.
	for _, g := range c.gws {
		g.start()
	}
	return c
}

// replicaName is replica i's cluster.replicaID (0-based): r1, r2, …
func replicaName(i int) string { return "r" + strconv.Itoa(i+1) }

// natsPassword is replica i's NATS password.
func natsPassword(i int) string { return "clusterrig-nats-" + replicaName(i) }

// Secret is the rig's cluster.secret.
const Secret = "clusterrig-cluster-secret-0123456789abcdef"

// Gateway returns replica i (0-based).
func (c *Cluster) Gateway(i int) *Gateway { return c.gws[i] }

// Gateways returns every replica.
func (c *Cluster) Gateways() []*Gateway { return c.gws }

// NATS returns the NATS cluster (to kill, stop or restart a node).
func (c *Cluster) NATS() *natstest.Cluster { return c.nats }

// DBURL is the PostgreSQL database every replica shares.
func (c *Cluster) DBURL() string { return c.db }

// Bot is the fake Telegram Bot API (nil without Options.Telegram).
func (c *Cluster) Bot() *fakebot.Bot { return c.bot }

// Lease is the configured lease.
func (c *Cluster) Lease() time.Duration { return c.opts.Lease }

// Dial opens a protocol connection to replica i with the operator token
// (which may abort any run); it is closed at the test's cleanup.
func (c *Cluster) Dial(t tb.TB, i int) *wsclient.Client {
	t.Helper()
	g := c.gws[i]
	return wsclient.Dial(t, g.URL(), wsclient.Options{Token: OperatorToken, Name: g.ID})
}

// DialUser is Dial with the ordinary token (server.token).
func (c *Cluster) DialUser(t tb.TB, i int) *wsclient.Client {
	t.Helper()
	g := c.gws[i]
	return wsclient.Dial(t, g.URL(), wsclient.Options{Token: Token, Name: g.ID})
}

func (c *Cluster) cleanup() {
	for _, g := range c.gws {
		g.kill()
	}
	dir := os.Getenv(EnvArtifacts)
	if dir != "" {
		dir = filepath.Join(dir, safeName(c.t.Name()))
		_ = os.MkdirAll(dir, 0o755)
	}
	for _, g := range c.gws {
		if dir != "" {
			_ = os.WriteFile(filepath.Join(dir, g.ID+".log"), []byte(g.Log()), 0o644)
		}
		if c.t.Failed() {
			c.t.Logf("clusterrig: gateway %s log (tail):\n%s", g.ID, tail(g.Log(), 6000))
		}
	}
	if c.t.Failed() && c.bot != nil {
		c.t.Logf("clusterrig: the Telegram chat:%s", c.bot)
	}
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

func safeName(s string) string { return unsafeName.ReplaceAllString(s, "_") }

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// Set sets a dotted key ("channels.ws.busy.mode") in a configuration map,
// creating the maps on the way.
func Set(cfg map[string]any, key string, v any) {
	parts := strings.Split(key, ".")
	m := cfg
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = v
}

// baseConfig is replica g's configuration before Options.Config.
func (g *Gateway) baseConfig() map[string]any {
	c := g.c
	cfg := map[string]any{}
	Set(cfg, "server.listen", g.Addr)
	Set(cfg, "server.token", Token)
	Set(cfg, "server.operatorToken", OperatorToken)
	Set(cfg, "agents.defaults.runner", "demo")
	Set(cfg, "agents.defaults.abortGraceSeconds", 2)
	Set(cfg, "server.requestsPerSecond", 1000) // the tests poll histories
	Set(cfg, "store.driver", "postgres")
	Set(cfg, "store.url", c.db)
	Set(cfg, "cluster.enabled", true)
	Set(cfg, "cluster.replicaID", g.ID)
	Set(cfg, "cluster.leaseSeconds", c.opts.Lease.Seconds())
	Set(cfg, "cluster.nats.urls", c.nats.URLs())
	Set(cfg, "cluster.nats.user", g.ID)
	Set(cfg, "cluster.nats.password", natsPassword(g.i))
	Set(cfg, "cluster.secret", Secret)
	if c.bot != nil {
		Set(cfg, "channels.telegram.enabled", true)
		Set(cfg, "channels.telegram.token", fakebot.Token)
		Set(cfg, "channels.telegram.apiURL", c.bot.URLFor(g.ID)) // the fake tells the replicas apart
		Set(cfg, "channels.telegram.allowedChatIDs", []int64{fakebot.Chat})
	}
	return cfg
}

func (g *Gateway) writeConfig() {
	g.t.Helper()
	cfg := g.baseConfig()
	if g.c.opts.Config != nil {
		g.c.opts.Config(g.i, cfg)
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		g.t.Fatalf("clusterrig: %s config: %v", g.ID, err)
	}
	g.cfgPath = filepath.Join(g.dir, "gateway.yaml")
	if err := os.WriteFile(g.cfgPath, b, 0o600); err != nil {
		g.t.Fatal(err)
	}
}

// Gateway is one replica's process. It keeps its port, configuration and
// directory across Restart.
type Gateway struct {
	t       tb.TB
	c       *Cluster
	i       int
	ID      string // cluster.replicaID: r1, r2, …
	Addr    string // 127.0.0.1:port
	bin     string
	dir     string
	cfgPath string

	log testlog.Buffer // every run's stderr, in order

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	code int
	runs int
}

// URL is the WebSocket URL.
func (g *Gateway) URL() string { return "ws://" + g.Addr + "/" }

// HTTP is the base URL of the HTTP API.
func (g *Gateway) HTTP() string { return "http://" + g.Addr }

// Dir is the replica's working directory (its configuration is there).
func (g *Gateway) Dir() string { return g.dir }

// Log is what the replica has logged so far, over all its runs.
func (g *Gateway) Log() string { return g.log.String() }

// PID is the current process's id (0 when none was started).
func (g *Gateway) PID() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil {
		return 0
	}
	return g.cmd.Process.Pid
}

// Running reports whether the process is alive (also when stopped).
func (g *Gateway) Running() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil {
		return false
	}
	select {
	case <-g.done:
		return false
	default:
		return true
	}
}

// start runs the binary and waits until /readyz answers 200.
func (g *Gateway) start() {
	g.t.Helper()
	g.mu.Lock()
	g.runs++
	fmt.Fprintf(&g.log, "=== clusterrig: start %s (run %d) at %s\n", g.ID, g.runs, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(g.bin, "-config", g.cfgPath)
	cmd.Dir = g.dir
	cmd.Env = append(cleanEnv(), "GATEWAY_LOG_FORMAT=json")
	cmd.Env = append(cmd.Env, g.c.opts.Env...)
	// Output goes straight to the log (JSON lines); an agent process that
	// kept the pipe open cannot hold Wait past WaitDelay.
	cmd.Stdout, cmd.Stderr = &g.log, &g.log
	cmd.WaitDelay = 2 * time.Second
	// Killed by the kernel should the test binary die without its clean-up.
	exited, err := testproc.Start(cmd, syscall.SIGKILL)
	if err != nil {
		g.mu.Unlock()
		g.t.Fatalf("clusterrig: start %s (%s): %v", g.ID, g.bin, err)
	}
	done := make(chan struct{})
	go func() {
		<-exited
		g.mu.Lock()
		g.code = cmd.ProcessState.ExitCode()
		g.mu.Unlock()
		fmt.Fprintf(&g.log, "=== clusterrig: %s exited: %v\n", g.ID, cmd.ProcessState)
		close(done)
	}()
	g.cmd, g.done = cmd, done
	g.mu.Unlock()
	deadline := time.Now().Add(StartTimeout)
	for {
		if code, err := g.get("/readyz"); err == nil && code == http.StatusOK {
			return
		}
		select {
		case <-done:
			g.t.Fatalf("clusterrig: %s exited (%d) before it was ready:\n%s", g.ID, g.exitCode(), tail(g.Log(), 6000))
		default:
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("clusterrig: %s not ready within %v:\n%s", g.ID, StartTimeout, tail(g.Log(), 6000))
		}
		time.Sleep(testwait.Every) // real time: polling another process
	}
}

func (g *Gateway) exitCode() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.code
}

// cleanEnv is the test's environment without GATEWAY_ variables.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GATEWAY_") {
			out = append(out, kv)
		}
	}
	return out
}

func (g *Gateway) get(path string) (int, error) {
	cl := http.Client{Timeout: 2 * time.Second}
	res, err := cl.Get(g.HTTP() + path)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, nil
}

func (g *Gateway) signal(s syscall.Signal) {
	g.t.Helper()
	g.mu.Lock()
	cmd := g.cmd
	g.mu.Unlock()
	if cmd == nil {
		g.t.Fatalf("clusterrig: %s: signal %v before start", g.ID, s)
	}
	fmt.Fprintf(&g.log, "=== clusterrig: %v to %s at %s\n", s, g.ID, time.Now().Format(time.RFC3339Nano))
	if err := cmd.Process.Signal(s); err != nil && !errors.Is(err, os.ErrProcessDone) {
		g.t.Fatalf("clusterrig: %s: signal %v: %v", g.ID, s, err)
	}
}

// Kill sends SIGKILL and waits until the process is gone; it returns the
// moment the signal was sent.
func (g *Gateway) Kill() time.Time {
	g.t.Helper()
	at := time.Now()
	g.signal(syscall.SIGKILL)
	g.wait(10 * time.Second)
	return at
}

// Stop sends SIGSTOP (the process freezes, its sockets stay open); it
// returns the moment the signal was sent.
func (g *Gateway) Stop() time.Time {
	g.t.Helper()
	at := time.Now()
	g.signal(syscall.SIGSTOP)
	return at
}

// Cont sends SIGCONT.
func (g *Gateway) Cont() { g.t.Helper(); g.signal(syscall.SIGCONT) }

// Term sends SIGTERM (the graceful shutdown) and waits, at most
// TermTimeout, for the process to exit; it returns the exit code.
func (g *Gateway) Term() int {
	g.t.Helper()
	g.signal(syscall.SIGTERM)
	return g.wait(TermTimeout)
}

// Restart starts the replica again with the same port, configuration and
// directory (a running process is killed first) and waits until it is
// ready.
func (g *Gateway) Restart() {
	g.t.Helper()
	g.kill()
	g.start()
}

// wait waits at most d for the process to exit and returns its exit code.
func (g *Gateway) wait(d time.Duration) int {
	g.t.Helper()
	g.mu.Lock()
	done := g.done
	g.mu.Unlock()
	select {
	case <-done:
		return g.exitCode()
	case <-time.After(d): // real time: another process
		g.t.Fatalf("clusterrig: %s did not exit within %v", g.ID, d)
		return -1
	}
}

// kill ends the process, stopped or not, and waits for it (cleanup).
func (g *Gateway) kill() {
	g.mu.Lock()
	cmd, done := g.cmd, g.done
	g.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Kill() // a SIGSTOPped process dies too
	select {
	case <-done:
	case <-time.After(10 * time.Second): // real time: another process
		g.t.Errorf("clusterrig: %s did not die within 10s of SIGKILL", g.ID)
	}
}

// AdminAbort is the operator's POST /api/turns/{runId}/abort on this
// replica; it returns the HTTP status and body.
func (g *Gateway) AdminAbort(runID string) (int, string) {
	g.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, g.HTTP()+"/api/turns/"+runID+"/abort", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer "+OperatorToken)
	req.Header.Set("Content-Type", "application/json")
	cl := http.Client{Timeout: 15 * time.Second}
	res, err := cl.Do(req)
	if err != nil {
		g.t.Fatalf("clusterrig: %s: admin abort %s: %v", g.ID, runID, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// AdminPost POSTs body (JSON) to an operator API path and returns the
// status and the answer.
func (g *Gateway) AdminPost(path, body string) (int, string) {
	g.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, g.HTTP()+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+OperatorToken)
	req.Header.Set("Content-Type", "application/json")
	cl := http.Client{Timeout: 15 * time.Second}
	res, err := cl.Do(req)
	if err != nil {
		g.t.Fatalf("clusterrig: %s: POST %s: %v", g.ID, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// OperatorGet GETs an operator API path and decodes the JSON answer into v.
func (g *Gateway) OperatorGet(path string, v any) error {
	req, _ := http.NewRequest(http.MethodGet, g.HTTP()+path, nil)
	req.Header.Set("Authorization", "Bearer "+OperatorToken)
	cl := http.Client{Timeout: 10 * time.Second}
	res, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, res.StatusCode, b)
	}
	return json.Unmarshal(b, v)
}

// WaitLog waits until the replica's log contains s.
func (g *Gateway) WaitLog(within time.Duration, s string) {
	g.t.Helper()
	testwait.Until(g.t, within, g.ID+" logs "+strconv.Quote(s), func() bool { return strings.Contains(g.Log(), s) })
}

var (
	buildOnce sync.Once
	buildDir  string
	buildPath string
	buildErr  error
)

// Binary returns the gateway binary: $TURNGUARD_GATEWAY_BIN, or one built
// once per test binary from this source tree. It fails the test otherwise.
func Binary(t tb.TB) string {
	t.Helper()
	if p := os.Getenv(EnvGatewayBin); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("clusterrig: %s=%s: %v", EnvGatewayBin, p, err)
		}
		return p
	}
	buildOnce.Do(func() { buildPath, buildErr = build() })
	if buildErr != nil {
		t.Fatalf("clusterrig: build the gateway: %v", buildErr)
	}
	return buildPath
}

func build() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the source tree")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..")
	dir, err := os.MkdirTemp("", "turnguard-clusterrig-")
	if err != nil {
		return "", err
	}
	buildDir = dir
	out := filepath.Join(dir, "gateway")
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(gobin, "build", "-o", out, "./cmd/gateway")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/gateway: %w\n%s", err, b)
	}
	return out, nil
}

// Main runs the tests, then stops the PostgreSQL server and removes the
// built binary. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}
