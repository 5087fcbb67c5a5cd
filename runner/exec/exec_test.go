package exec_test

// These tests run real processes (the shell scripts and fixtures in
// testdata/), so the abort grace is real time; it is kept tiny and the tests
// wait for Run to return rather than sleeping.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/internal/cbrec"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/exec"

	"github.com/turnguard/turnguard/internal/testlog"
)

const grace = 200 * time.Millisecond

// recorder records callbacks as readable strings and lets a test wait for
// one (internal/cbrec).
type recorder = cbrec.Recorder

func newRecorder() *recorder { return cbrec.New() }

type logBuffer = testlog.Buffer

func newRunner(t *testing.T, cfg config.Exec) (*exec.Runner, *logBuffer) {
	t.Helper()
	return newRunnerGrace(t, cfg, grace)
}

func newRunnerGrace(t *testing.T, cfg config.Exec, g time.Duration) (*exec.Runner, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := exec.New(cfg, g, log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r, logs
}

func script(name string) string { return filepath.Join("testdata", name) }

type outcome struct {
	res runner.Result
	err error
	dur time.Duration
}

// start runs a turn in the background.
func start(ctx context.Context, r *exec.Runner, msg string, cb runner.Callbacks) <-chan outcome {
	return startTurn(ctx, r, runner.Turn{RunID: "run-1", SessionKey: "sess-1", Channel: "ws", Message: msg}, cb)
}

// startTurn runs turn in the background.
func startTurn(ctx context.Context, r *exec.Runner, turn runner.Turn, cb runner.Callbacks) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		t0 := time.Now()
		res, err := r.Run(ctx, turn, cb)
		ch <- outcome{res, err, time.Since(t0)}
	}()
	return ch
}

// await waits for Run to return (10s of real time at most).
func await(t *testing.T, ch <-chan outcome) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
		return outcome{}
	}
}

func TestJSONLProtocol(t *testing.T) {
	tests := []struct {
		name     string
		script   string
		events   []string
		text     string
		userErr  string
		malforms uint64
	}{{
		name:   "every event type",
		script: "all_events.sh",
		events: []string{
			"start tool search", "heartbeat", "done tool search",
			"pause waiting for approval", "resume",
			"start llm local-model", `delta "Hello, "`, `delta "world"`, "done llm local-model",
		},
		text: "You said: ping",
	}, {
		name:   "final without text answers with the deltas",
		script: "deltas_only.sh",
		events: []string{`delta "streamed "`, `delta "reply"`},
		text:   "streamed reply",
	}, {
		name:    "error event fails the turn with its message; later events ignored",
		script:  "error.sh",
		events:  []string{`delta "partial"`},
		text:    "partial",
		userErr: "quota exceeded, try again tomorrow",
	}, {
		name:     "malformed lines are counted, never fatal",
		script:   "malformed.sh",
		events:   []string{`delta "still "`, `delta "fine"`},
		text:     "still fine",
		malforms: 5,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, logs := newRunner(t, config.Exec{Command: script(tt.script)})
			rec := newRecorder()
			o := await(t, start(t.Context(), r, "ping", rec))
			if got := rec.Events(); !slices.Equal(got, tt.events) {
				t.Errorf("events:\n got %q\nwant %q", got, tt.events)
			}
			if o.res.Text != tt.text {
				t.Errorf("text = %q, want %q", o.res.Text, tt.text)
			}
			if tt.userErr == "" {
				if o.err != nil {
					t.Fatalf("err = %v", o.err)
				}
			} else if u, ok := runner.AsUserError(o.err); !ok || u.Message != tt.userErr {
				t.Fatalf("err = %v, want user error %q", o.err, tt.userErr)
			}
			if got := r.Malformed(); got != tt.malforms {
				t.Errorf("Malformed() = %d, want %d; log:\n%s", got, tt.malforms, logs)
			}
			if tt.malforms > 0 && !strings.Contains(logs.String(), "malformed output line") {
				t.Errorf("malformed lines not logged:\n%s", logs)
			}
		})
	}
}

func TestEnvironmentAndWorkdir(t *testing.T) {
	t.Setenv("GATEWAY_SERVER__TOKEN", "s3cret") // the gateway's own variables stay out
	t.Setenv("TURNGUARD_RUN_ID", "spoofed")     // the turn's variables are the runner's
	dir := t.TempDir()
	r, _ := newRunner(t, config.Exec{
		Command: mustAbs(t, script("env.sh")),
		Env:     map[string]string{"AGENT_GREETING": "hi"},
		Workdir: dir,
	})
	o := await(t, start(t.Context(), r, "", runner.Nop{}))
	if o.err != nil {
		t.Fatal(o.err)
	}
	want := "run-1|sess-1|ws|hi|unset|" + mustEval(t, dir)
	if o.res.Text != want {
		t.Errorf("text = %q, want %q", o.res.Text, want)
	}
}

