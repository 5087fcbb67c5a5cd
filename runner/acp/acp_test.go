package acp_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
)

const grace = 400 * time.Millisecond

// TestConversationKeepsItsSession: two turns of one conversation share the
// agent's session (the second remembers the first) and one process (start-
// up paid once); another conversation has its own session; /new (a new
// SessionID for the same key) starts a fresh one.
func TestConversationKeepsItsSession(t *testing.T) {
	r, _, dir := newRunner(t, grace, nil)
	a := &conv{key: "alice", id: "conv-a1"}
	b := &conv{key: "bob", id: "conv-b1"}

	if got := mustSay(t, r, a.turn("remember the blue door")); got != "OK, I will remember the blue door." {
		t.Fatalf("first turn: %q", got)
	}
	pid := mustSay(t, r, a.turn("pid"))
	if got := mustSay(t, r, a.turn("what did I say")); got != "You said: the blue door" {
		t.Errorf("second turn of the conversation: %q, want the remembered text", got)
	}
	if got := mustSay(t, r, b.turn("what did I say")); got != "You said nothing yet." {
		t.Errorf("another conversation: %q", got)
	}
	if got := mustSay(t, r, b.turn("pid")); got != pid {
		t.Errorf("another conversation ran on %q, want the same process %q", got, pid)
	}
	if got, want := mustSay(t, r, a.turn("cwd")), "cwd "+dir; got != want {
		t.Errorf("session cwd: %q, want %q", got, want)
	}

	a.id = "conv-a2" // /new
	if got := mustSay(t, r, a.turn("what did I say")); got != "You said nothing yet." {
		t.Errorf("after /new: %q, want a fresh session", got)
	}
}

// TestUpdatesMapToCallbacks: what the agent's session/update notifications
// become for the engine: steps, reply text, and activity (no words) for
// thoughts and plans; a plan's entry in progress names the llm step.
func TestUpdatesMapToCallbacks(t *testing.T) {
	r, _, _ := newRunner(t, grace, nil)
	tests := []struct {
		msg    string
		events []string
		text   string
	}{{
		msg:    "hello", // the conversation's first turn: the liveness clock is paused for the start-up
		events: []string{"pause " + messages.AgentStarting, "resume", "start llm test-agent", `delta "echo: hello"`, "done llm test-agent"},
		text:   "echo: hello",
	}, {
		msg: "tool echo 42",
		events: []string{"start llm test-agent", "done llm test-agent", "start tool Echo 42", "done tool Echo 42",
			"start llm test-agent", `delta "echoed 42"`, "done llm test-agent"},
		text: "echoed 42",
	}, {
		msg:    "think",
		events: []string{"start llm test-agent", "activity", "activity", `delta "thought done"`, "done llm test-agent"},
		text:   "thought done",
	}, {
		// A plan names the llm step after its entry in progress: the step
		// the "⏳ Still working" notice names.
		msg: "plan",
		events: []string{"start llm test-agent", "start llm 📋 2/5: Run tests", "activity", `delta "planned"`,
			"done llm 📋 2/5: Run tests"},
		text: "planned",
	}}
	c := &conv{key: "k", id: "c"}
	for _, tc := range tests {
		t.Run(tc.msg, func(t *testing.T) { expectTurn(t, r, c.turn(tc.msg), tc.text, tc.events) })
	}
}

