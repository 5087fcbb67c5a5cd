package acp_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/acp"
	"github.com/turnguard/turnguard/store"
)

// The Go test agent (testdata/goagent) is built on another ACP
// implementation than the Node agent: the Go SDK, a module of its own that
// the first test needing it builds once (`go build`, which fetches the SDK
// through the module proxy when it is not in the module cache).
var goAgentBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
	out  []byte
}

// goAgent returns the path of the built Go test agent, or skips (fails
// under RequireEnv) when it cannot be built.
func goAgent(t *testing.T) string {
	t.Helper()
	b := &goAgentBuild
	b.once.Do(func() {
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		if b.dir, b.err = os.MkdirTemp("", "acp-goagent-"); b.err != nil {
			return
		}
		b.path = filepath.Join(b.dir, "goagent")
		cmd := exec.Command(gobin, "build", "-o", b.path, ".")
		cmd.Dir = filepath.Join("testdata", "goagent")
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod -buildvcs=false")
		b.out, b.err = cmd.CombinedOutput()
	})
	if b.err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("the Go test agent is required (%s=1) but did not build: %v\n%s", RequireEnv, b.err, b.out)
		}
		t.Skipf("the Go test agent did not build: %v\n%s", b.err, b.out)
	}
	return b.path
}

func removeGoAgent() {
	if goAgentBuild.dir != "" {
		_ = os.RemoveAll(goAgentBuild.dir)
	}
}

// goRunner returns a runner of the Go test agent (env: its environment).
func goRunner(t *testing.T, env map[string]string) (*logBuffer, runner.Runner) {
	t.Helper()
	cfg := config.ACP{Command: goAgent(t), Workdir: t.TempDir(), Env: env, IdleSeconds: 60, StartTimeoutSeconds: 20}
	r, logs, _ := build(t, cfg, grace)
	return logs, r
}

// answerWith answers every question with the option of kind, recording
// the questions.
func answerWith(kind runner.OptionKind) *approver {
	return &approver{answer: func(q runner.Question) (runner.Answer, error) {
		for _, o := range q.Options {
			if o.Kind == kind {
				return runner.Answer{Outcome: runner.Selected, OptionID: o.ID, Kind: o.Kind, By: "tester"}, nil
			}
		}
		return runner.Answer{Outcome: runner.TimedOut}, nil
	}}
}

// TestGoSDKAgent: an agent on the Go SDK that, like OpenCode, refuses an
// initialize whose clientInfo is not a valid ACP Implementation (name and
// version required) runs turns — a tool call asking permission included —
// and every message the runner sent it is valid ACP v1.
func TestGoSDKAgent(t *testing.T) {
	valid := acpSchema(t)
	_, r, _, wire := recorded(t, goAgent(t), nil, nil)
	c := &conv{key: "k", id: "c"}
	if got := mustSay(t, r, c.turn("hello")); got != "echo: hello" {
		t.Errorf("reply %q", got)
	}
	turn := c.turn("run ls -la")
	turn.Approver = answerWith(runner.AllowOnce)
	if got := mustSay(t, r, turn); got != "ran ls -la" {
		t.Errorf("reply %q", got)
	}
	seen := checkWire(t, valid, wire)
	if seen["initialize"] != 1 || seen["session/request_permission result"] != 1 {
		t.Errorf("messages sent: %v", seen)
	}
}

// TestAgentRefusesInitialize: an agent that refuses initialize never
// started, and the person reads that — not that a session was refused.
func TestAgentRefusesInitialize(t *testing.T) {
	logs, r := goRunner(t, map[string]string{"GOAGENT_REFUSE_INIT": "1"})
	_, err := say(t, r, (&conv{key: "k", id: "c"}).turn("hello"))
	want := messages.AgentStartFailed("Invalid params")
	if got := userError(t, err); got != want {
		t.Errorf("user sees %q, want %q", got, want)
	}
	if !strings.Contains(logs.String(), "acp: initialize failed") {
		t.Errorf("log lacks the failed initialize:\n%s", cutLog(logs.String()))
	}
}

