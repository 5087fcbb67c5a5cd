package acp_test

import (
	"cmp"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/acp"
	"github.com/turnguard/turnguard/store"
)

// sessionsRig is a runner of the Node test agent whose sessions outlive
// its process (files in agentDir, advertised as caps) and whose
// conversations' agent sessions are kept in a real SQLite store at dbPath;
// restart replaces runner and store as a gateway restart does.
type sessionsRig struct {
	t        *testing.T
	cfg      config.ACP
	dbPath   string
	agentDir string
	st       *store.SQLite
	r        *acp.Runner
	logs     *logBuffer
}

func newSessionsRig(t *testing.T, caps string, idleSeconds float64) *sessionsRig {
	t.Helper()
	node, args := nodeAgent(t)
	g := &sessionsRig{t: t, dbPath: filepath.Join(t.TempDir(), "turnguard.db"), agentDir: t.TempDir()}
	g.cfg = config.ACP{Command: node, Args: args, Workdir: t.TempDir(), IdleSeconds: idleSeconds, StartTimeoutSeconds: 20,
		Env: map[string]string{"ACP_TEST_SESSIONS": g.agentDir, "ACP_TEST_CAPS": caps}}
	g.open()
	return g
}

func (g *sessionsRig) open() {
	g.t.Helper()
	st, err := store.Open(context.Background(), g.dbPath, store.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		g.t.Fatalf("open the store: %v", err)
	}
	g.t.Cleanup(func() { _ = st.Close() })
	g.st = st
	g.r, g.logs, _ = build(g.t, g.cfg, grace, acp.WithSessions(st))
}

// restart stops the agent and the store as a gateway shutdown does, and
// opens both anew.
func (g *sessionsRig) restart() {
	g.t.Helper()
	if err := g.r.Close(); err != nil {
		g.t.Fatal(err)
	}
	if err := g.st.Close(); err != nil {
		g.t.Fatal(err)
	}
	g.open()
}

// calls lists the session/load, session/resume and session/close requests
// the agent processes served, as "<method> <sessionId>".
func (g *sessionsRig) calls() []string {
	b, err := os.ReadFile(filepath.Join(g.agentDir, "calls.log"))
	if err != nil && !os.IsNotExist(err) {
		g.t.Fatal(err)
	}
	return strings.Fields(strings.ReplaceAll(string(b), " ", "|"))
}

// methods lists the methods of calls.
func (g *sessionsRig) methods() []string {
	var out []string
	for _, c := range g.calls() {
		m, _, _ := strings.Cut(c, "|")
		out = append(out, m)
	}
	return out
}

// TestSessionOutlivesTheAgent: a conversation keeps its agent's context
// when the agent process crashed or was stopped idle, or the gateway
// restarted, through
// session/resume or session/load, whichever the agent advertises; the
// history session/load replays is not part of the reply. An agent that
// can do neither, or fails to, starts afresh, and the person is told so
// once.
func TestSessionOutlivesTheAgent(t *testing.T) {
	const lost = messages.AgentContextLost + "\n\n"
	tests := []struct {
		name, caps string
		idle       float64 // idleSeconds (0: 60)
		restart    func(g *sessionsRig, c *conv)
		want       string // the reply to "what did I say" after the restart
		calls      []string
	}{
		{name: "agent crash, load", caps: "load", restart: crash, want: "You said: the blue door", calls: []string{"session/load"}},
		{name: "agent crash, resume", caps: "load,resume", restart: crash, want: "You said: the blue door", calls: []string{"session/resume"}},
		{name: "gateway restart, load", caps: "load", restart: gatewayRestart, want: "You said: the blue door", calls: []string{"session/load"}},
		{name: "gateway restart, resume", caps: "resume", restart: gatewayRestart, want: "You said: the blue door", calls: []string{"session/resume"}},
		{name: "idle stop, load", caps: "load", idle: 0.5, restart: idleStop, want: "You said: the blue door", calls: []string{"session/load"}},
		{name: "agent crash, neither", caps: "", restart: crash, want: lost + "You said nothing yet."},
		{name: "agent crash, load fails", caps: "load", restart: crashForgetting, want: lost + "You said nothing yet.", calls: []string{"session/load"}},
		{name: "idle stop, neither", caps: "", idle: 0.5, restart: idleStop, want: lost + "You said nothing yet."},
		{name: "gateway restart, neither", caps: "close", restart: gatewayRestart, want: lost + "You said nothing yet."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newSessionsRig(t, tc.caps, cmp.Or(tc.idle, 60))
			c := &conv{key: "alice", id: "conv-a1"}
			mustSay(t, g.r, c.turn("remember the blue door"))
			pid := mustSay(t, g.r, c.turn("pid"))
			tc.restart(g, c)
			t.Cleanup(func() {
				if t.Failed() {
					t.Log(g.logs.String())
				}
			})
			if got := mustSay(t, g.r, c.turn("what did I say")); got != tc.want {
				t.Errorf("after the restart: %q, want %q", got, tc.want)
			}
			if got := mustSay(t, g.r, c.turn("pid")); got == pid {
				t.Fatalf("the same agent process %s answered: the test restarted nothing", pid)
			}
			// Told once: the new session is the conversation's from now on.
			if got := mustSay(t, g.r, c.turn("what did I say")); got != strings.TrimPrefix(tc.want, lost) {
				t.Errorf("the turn after: %q, want %q", got, strings.TrimPrefix(tc.want, lost))
			}
			if got := g.methods(); strings.Join(got, " ") != strings.Join(tc.calls, " ") {
				t.Errorf("the agent served %q, want %q", got, tc.calls)
			}
		})
	}
}