// TestPermission: the agent's session/request_permission becomes the
// person's question; the answer decides whether its tool runs.
func TestPermission(t *testing.T) {
	r, _, _ := newRunner(t, grace, nil)
	pick := func(id string) func(runner.Question) (runner.Answer, error) {
		return func(q runner.Question) (runner.Answer, error) {
			for _, o := range q.Options {
				if o.ID == id {
					return runner.Answer{Outcome: runner.Selected, OptionID: id, Kind: o.Kind, By: "alice"}, nil
				}
			}
			return runner.Answer{}, errors.New("no such option")
		}
	}
	timedOut := func(q runner.Question) (runner.Answer, error) {
		return runner.Answer{Outcome: runner.TimedOut, OptionID: "no", Kind: runner.RejectOnce}, nil
	}
	tests := []struct {
		name     string
		approver runner.Approver
		reply    string
	}{
		{"allowed", &approver{answer: pick("yes")}, "Tool output: deleted 3 files"},
		{"denied", &approver{answer: pick("no")}, "Permission denied (no)."},
		{"nobody answered", &approver{answer: timedOut}, "Permission denied (no)."},
		{"no approver", nil, "Permission denied (no)."},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			turn := (&conv{key: "k", id: "perm" + string(rune('a'+i))}).turn("ask permission")
			turn.Approver = tc.approver
			got := mustSay(t, r, turn)
			if got != tc.reply {
				t.Errorf("reply %q, want %q", got, tc.reply)
			}
			a, ok := tc.approver.(*approver)
			if !ok {
				return
			}
			want := runner.Question{Title: "Delete build/", Tool: "delete", Detail: `{"path":"build/"}`, Options: []runner.Option{
				{ID: "yes", Label: "Allow once", Kind: runner.AllowOnce}, {ID: "no", Label: "Reject", Kind: runner.RejectOnce}}}
			if qs := a.questions(); len(qs) != 1 || !questionEqual(qs[0], want) {
				t.Errorf("questions %+v, want one %+v", qs, want)
			}
		})
	}
}

func questionEqual(a, b runner.Question) bool {
	return a.Title == b.Title && a.Tool == b.Tool && a.Detail == b.Detail && slices.Equal(a.Options, b.Options)
}

// TestPermissionWhileStopped: a turn stopped while its question is open
// answers the agent "cancelled" and returns promptly.
func TestPermissionWhileStopped(t *testing.T) {
	r, _, _ := newRunner(t, grace, nil)
	asked := make(chan struct{})
	ap := &approver{answer: nil}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ap.answer = func(runner.Question) (runner.Answer, error) {
		close(asked)
		<-ctx.Done()
		return runner.Answer{}, ctx.Err()
	}
	c := &conv{key: "k", id: "c"}
	turn := c.turn("ask permission")
	turn.Approver = ap
	ch := start(ctx, r, turn, nil)
	<-asked
	cancel()
	if o := await(t, ch); !errors.Is(o.err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", o.err)
	}
	if got := mustSay(t, r, c.turn("what did I say")); got != "You said nothing yet." {
		t.Errorf("the next turn: %q", got)
	}
}

// TestFiles: fs/write_text_file and fs/read_text_file work inside the
// workdir and are refused outside it, through ".." or a symbolic link.
func TestFiles(t *testing.T) {
	r, _, dir := newRunner(t, grace, nil)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		msg, reply string
	}{
		{"write file " + dir + "/notes/a.txt hello-file", "wrote " + dir + "/notes/a.txt"},
		{"read file " + dir + "/notes/a.txt", "content: hello-file"},
		{"read file notes/a.txt", "content: hello-file"},
		{"read file " + dir + "/../" + filepath.Base(outside) + "/secret.txt", "refused: access denied"},
		{"read file " + outside + "/secret.txt", "refused: access denied"},
		{"read file " + dir + "/link/secret.txt", "refused: access denied"},
		{"write file " + dir + "/link/evil.txt x", "refused: access denied"},
		{"write file " + dir + "/../evil.txt x", "refused: access denied"},
		{"read file " + dir + "/missing.txt", "refused: " + dir + "/missing.txt: no such file"},
	}
	c := &conv{key: "k", id: "c"}
	for _, tc := range tests {
		got := mustSay(t, r, c.turn(tc.msg))
		if !strings.HasPrefix(got, tc.reply) {
			t.Errorf("%q: reply %q, want it to start with %q", tc.msg, got, tc.reply)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "notes", "a.txt")); err != nil || string(b) != "hello-file" {
		t.Errorf("written file: %q, %v", b, err)
	}
	for _, p := range []string{filepath.Join(outside, "evil.txt"), filepath.Join(filepath.Dir(dir), "evil.txt")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s was written outside the workdir", p)
		}
	}
}