func TestExitWithoutFinal(t *testing.T) {
	r, logs := newRunner(t, config.Exec{Command: script("exit_no_final.sh")})
	o := await(t, start(t.Context(), r, "", runner.Nop{}))
	var ee *exec.ExitError
	if !errors.As(o.err, &ee) {
		t.Fatalf("err = %v, want *ExitError", o.err)
	}
	if ee.Status != "exit status 3" {
		t.Errorf("Status = %q", ee.Status)
	}
	var want []string
	for i := 3; i <= 12; i++ {
		want = append(want, fmt.Sprintf("stderr line %d", i))
	}
	if !slices.Equal(ee.Stderr, want) {
		t.Errorf("Stderr = %q, want the last 10 lines", ee.Stderr)
	}
	// stderr may hold secrets: it is operator detail (the field, the log),
	// never in the message the user may see.
	if got := o.err.Error(); got != "exec: the agent exited (exit status 3) without a final answer" {
		t.Errorf("error message = %q, want the status and no stderr", got)
	}
	if _, ok := runner.AsUserError(o.err); ok {
		t.Errorf("an exit without a final answer is a user error: %v", o.err)
	}
	if !strings.Contains(logs.String(), `msg="exec: agent exited without a final answer" run_id=run-1 status="exit status 3" stderr_tail="[stderr line 3`) {
		t.Errorf("the stderr tail is not in the log:\n%s", logs)
	}
	if o.res.Text != "half an answer" {
		t.Errorf("partial text = %q", o.res.Text)
	}
	if !strings.Contains(logs.String(), `msg="exec: agent stderr" run_id=run-1 line="stderr line 1"`) {
		t.Errorf("stderr not logged with the run id:\n%s", logs)
	}
}

func TestAbort(t *testing.T) {
	tests := []struct {
		name      string
		script    string
		text      string
		minTime   time.Duration // Run may not return before this
		killedLog bool          // SIGKILL needed
		grace     time.Duration
	}{
		{"child ignoring SIGTERM is killed after the grace", "ignore_term.sh", "working", grace, true, grace},
		// A generous grace: the child exits on SIGTERM long before it, so the
		// test does not depend on how fast a loaded machine runs the trap.
		{"child exiting on SIGTERM", "graceful_term.sh", "working (stopped)", 0, false, 10 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, logs := newRunnerGrace(t, config.Exec{Command: script(tt.script)}, tt.grace)
			rec := newRecorder()
			ctx, cancel := context.WithCancel(t.Context())
			ch := start(ctx, r, "", rec)
			rec.WaitFor(t, `delta "working"`)
			cancel()
			o := await(t, ch)
			if !errors.Is(o.err, context.Canceled) {
				t.Errorf("err = %v, want context.Canceled", o.err)
			}
			if o.res.Text != tt.text {
				t.Errorf("partial text = %q, want %q", o.res.Text, tt.text)
			}
			if o.dur < tt.minTime {
				t.Errorf("returned after %v, before the grace %v", o.dur, tt.minTime)
			}
			if got := strings.Contains(logs.String(), "sending SIGKILL"); got != tt.killedLog {
				t.Errorf("SIGKILL sent = %v, want %v; log:\n%s", got, tt.killedLog, logs)
			}
		})
	}
}

func TestGrandchildKilledWithGroup(t *testing.T) {
	tests := []struct {
		name   string
		script string
		abort  bool
	}{
		{"on abort", "grandchild.sh", true},
		{"when the agent exits leaving it behind", "grandchild_exit.sh", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pidfile := filepath.Join(t.TempDir(), "pid")
			r, _ := newRunner(t, config.Exec{Command: script(tt.script), Env: map[string]string{"PIDFILE": pidfile}})
			rec := newRecorder()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			ch := start(ctx, r, "", rec)
			if tt.abort {
				rec.WaitFor(t, "heartbeat")
				cancel()
			}
			o := await(t, ch)
			if tt.abort && !errors.Is(o.err, context.Canceled) {
				t.Errorf("err = %v", o.err)
			}
			if !tt.abort && (o.err != nil || o.res.Text != "done") {
				t.Errorf("Run = %q, %v; want done", o.res.Text, o.err)
			}
			if o.dur > time.Second {
				// The grandchild holds stdout; only the group kill frees it early.
				t.Errorf("Run took %v: the grandchild kept it waiting", o.dur)
			}
			b, err := os.ReadFile(pidfile)
			if err != nil {
				t.Fatal(err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			waitGone(t, pid)
		})
	}
}

// waitGone fails unless process pid is dead (gone or a zombie) within 5s.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			// "pid (comm) S …": a zombie is dead, waiting for its reaper.
			if i := bytes.LastIndexByte(st, ')'); i > 0 && bytes.HasPrefix(st[i+1:], []byte(" Z")) {
				return
			}
		}
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("grandchild %d still alive after the run", pid)
		}
		time.Sleep(10 * time.Millisecond) // real time: SIGKILL delivery is asynchronous
	}
}