// TestAlwaysAllowIsPerConversation: one agent process serves every
// conversation and keeps an "always" grant per process, so chat A's
// "Always allow" must not reach it: chat A is not asked again for the same
// call, chat B still is, and the agent only ever got "once" answers.
func TestAlwaysAllowIsPerConversation(t *testing.T) {
	_, r := goRunner(t, nil)
	a := &conv{key: "alice", id: "chat-a"}
	b := &conv{key: "bob", id: "chat-b"}
	run := func(c *conv, ap *approver, msg string) string {
		t.Helper()
		turn := c.turn(msg)
		turn.Approver = ap
		return mustSay(t, r, turn)
	}
	always := answerWith(runner.AllowAlways)
	if got := run(a, always, "run ls"); got != "ran ls" {
		t.Fatalf("chat A: %q", got)
	}
	if got := run(a, always, "run ls"); got != "ran ls" {
		t.Errorf("chat A again: %q", got)
	}
	if n := len(always.questions()); n != 1 {
		t.Errorf("chat A was asked %d times, want once: its \"always\" holds in chat A", n)
	}
	if got := run(a, always, "run pwd"); got != "ran pwd" || len(always.questions()) != 2 {
		t.Errorf("chat A, another command: %q after %d questions, want it asked", got, len(always.questions()))
	}
	other := answerWith(runner.RejectOnce)
	if got := run(b, other, "run ls"); got != messages.AgentNoReply {
		t.Errorf("chat B: %q, want the denied turn's %q", got, messages.AgentNoReply)
	}
	if qs := other.questions(); len(qs) != 1 || qs[0].Title != "Run ls" {
		t.Errorf("chat B was asked %+v, want one question about Run ls", qs)
	}
}

// TestToolStepRetitled: a tool call that starts as "bash" and is named by a
// later tool_call_update shows the person the real command; a denied call
// that ends the turn without text leaves a sentence, not an empty reply.
func TestToolStepRetitled(t *testing.T) {
	_, r := goRunner(t, nil)
	c := &conv{key: "k", id: "c"}
	mustSay(t, r, c.turn("hello")) // start-up out of the way
	tests := []struct {
		answer runner.OptionKind
		events []string
		text   string
	}{
		{runner.AllowOnce, []string{"start llm go-agent", "done llm go-agent", "start tool bash", "start tool Run ls -la",
			"done tool Run ls -la", "start llm go-agent", `delta "ran ls -la"`, "done llm go-agent"}, "ran ls -la"},
		{runner.RejectOnce, []string{"start llm go-agent", "done llm go-agent", "start tool bash", "start tool Run ls -la",
			"done tool Run ls -la", "start llm go-agent", "done llm go-agent"}, messages.AgentNoReply},
	}
	for _, tc := range tests {
		t.Run(string(tc.answer), func(t *testing.T) {
			turn := c.turn("run ls -la")
			turn.Approver = answerWith(tc.answer)
			expectTurn(t, r, turn, tc.text, tc.events)
		})
	}
}

