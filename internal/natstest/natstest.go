// Package natstest owns real nats-server processes for tests: a JetStream
// cluster of one or three nodes on loopback, each node a child process with
// its own free ports and store directory, that a test can kill, stop and
// restart. Nothing is mocked: the binary is the nats-server the project pins
// in tools/nats-server. Start runs the servers open; StartAuth runs them
// with an authorization block (users and their subject permissions, as
// cluster/busauth renders it for docs/scaling.md), so tests run the
// cluster as it is deployed and attack it as an outsider would.
//
// The binary is $TURNGUARD_NATS_SERVER when set (make test builds
// bin/nats-server and sets it); otherwise it is built once per test binary
// from the tools module into the user's cache directory (keyed by that
// module's go.sum, so repeats reuse it and the Go build cache makes a
// rebuild fast).
package natstest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnguard/turnguard/cluster/busauth"
	"github.com/turnguard/turnguard/internal/tb"
	"github.com/turnguard/turnguard/internal/testlog"
	"github.com/turnguard/turnguard/internal/testproc"
)

// EnvBinary names the environment variable that points at a built
// nats-server.
const EnvBinary = "TURNGUARD_NATS_SERVER"

// ReadyTimeout bounds how long Start and Restart wait for JetStream to
// have a meta leader.
const ReadyTimeout = 30 * time.Second

// Cluster is a set of nats-server processes started by Start. Its methods
// are safe for concurrent use; every process is killed at the test's
// cleanup.
type Cluster struct {
	t    tb.TB
	bin  string
	name string
	conf string // the authorization's configuration file; "" without
	// admin is natstest's own user (every right) when the servers
	// authenticate: its probes and Connect use it.
	admin busauth.User

	mu    sync.Mutex
	nodes []*node
}

type node struct {
	name        string
	clientPort  int
	clusterPort int
	monitorPort int // HTTP monitoring (/varz, /jsz) on 127.0.0.1
	dir         string
	log         *testlog.Buffer
	cmd         *exec.Cmd
	done        <-chan struct{} // closed when cmd has been waited for
}

// Start runs a JetStream cluster of n nodes (1 or 3) on 127.0.0.1 and
// returns once JetStream answers on every node (the meta group has a
// leader). It fails the test if the cluster does not come up within
// ReadyTimeout.
func Start(t tb.TB, n int) *Cluster {
	t.Helper()
	return start(t, n, nil)
}

// StartAuth is Start with servers that admit only users (rendered by
// busauth.Authorization, with their permissions) and natstest's own
// user, which has every right: Connect uses it unless the caller's
// options name another (nats.UserInfo), and Admin returns it.
func StartAuth(t tb.TB, n int, users []busauth.User) *Cluster {
	t.Helper()
	if users == nil {
		users = []busauth.User{}
	}
	return start(t, n, users)
}

// Admin is natstest's own user under StartAuth (every right); the zero
// User under Start.
func (c *Cluster) Admin() busauth.User { return c.admin }