// TestStopReasons: a prompt that ends other than end_turn reaches the user
// in plain words, with the text so far; the session goes on.
func TestStopReasons(t *testing.T) {
	r, _, _ := newRunner(t, grace, nil)
	tests := []struct{ msg, want string }{
		{"stop max_tokens", "The agent stopped: it reached its output limit (max tokens) before finishing."},
		{"stop refusal", "The agent refused to continue with this request."},
		{"stop max_turn_requests", "The agent stopped: it reached its limit of model requests for one turn."},
		{"stop cancelled", "The agent cancelled the turn."},
		{"error", "The agent could not answer: quota exhausted for today"},
	}
	c := &conv{key: "k", id: "c"}
	mustSay(t, r, c.turn("remember me"))
	for _, tc := range tests {
		text, err := say(t, r, c.turn(tc.msg))
		if got := userError(t, err); got != tc.want {
			t.Errorf("%q: user sees %q, want %q", tc.msg, got, tc.want)
		}
		if tc.msg != "error" && text != "partial answer" {
			t.Errorf("%q: text %q, want the partial answer", tc.msg, text)
		}
	}
	if got := mustSay(t, r, c.turn("what did I say")); got != "You said: me" {
		t.Errorf("after the early stops: %q", got)
	}
}

// TestCancel: an aborted turn sends session/cancel; an agent that honours
// it ends the prompt "cancelled" and keeps its process and session; one
// that ignores it is stopped after half the grace, and the next message
// gets a fresh process.
func TestCancel(t *testing.T) {
	for _, tc := range []struct {
		name, msg string
		sameProc  bool
		firstStep string
	}{
		{"honoured", "tool hang", true, "start tool Run slow_tool"},
		{"ignored", "hang ignore cancel", false, `delta "Ignoring you. "`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, logs, _ := newRunner(t, grace, nil)
			c := &conv{key: "k", id: "c"}
			mustSay(t, r, c.turn("remember cancel"))
			pid := mustSay(t, r, c.turn("pid"))
			ctx, cancel := context.WithCancel(context.Background())
			rec := newRecorder()
			ch := start(ctx, r, c.turn(tc.msg), rec)
			rec.WaitFor(t, tc.firstStep)
			cancel()
			o := await(t, ch)
			if !errors.Is(o.err, context.Canceled) {
				t.Fatalf("err %v, want context.Canceled", o.err)
			}
			if o.res.Text == "" {
				t.Error("no partial text")
			}
			if o.dur > 5*time.Second {
				t.Errorf("Run took %v after the abort", o.dur)
			}
			got := mustSay(t, r, c.turn("pid"))
			if (got == pid) != tc.sameProc {
				t.Errorf("after the abort the agent is %q (before %q); same process wanted: %v", got, pid, tc.sameProc)
			}
			wantMem := "You said: cancel"
			if !tc.sameProc {
				wantMem = "You said nothing yet."
				if !strings.Contains(logs.String(), "did not answer session/cancel") {
					t.Errorf("log does not say the agent ignored the cancel:\n%s", logs)
				}
			}
			if got := mustSay(t, r, c.turn("what did I say")); got != wantMem {
				t.Errorf("memory after the abort: %q, want %q", got, wantMem)
			}
		})
	}
}