func TestStoppedWhenLingeringAfterFinal(t *testing.T) {
	r, logs := newRunner(t, config.Exec{Command: script("linger.sh")})
	o := await(t, start(t.Context(), r, "", runner.Nop{}))
	if o.err != nil || o.res.Text != "answered" {
		t.Fatalf("Run = %q, %v", o.res.Text, o.err)
	}
	if o.dur < grace {
		t.Errorf("stopped after %v, before the grace %v", o.dur, grace)
	}
	if !strings.Contains(logs.String(), "still running after its final answer") {
		t.Errorf("log:\n%s", logs)
	}
}

func TestClaudeStreamJSON(t *testing.T) {
	tests := []struct {
		fixture string
		events  []string
		text    string
		userErr string
	}{{
		fixture: "simple.jsonl",
		events:  []string{`delta "2 + 2 = 4."`},
		text:    "2 + 2 = 4.",
	}, {
		fixture: "tools.jsonl",
		events: []string{
			`delta "I'll look at the repository."`,
			"start tool Bash", "done tool Bash",
			"start tool Read", "start tool Read", "done tool Read", "done tool Read",
			`delta "\n\nThe project is a small Go program: main.go and util.go."`,
		},
		text: "The project is a small Go program: main.go and util.go.",
	}, {
		fixture: "partial.jsonl",
		events: []string{
			`delta "Let me "`, `delta "check."`,
			"start tool Glob", "done tool Glob",
			`delta "\n\nOne Go "`, `delta "file."`,
		},
		text: "One Go file.",
	}, {
		fixture: "subagent.jsonl",
		events: []string{
			"start tool Task", "heartbeat", "heartbeat", "heartbeat", "heartbeat", "done tool Task",
			`delta "There is one TODO, in main.go line 12."`,
		},
		text: "There is one TODO, in main.go line 12.",
	}, {
		fixture: "error.jsonl",
		events:  []string{"start tool Bash", "done tool Bash"},
		userErr: "The agent failed (error_max_turns).",
	}}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			r, logs := newRunner(t, config.Exec{Command: "cat", Args: []string{filepath.Join("testdata", "claude", tt.fixture)}, Format: exec.FormatClaude})
			rec := newRecorder()
			o := await(t, start(t.Context(), r, "what is in the repo?", rec))
			if got := rec.Events(); !slices.Equal(got, tt.events) {
				t.Errorf("events:\n got %q\nwant %q", got, tt.events)
			}
			if o.res.Text != tt.text {
				t.Errorf("text = %q, want %q", o.res.Text, tt.text)
			}
			if tt.userErr == "" && o.err != nil {
				t.Errorf("err = %v", o.err)
			}
			if tt.userErr != "" {
				if u, ok := runner.AsUserError(o.err); !ok || u.Message != tt.userErr {
					t.Errorf("err = %v, want user error %q", o.err, tt.userErr)
				}
			}
			if r.Malformed() != 0 {
				t.Errorf("Malformed() = %d; log:\n%s", r.Malformed(), logs)
			}
		})
	}
}

func TestNewValidation(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plain.txt")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  config.Exec
		want string // substring of the error; "" = valid
	}{
		{"minimal", config.Exec{Command: "cat"}, ""},
		{"claude format", config.Exec{Command: "cat", Format: "claude-stream-json"}, ""},
		{"relative to workdir", config.Exec{Command: "./all_events.sh", Workdir: "testdata"}, ""},
		{"no command", config.Exec{}, "agents.exec.command: required"},
		{"not in PATH", config.Exec{Command: "no-such-agent-xyz"}, `agents.exec.command: exec: "no-such-agent-xyz": executable file not found`},
		{"missing file", config.Exec{Command: "./nope.sh"}, "agents.exec.command:"},
		{"not executable", config.Exec{Command: file}, "is not an executable file"},
		{"unknown format", config.Exec{Command: "cat", Format: "xml"}, `agents.exec.format: "xml" is not "jsonl" or "claude-stream-json"`},
		{"workdir missing", config.Exec{Command: "cat", Workdir: "/no/such/dir"}, "agents.exec.workdir:"},
		{"workdir is a file", config.Exec{Command: "cat", Workdir: file}, "is not a directory"},
		{"bad env key", config.Exec{Command: "cat", Env: map[string]string{"A=B": "x"}}, `agents.exec.env: "A=B"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := exec.New(tt.cfg, grace, nil)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("New error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestCancelledBeforeStart(t *testing.T) {
	r, _ := newRunner(t, config.Exec{Command: script("all_events.sh")})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	rec := newRecorder()
	res, err := r.Run(ctx, runner.Turn{RunID: "r"}, rec)
	if !errors.Is(err, context.Canceled) || res.Text != "" || len(rec.Events()) != 0 {
		t.Fatalf("Run = %q, %v, events %q", res.Text, err, rec.Events())
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustEval(t *testing.T, p string) string {
	t.Helper()
	e, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