// TestSlowStartIsNotAStepTimeout: the agent's start-up — initialize and
// session/new, 0.7 s each here — is bounded by startTimeoutSeconds, not by
// the 0.6 s liveness window: through the engine, the turn succeeds. The
// runner pauses the liveness clock for it and resumes it when the prompt
// is sent. Real processes do not run in a synctest bubble: this waits,
// bounded, for the engine's outcome.
func TestSlowStartIsNotAStepTimeout(t *testing.T) {
	path := goAgent(t)
	c := config.Default()
	c.Agents.Defaults.Runner = config.RunnerACP
	step, notify := 0.6, 0.0
	c.Agents.Defaults.StepTimeoutSeconds = &step
	c.Agents.Defaults.ProgressNotifyAfterSeconds = &notify
	c.Agents.ACP = config.ACP{Command: path, Workdir: t.TempDir(), IdleSeconds: 60, StartTimeoutSeconds: 20,
		Env: map[string]string{"GOAGENT_SLOW_START": "700ms"}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	r, _, _ := build(t, c.Agents.ACP, grace)
	e, err := gateway.New(gateway.Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{config.RunnerACP: r}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	e.Start(ctx)
	defer e.Shutdown(context.Background())
	_, err = e.Send(ctx, gateway.SendRequest{SessionKey: "s", Channel: "ws", RunID: "r1", Text: "hi"})
	out, ok := e.Wait(ctx, "r1")
	if err != nil || !ok {
		t.Fatalf("send: %v; outcome within 20s: %v", err, ok)
	}
	if out.StopReason != event.ReasonStop || out.Text != "echo: hi" {
		t.Fatalf("outcome %+v, want the reply: a slow start is no step timeout", out)
	}

	// What the runner reports: the pause spans the start-up only.
	rec := newRecorder()
	r2, _, _ := build(t, c.Agents.ACP, grace)
	o := await(t, start(context.Background(), r2, (&conv{key: "k", id: "c"}).turn("hi"), rec))
	if o.err != nil {
		t.Fatal(o.err)
	}
	want := []string{"pause " + messages.AgentStarting, "resume", "start llm go-agent", `delta "echo: hi"`, "done llm go-agent"}
	if got := rec.Events(); !slices.Equal(got, want) {
		t.Errorf("callbacks\n got %q\nwant %q", got, want)
	}
}

// TestGoSDKAgentResumes: an agent on the Go SDK that offers session/resume
// and session/close (not session/load) keeps a conversation across a
// gateway restart — runner and store replaced, the engine's new SessionID
// with the conversation's history — through session/resume, and /new
// closes the session; every message the runner sent it is valid ACP v1.
func TestGoSDKAgentResumes(t *testing.T) {
	valid := acpSchema(t)
	db, sessions := filepath.Join(t.TempDir(), "t.db"), t.TempDir()
	gateway := func() (*acp.Runner, *store.SQLite, string) {
		st, err := store.Open(context.Background(), db, store.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		_, r, _, wire := recorded(t, goAgent(t), nil, func(c *config.ACP) { c.Env["GOAGENT_SESSIONS"] = sessions },
			acp.WithSessions(st))
		return r.(*acp.Runner), st, wire
	}
	r, st, _ := gateway()
	c := &conv{key: "k", id: "c1"}
	mustSay(t, r, c.turn("remember the green door"))
	pid := mustSay(t, r, c.turn("pid"))
	_ = r.Close() // the gateway stops
	_ = st.Close()

	r, _, wire := gateway()
	c.id, c.history = "c1-after-restart", []runner.Message{{Role: "user", Text: "remember the green door"}}
	if got := mustSay(t, r, c.turn("what did I say")); got != "You said: the green door" {
		t.Errorf("after the restart: %q", got)
	}
	if got := mustSay(t, r, c.turn("pid")); got == pid {
		t.Fatalf("the same agent process %s answered: nothing restarted", pid)
	}
	c.id, c.history = "c2", nil // /new
	if got := mustSay(t, r, c.turn("what did I say")); got != "You said nothing yet." {
		t.Errorf("after /new: %q", got)
	}
	seen := checkWire(t, valid, wire)
	if seen["session/resume"] != 1 || seen["session/close"] != 1 || seen["session/new"] != 1 {
		t.Errorf("messages sent after the restart: %v, want one session/resume, session/close and session/new", seen)
	}
}

// TestGoSDKAgentListsAndSettings: with the Go SDK's agent too, /status's
// session/list and /mode's config options work — its list (ungrouped
// options, sessions with titles) and its set_config_option answer are
// read, and what the runner sends them is valid ACP v1.
func TestGoSDKAgentListsAndSettings(t *testing.T) {
	valid := acpSchema(t)
	_, rr, _, wire := recorded(t, goAgent(t), nil, nil)
	r := rr.(*acp.Runner)
	ctx := context.Background()
	a, b := &conv{key: "a", id: "ca"}, &conv{key: "b", id: "cb"}
	mustSay(t, r, a.turn("hello"))
	if got := mustSay(t, r, b.turn("effort")); got != "effort low" {
		t.Fatalf("effort: %q", got)
	}
	list, err := r.ListSessions(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Sessions) != 2 || list.Sessions[0].Title != "go session 1" || list.Sessions[1].ID != list.Current {
		t.Errorf("sessions %+v", list)
	}
	opts, ok := r.ConfigOptions("b")
	if !ok || len(opts) != 1 || opts[0].ID != "effort" || opts[0].Current != "low" || len(opts[0].Values) != 2 {
		t.Fatalf("config options %+v", opts)
	}
	if err := r.SetConfigOption(ctx, "b", "effort", "high"); err != nil {
		t.Fatal(err)
	}
	if opts, _ := r.ConfigOptions("b"); opts[0].Current != "high" {
		t.Errorf("after setting: %+v", opts)
	}
	if got := mustSay(t, r, b.turn("effort")); got != "effort high" {
		t.Errorf("the agent's effort after setting it: %q", got)
	}
	if seen := checkWire(t, valid, wire); seen["session/list"] != 1 || seen["session/set_config_option"] != 1 {
		t.Errorf("messages sent: %v", seen)
	}
}