// TestHostileAgent: a crash, junk output, a huge line, stderr: the user
// gets a clear message (never stderr), the log gets the details, and the
// next message works on a fresh process.
func TestHostileAgent(t *testing.T) {
	tests := []struct {
		msg      string
		userErr  string // "" = the turn succeeds
		reply    string
		log      string
		freshRun bool
	}{
		{msg: "crash", userErr: "The agent stopped unexpectedly (exit status 3). Send your message again to start it anew.",
			reply: "about to crash", log: "acp: agent process ended", freshRun: true},
		{msg: "garbage", reply: "after garbage", log: "not a JSON-RPC message; ignored"},
		{msg: "huge line", userErr: "The agent sent a message larger than 10 MB, so it was stopped. Send your message again to start it anew.",
			log: "acp: agent output line over the limit", freshRun: true},
		{msg: "stderr", reply: "stderr written", log: "agent diagnostics: all fine"},
	}
	for _, tc := range tests {
		t.Run(tc.msg, func(t *testing.T) {
			r, logs, _ := newRunner(t, grace, nil)
			c := &conv{key: "k", id: "c"}
			mustSay(t, r, c.turn("remember before"))
			pid := mustSay(t, r, c.turn("pid"))
			text, err := say(t, r, c.turn(tc.msg))
			if tc.userErr == "" && err != nil {
				t.Fatalf("err %v", err)
			}
			if tc.userErr != "" {
				if got := userError(t, err); got != tc.userErr {
					t.Errorf("user sees %q, want %q", got, tc.userErr)
				}
			}
			if text != tc.reply {
				t.Errorf("text %q, want %q", text, tc.reply)
			}
			if tc.msg == "garbage" {
				if n := strings.Count(logs.String(), "not a JSON-RPC message; ignored"); n > 60 {
					t.Errorf("%d junk lines logged one by one, want a bounded number", n)
				}
				if !strings.Contains(logs.String(), "run_ids=[c-run3]") {
					t.Errorf("junk lines are not logged with the run id:\n%s", cutLog(logs.String()))
				}
			}
			got := mustSay(t, r, c.turn("pid"))
			if (got != pid) != tc.freshRun {
				t.Errorf("next turn on %q (before %q); fresh process wanted: %v", got, pid, tc.freshRun)
			}
			wantMem := "You said: before"
			if tc.freshRun {
				wantMem = "You said nothing yet."
			}
			if got := mustSay(t, r, c.turn("what did I say")); got != wantMem {
				t.Errorf("memory: %q, want %q", got, wantMem)
			}
			_ = r.Close() // returns once the agents' output is logged
			if !strings.Contains(logs.String(), tc.log) {
				t.Errorf("log lacks %q:\n%s", tc.log, cutLog(logs.String()))
			}
		})
	}
}

func cutLog(s string) string {
	if len(s) > 4000 {
		return s[:4000] + "…"
	}
	return s
}

// TestNew: configuration errors name the key.
func TestNew(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		cfg  config.ACP
		want string
	}{
		{config.ACP{}, "agents.acp.command: required"},
		{config.ACP{Command: "no-such-agent-xyz"}, "agents.acp.command:"},
		{config.ACP{Command: "./f", Workdir: dir}, "agents.acp.command: \"./f\" is not an executable file"},
		{config.ACP{Command: "sh", Workdir: file}, "agents.acp.workdir:"},
		{config.ACP{Command: "sh", Env: map[string]string{"A=B": "x"}}, "agents.acp.env:"},
	}
	for _, tc := range tests {
		if _, err := newACP(tc.cfg); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want %q…", tc.cfg, err, tc.want)
		}
	}
}

// TestIdle: a conversation unused for idleSeconds loses its ACP session,
// and the agent process left without a session is stopped; the next
// message starts both afresh.
func TestIdle(t *testing.T) {
	r, logs, _ := newRunner(t, grace, func(c *config.ACP) { c.IdleSeconds = 0.5 })
	c := &conv{key: "k", id: "c"}
	mustSay(t, r, c.turn("remember idle"))
	pid := mustSay(t, r, c.turn("pid"))
	if got := mustSay(t, r, c.turn("what did I say")); got != "You said: idle" {
		t.Fatalf("within idleSeconds: %q", got)
	}
	time.Sleep(1500 * time.Millisecond) // real time: idleSeconds of a real agent process must pass
	if got := mustSay(t, r, c.turn("what did I say")); got != "You said nothing yet." {
		t.Errorf("after idleSeconds: %q, want a new session", got)
	}
	if got := mustSay(t, r, c.turn("pid")); got == pid {
		t.Errorf("after idleSeconds the same process %s answered; want the idle one stopped", pid)
	}
	if !strings.Contains(logs.String(), `msg="acp: stopping agent" agent_process=1 reason=idle`) {
		t.Errorf("log does not say the idle agent was stopped:\n%s", cutLog(logs.String()))
	}
}