// crash makes the agent process exit during a turn.
func crash(g *sessionsRig, c *conv) {
	g.t.Helper()
	if _, err := say(g.t, g.r, c.turn("crash")); err == nil {
		g.t.Fatal("the crash turn succeeded")
	}
}

// crashForgetting crashes the agent, which loses its sessions' files: it
// refuses session/load.
func crashForgetting(g *sessionsRig, c *conv) {
	g.t.Helper()
	crash(g, c)
	files, err := filepath.Glob(filepath.Join(g.agentDir, "*.json"))
	if err != nil || len(files) == 0 {
		g.t.Fatalf("no session files to forget (%v)", err)
	}
	for _, f := range files {
		if err := os.Remove(f); err != nil {
			g.t.Fatal(err)
		}
	}
}

// idleStop lets idleSeconds pass: the session expires and the agent left
// without one is stopped.
func idleStop(g *sessionsRig, _ *conv) {
	time.Sleep(1500 * time.Millisecond) // real time: as in TestIdle, idleSeconds of a real agent process must pass
	if !strings.Contains(g.logs.String(), "reason=idle") {
		g.t.Fatalf("the idle agent was not stopped:\n%s", cutLog(g.logs.String()))
	}
}

// gatewayRestart restarts the gateway: the engine gives the conversation
// another SessionID (its ids are its process's) and its history.
func gatewayRestart(g *sessionsRig, c *conv) {
	g.restart()
	c.id += "-after-restart"
	c.history = []runner.Message{{Role: "user", Text: "remember the blue door"}}
}

// TestNewClosesTheOldSession: /new gives the conversation a new agent
// session and closes the old one (session/close, advertised) — in the same
// gateway process and after a restart, when the old session is known only
// from the store — and the new conversation is what a restart restores.
func TestNewClosesTheOldSession(t *testing.T) {
	g := newSessionsRig(t, "load,close", 60)
	c := &conv{key: "alice", id: "conv-a1"}
	mustSay(t, g.r, c.turn("remember the blue door"))

	c.id = "conv-a2" // /new
	if got := mustSay(t, g.r, c.turn("what did I say")); got != "You said nothing yet." {
		t.Fatalf("after /new: %q, want a new session and no notice", got)
	}
	calls := g.calls()
	if len(calls) != 1 || !strings.HasPrefix(calls[0], "session/close|s1-") {
		t.Fatalf("after /new the agent served %q, want session/close of the first session", calls)
	}
	mustSay(t, g.r, c.turn("remember the red door"))

	gatewayRestart(g, c)
	if got := mustSay(t, g.r, c.turn("what did I say")); got != "You said: the red door" {
		t.Errorf("after the restart: %q, want the conversation after /new", got)
	}
	c.id, c.history = "conv-a3", nil // /new after the restart
	if got := mustSay(t, g.r, c.turn("what did I say")); got != "You said nothing yet." {
		t.Errorf("after the second /new: %q", got)
	}
	if got := strings.Join(g.methods(), " "); got != "session/close session/load session/close" {
		t.Errorf("the agent served %q, want close, load, close", got)
	}
}