func start(t tb.TB, n int, users []busauth.User) *Cluster {
	t.Helper()
	if n != 1 && n != 3 {
		t.Fatalf("natstest.Start: %d nodes; want 1 or 3", n)
	}
	c := &Cluster{t: t, bin: Binary(t), name: "tg" + strconv.Itoa(os.Getpid())}
	if users != nil {
		c.admin = busauth.User{Name: "natstest", Password: "natstest-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
		c.conf = filepath.Join(t.TempDir(), "auth.conf")
		if err := os.WriteFile(c.conf, []byte(busauth.Authorization(append([]busauth.User{c.admin}, users...))), 0o600); err != nil {
			t.Fatalf("natstest: write the authorization: %v", err)
		}
	}
	ports := FreePorts(t, 3*n)
	for i := range n {
		c.nodes = append(c.nodes, &node{
			name:        fmt.Sprintf("n%d", i),
			clientPort:  ports[3*i],
			clusterPort: ports[3*i+1],
			monitorPort: ports[3*i+2],
			dir:         t.TempDir(),
			log:         new(testlog.Buffer),
		})
	}
	t.Cleanup(c.cleanup)
	for i := range c.nodes {
		c.start(i)
	}
	c.WaitReady()
	return c
}

// URLs returns every node's client URL, in node order.
func (c *Cluster) URLs() []string {
	urls := make([]string, len(c.nodes))
	for i := range c.nodes {
		urls[i] = c.URL(i)
	}
	return urls
}

// URL returns node i's client URL.
func (c *Cluster) URL(i int) string {
	return "nats://127.0.0.1:" + strconv.Itoa(c.nodes[i].clientPort)
}

// Connect opens a connection to node i that fails over to the other nodes
// (in node order) and reconnects without end, every 50 ms; extra options
// apply after those. It is closed at the test's cleanup.
func (c *Cluster) Connect(t tb.TB, i int, opts ...nats.Option) *nats.Conn {
	t.Helper()
	urls := []string{c.URL(i)}
	for j, u := range c.URLs() {
		if j != i {
			urls = append(urls, u)
		}
	}
	opts = append([]nats.Option{nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond), nats.ReconnectJitter(0, 0), nats.Timeout(time.Second), c.adminAuth()}, opts...)
	nc, err := nats.Connect(strings.Join(urls, ","), opts...)
	if err != nil {
		t.Fatalf("natstest: connect to node %d: %v", i, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// adminAuth is the option that connects as natstest's own user (none
// without authorization).
func (c *Cluster) adminAuth() nats.Option {
	if c.conf == "" {
		return func(*nats.Options) error { return nil }
	}
	return nats.UserInfo(c.admin.Name, c.admin.Password)
}

// MonitorURL returns node i's HTTP monitoring endpoint
// (http://127.0.0.1:port; /varz, /jsz), loopback only and without
// authentication, as nats-server serves it.
func (c *Cluster) MonitorURL(i int) string {
	return "http://127.0.0.1:" + strconv.Itoa(c.nodes[i].monitorPort)
}

// PID returns node i's current process id (0 when it never started).
func (c *Cluster) PID(i int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cmd := c.nodes[i].cmd; cmd != nil && cmd.Process != nil {
		return cmd.Process.Pid
	}
	return 0
}

// Size is the number of nodes.
func (c *Cluster) Size() int { return len(c.nodes) }

// Kill sends SIGKILL to node i and waits for the process to end.
func (c *Cluster) Kill(i int) { c.signal(i, syscall.SIGKILL) }

// Stop asks node i to shut down (SIGTERM) and waits for it; past ten
// seconds it is killed.
func (c *Cluster) Stop(i int) { c.signal(i, syscall.SIGTERM) }

// Restart starts node i again with its ports and store directory (after
// Kill or Stop; a running node is killed first) and waits until JetStream
// answers on it.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	c.Kill(i)
	c.start(i)
	c.WaitReady()
}

// WaitReady waits until JetStream answers on every running node and, in a
// cluster, until a stream can be placed on all of them: a meta leader
// answers before it has heard from every peer, and a stream with as many
// replicas as nodes created then fails with "no suitable peers for
// placement".
func (c *Cluster) WaitReady() {
	c.t.Helper()
	up := 0
	for i := range c.nodes {
		if c.running(i) {
			c.waitNode(i)
			up++
		}
	}
	if len(c.nodes) > 1 && up == len(c.nodes) {
		c.waitPlacement()
	}
}

// waitPlacement polls until a memory stream with one replica per node can
// be created (it is deleted again).
func (c *Cluster) waitPlacement() {
	c.t.Helper()
	const name = "NATSTEST_PLACEMENT_PROBE"
	err := poll(func(ctx context.Context) error {
		return c.withJetStream(ctx, c.URL(0), func(ctx context.Context, js jetstream.JetStream) error {
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"natstest.placement.probe"},
				Storage: jetstream.MemoryStorage, Replicas: len(c.nodes)}); err != nil {
				return err
			}
			return js.DeleteStream(ctx, name)
		})
	})
	if err != nil {
		c.t.Fatalf("natstest: no stream of %d replicas could be placed within %v: %v\n%s", len(c.nodes), ReadyTimeout, err, tail(c.Log(0)))
	}
}

// Log returns what node i has written to stderr so far.
func (c *Cluster) Log(i int) string { return c.nodes[i].log.String() }

func (c *Cluster) running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.nodes[i]
	if nd.cmd == nil {
		return false
	}
	select {
	case <-nd.done:
		return false
	default:
		return true
	}
}

func (c *Cluster) start(i int) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.nodes[i]
	args := []string{
		"--name", nd.name,
		"--addr", "127.0.0.1",
		"--port", strconv.Itoa(nd.clientPort),
		"--http_port", strconv.Itoa(nd.monitorPort),
		"--jetstream",
		"--store_dir", nd.dir,
	}
	if c.conf != "" {
		args = append(args, "--config", c.conf)
	}
	if len(c.nodes) > 1 {
		var routes []string
		for j, o := range c.nodes {
			if j != i {
				routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(o.clusterPort))
			}
		}
		args = append(args,
			"--cluster_name", c.name,
			"--cluster", "nats://127.0.0.1:"+strconv.Itoa(nd.clusterPort),
			"--routes", strings.Join(routes, ","),
		)
	}
	cmd := exec.Command(c.bin, args...)
	cmd.Stdout = nd.log
	cmd.Stderr = nd.log
	// Killed by the kernel should the test binary die without its clean-up.
	done, err := testproc.Start(cmd, syscall.SIGKILL)
	if err != nil {
		c.t.Fatalf("natstest: start node %d (%s): %v", i, c.bin, err)
	}
	nd.cmd, nd.done = cmd, done
}

func (c *Cluster) signal(i int, sig syscall.Signal) {
	c.mu.Lock()
	nd := c.nodes[i]
	cmd, done := nd.cmd, nd.done
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// waitNode polls node i until JetStream's account info answers there, which
// needs a meta leader in a cluster.
func (c *Cluster) waitNode(i int) {
	c.t.Helper()
	err := poll(func(ctx context.Context) error {
		return c.withJetStream(ctx, c.URL(i), func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.AccountInfo(ctx)
			return err
		})
	})
	if err != nil {
		c.t.Fatalf("natstest: node %d: JetStream not ready within %v: %v\n%s", i, ReadyTimeout, err, tail(c.Log(i)))
	}
}

// poll calls try every 50 ms until it succeeds or ReadyTimeout has passed,
// and returns its last error.
func poll(try func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), ReadyTimeout)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		if last = try(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return last
}

// withJetStream connects to url (no reconnects) and calls fn with a
// JetStream handle and a context of at most two seconds.
func (c *Cluster) withJetStream(ctx context.Context, url string, fn func(ctx context.Context, js jetstream.JetStream) error) error {
	nc, err := nats.Connect(url, nats.Timeout(time.Second), nats.NoReconnect(), c.adminAuth())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return fn(rctx, js)
}

func (c *Cluster) cleanup() {
	for i := range c.nodes {
		c.Kill(i)
	}
	if c.t.Failed() {
		for i := range c.nodes {
			c.t.Logf("natstest: node %d log (tail):\n%s", i, tail(c.Log(i)))
		}
	}
}

func tail(s string) string {
	const max = 4000
	if len(s) > max {
		return "…" + s[len(s)-max:]
	}
	return s
}

// FreePorts returns n distinct loopback ports that were free a moment ago (held
// open together, so no two are the same).
func FreePorts(t tb.TB, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("natstest: free port: %v", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Binary returns the path of a nats-server binary: $TURNGUARD_NATS_SERVER
// if set, else one built from tools/nats-server (once per test binary). It
// fails the test if neither works; it never skips.
func Binary(t tb.TB) string {
	t.Helper()
	if p := os.Getenv(EnvBinary); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("natstest: %s=%s: %v", EnvBinary, p, err)
		}
		return p
	}
	buildOnce.Do(func() { buildPath, buildErr = build() })
	if buildErr != nil {
		t.Fatalf("natstest: build nats-server: %v", buildErr)
	}
	return buildPath
}

// build compiles the pinned server into the cache directory, under a name
// keyed by the tools module's go.sum; concurrent test binaries each build
// to a temporary name and rename, so a reader never sees half a binary.
func build() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the source tree")
	}
	mod := filepath.Join(filepath.Dir(file), "..", "..", "tools", "nats-server")
	sum, err := os.ReadFile(filepath.Join(mod, "go.sum"))
	if err != nil {
		return "", fmt.Errorf("read the tools module: %w", err)
	}
	h := sha256.Sum256(sum)
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "turnguard-natstest")
	out := filepath.Join(dir, "nats-server-"+hex.EncodeToString(h[:8]))
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, "build-*")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(gobin, "build", "-o", tmp.Name(), "github.com/nats-io/nats-server/v2")
	cmd.Dir = mod
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build in %s: %w\n%s", mod, err, b)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", err
	}
	return out, nil
}
