// Package exec owns the runner that does each turn by running a configured
// command (a CLI agent) and reading its progress from its stdout, and the
// process-group handling (Process) that every runner starting commands uses.
//
// Per turn the command runs in its own process group, in agents.exec.workdir,
// with the user's message on stdin (then closed) and this environment: the
// gateway's own without its GATEWAY_* configuration variables (see
// Environ), then agents.exec.env, then TURNGUARD_RUN_ID,
// TURNGUARD_SESSION_KEY and TURNGUARD_CHANNEL describing the turn, and the
// run tag TURNGUARD_RUN (see Process). With agents.exec.permissions (jsonl
// only) stdin instead starts with the message as one JSON line,
// {"type":"message","text":"…"}, and stays open until the command exits:
// the answers to the agent's permission requests follow on it, one JSON line
// each (see permission.go), and TURNGUARD_PERMISSIONS=1 is set. Every
// stderr line goes to the log with the run id (never the environment), up to
// maxLoggedStderr lines per turn.
//
// Stdout is read line by line in one of two formats (agents.exec.format):
//
//   - "jsonl" (default): the turnguard event protocol, one JSON object per
//     line, documented in docs/runners.md:
//     {"type":"step_start","kind":"tool","name":"search"},
//     {"type":"step_complete","kind":"tool","name":"search"},
//     {"type":"delta","text":"…"}, {"type":"heartbeat"},
//     {"type":"pause","reason":"…"}, {"type":"resume"},
//     {"type":"final","text":"…"}, {"type":"error","message":"…"},
//     {"type":"permission","id":"…","title":"…",…} (agents.exec.permissions).
//   - "claude-stream-json": the lines of the Claude Code CLI's
//     --output-format stream-json (see claude.go for the mapping). Claude
//     Code's permission prompts are not relayed: the ACP runner with
//     claude-code-acp does that.
//
// A line that cannot be understood is logged and counted (Malformed), never
// fatal; a line longer than maxLine (4 MiB) fails the turn with a
// *runner.UserError and stops the command at once. Per turn at most maxText
// bytes of streamed text are kept and streamed, and only the first lines of
// stderr, of malformed output and of permission requests are logged one by
// one (then one summary record with the count). The turn's answer is the final event's text (or, if it has none, the
// streamed deltas); an error event fails the turn with its message for the
// user (*runner.UserError). A command that exits without a final or error
// event fails the turn with an *ExitError naming the exit status; its last
// stderr lines are in the error's Stderr field and the log, never in its
// message (which the user may see).
//
// Abort: when ctx is cancelled the process group gets SIGTERM and, if the
// command has not exited abortGrace later, SIGKILL; Run then returns the text
// streamed so far and ctx.Err(). After a final or error event the command
// has abortGrace to exit on its own before it is stopped the same way. When
// the command exits, whatever is left of its process group is killed, and so
// is every process carrying the run's tag (RunTagEnv; also those that left
// the group with setsid). On Linux the group is led by a shim that kills it
// all when the gateway dies (see Process).
package exec

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/timeout"
)

// Output formats (agents.exec.format).
const (
	FormatJSONL  = "jsonl"
	FormatClaude = "claude-stream-json"
)

const (
	stderrKeep = 10 // stderr lines kept for an ExitError
	// maxLine is the longest stdout line accepted: a longer one fails the
	// turn (the agent is stopped) rather than being buffered. Longer stderr
	// lines are cut.
	maxLine = 4 << 20
	// maxText bounds the streamed text a turn keeps (and streams on): the
	// engine caps the reply at agents.defaults.maxReplyChars (at most
	// 1,000,000 characters, ≤ 4 MiB), so nothing past this could be shown.
	maxText = 4 << 20
	// Per turn, the first maxLoggedStderr stderr lines and the first
	// maxLoggedLines malformed or ignored stdout lines are logged one by
	// one; the rest are counted in one summary record when the turn ends.
	maxLoggedStderr = 100
	maxLoggedLines  = 20
	// maxLoggedField bounds the bytes of one agent-written value (a type, an
	// id, an error message) in a log record; longer is cut.
	maxLoggedField = 200
	// drainWait bounds how long output is still read after the command
	// exited (a process that escaped the group may hold the pipes open).
	drainWait = 2 * time.Second
)

// Runner runs a configured command per turn. It is safe for concurrent use
// by many turns.
type Runner struct {
	path   string
	args   []string
	env    []string // agents.exec.env as KEY=value, sorted
	dir    string
	format string
	perms  bool // agents.exec.permissions: stdin stays open for permission answers
	grace  time.Duration
	log    *slog.Logger
	inst   string            // gateway instance of the run tags; "" = this process's
	redact *strings.Replacer // agents.exec.env values (secrets) → [redacted], for stderr in the log

	malformed atomic.Uint64
	refused   atomic.Uint64 // permission requests refused without asking anyone
}

var _ runner.NoteTaker = (*Runner)(nil)

// TakesNotes reports whether the agent gets the gateway's notes (a budget
// warning) while it works: with agents.exec.permissions on, as a
// {"type":"note"} line on its stdin, which then stays open; without it
// stdin has ended and there is no way to tell the agent anything.
func (r *Runner) TakesNotes() bool { return r.perms }

// ExitError is the failure of a command that exited without a final or
// error event. Its message names the exit status only: stderr may hold
// anything (a traceback with an API key), so the last stderr lines are in
// Stderr, for the log and operators, never in Error() and never in a
// *runner.UserError.
type ExitError struct {
	Status string   // as the OS reports it: "exit status 3", "signal: killed"
	Stderr []string // its last stderr lines, oldest first (operator detail)
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("exec: the agent exited (%s) without a final answer", e.Status)
}

// OperatorDetail is the agent's last stderr lines, for the log and the
// operator's error detail (never for the user: it may hold a secret).
func (e *ExitError) OperatorDetail() string { return strings.Join(e.Stderr, "\n") }

// Option configures a Runner.
type Option func(*Runner)

// WithInstance sets the gateway instance id that starts every run tag (see
// InstanceID and Tag); without it the tags use a random id of this process.
func WithInstance(id string) Option { return func(r *Runner) { r.inst = id } }

// New validates cfg and returns a runner. abortGrace is how long an aborted
// command has between SIGTERM and SIGKILL (≤ 0: the default abortGraceSeconds,
// 10s); log receives stderr and protocol problems (nil: discard). The
// command must exist (looked up in PATH when it has no slash; a relative path
// is relative to workdir); workdir, if set, must be a directory.
func New(cfg config.Exec, abortGrace time.Duration, log *slog.Logger, opts ...Option) (*Runner, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if abortGrace <= 0 {
		abortGrace = timeout.DefaultAbortGraceSeconds * time.Second
	}
	r := &Runner{args: slices.Clone(cfg.Args), grace: abortGrace, log: log}
	r.redact = SecretRedactor(cfg.Env)
	for _, o := range opts {
		o(r)
	}

	switch f := strings.TrimSpace(cfg.Format); f {
	case "", FormatJSONL:
		r.format = FormatJSONL
	case FormatClaude:
		r.format = FormatClaude
	default:
		return nil, fmt.Errorf("agents.exec.format: %q is not %q or %q", cfg.Format, FormatJSONL, FormatClaude)
	}
	if cfg.Permissions && r.format != FormatJSONL {
		return nil, errors.New("agents.exec.permissions: works with format jsonl only; Claude Code's permission prompts need the ACP runner (claude-code-acp)")
	}
	r.perms = cfg.Permissions

	if cfg.Workdir != "" {
		dir, err := filepath.Abs(cfg.Workdir)
		if err != nil {
			return nil, fmt.Errorf("agents.exec.workdir: %w", err)
		}
		fi, err := os.Stat(dir)
		if err != nil {
			return nil, fmt.Errorf("agents.exec.workdir: %w", err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("agents.exec.workdir: %q is not a directory", cfg.Workdir)
		}
		r.dir = dir
	}

	cmd := strings.TrimSpace(cfg.Command)
	if cmd == "" {
		return nil, errors.New("agents.exec.command: required: the agent program to run, e.g. claude or ./agent.sh")
	}
	var err error
	if r.path, err = ResolveCommand("agents.exec", cmd, r.dir); err != nil {
		return nil, err
	}
	if r.env, err = EnvList("agents.exec", cfg.Env); err != nil {
		return nil, err
	}
	return r, nil
}

// Format returns the configured output format.
func (r *Runner) Format() string { return r.format }

// Malformed returns how many stdout lines, over all turns, could not be
// understood.
func (r *Runner) Malformed() uint64 { return r.malformed.Load() }

// Refused returns how many permission requests, over all turns, were
// refused without asking anyone (malformed, too many open, a repeated id,
// nobody to ask).
func (r *Runner) Refused() uint64 { return r.refused.Load() }

// Run does one turn. See the package documentation.
func (r *Runner) Run(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
	if err := ctx.Err(); err != nil {
		return runner.Result{}, err
	}
	if cb == nil {
		cb = runner.Nop{}
	}
	log := r.log.With("run_id", turn.RunID)

	var pipes [3][2]*os.File // stdin, stdout, stderr: {read, write}
	closeAll := func() {
		for _, p := range pipes {
			for _, f := range p {
				if f != nil {
					f.Close()
				}
			}
		}
	}
	for i := range pipes {
		rd, wr, err := os.Pipe()
		if err != nil {
			closeAll()
			return runner.Result{}, fmt.Errorf("exec: pipe: %w", err)
		}
		pipes[i] = [2]*os.File{rd, wr}
	}
	stdinW, stdoutR, stderrR := pipes[0][1], pipes[1][0], pipes[2][0]

	cmd := osexec.Command(r.path, r.args...)
	cmd.Dir = r.dir
	cmd.Env = Environ(r.env...)
	cmd.Env = append(cmd.Env,
		"TURNGUARD_RUN_ID="+turn.RunID,
		"TURNGUARD_SESSION_KEY="+turn.SessionKey,
		"TURNGUARD_CHANNEL="+turn.Channel)
	if r.perms {
		cmd.Env = append(cmd.Env, "TURNGUARD_PERMISSIONS=1")
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pipes[0][0], pipes[1][1], pipes[2][1]
	p, err := StartTagged(cmd, Tag(r.inst, turn.RunID))
	// The child has its copies; keep only our ends.
	for _, f := range []*os.File{pipes[0][0], pipes[1][1], pipes[2][1]} {
		f.Close()
	}
	if err != nil {
		stdinW.Close()
		stdoutR.Close()
		stderrR.Close()
		return runner.Result{}, fmt.Errorf("exec: start %s: %w", r.path, err)
	}
	log.Debug("exec: agent started", "pid", p.Pid(), "command", r.path)

	// Stdin: the message, then the end of input. With permissions on, the
	// message as one JSON line instead, and stdin stays open for the
	// answers to permission requests (closed when the agent has exited).
	var wg sync.WaitGroup
	msgWritten := make(chan struct{})
	wg.Go(func() {
		defer close(msgWritten)
		if !r.perms {
			_, _ = io.WriteString(stdinW, turn.Message)
			stdinW.Close()
			return
		}
		line, _ := json.Marshal(struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}{"message", turn.Message})
		_, _ = stdinW.Write(append(line, '\n'))
	})
	st := newState(cb, log, r.format)
	// Open questions end with the turn: when it is stopped, when the agent
	// has answered (final or error) and when it has exited.
	askCtx, endAsks := context.WithCancel(ctx)
	defer endAsks()
	if r.perms {
		st.ask = newAsker(askCtx, turn, log, stdinW, msgWritten)
	}
	tail := &stderrTail{}
	stderrDone := make(chan struct{})
	stderrLines := 0 // written by the stderr goroutine, read after stderrDone
	go func() {
		defer close(stderrDone)
		readLines(stderrR, func(line []byte, tooLong bool) {
			s := r.redact.Replace(cut(string(line), 2000))
			if stderrLines++; stderrLines <= maxLoggedStderr {
				log.Info("exec: agent stderr", "line", s)
			}
			tail.add(s)
		})
	}()
	stdoutDone := make(chan struct{})
	go func() {
		defer close(stdoutDone)
		readLines(stdoutR, func(line []byte, tooLong bool) {
			if tooLong {
				st.tooLong()
				return
			}
			st.line(line)
		})
	}()

	// Supervise: abort on ctx, stop a command that lingers after its answer.
	var (
		aborted   bool
		terminal  = st.terminal
		lingerC   <-chan time.Time
		killC     <-chan time.Time
		termState string // why SIGTERM was sent, for the log
	)
	terminate := func(why string) {
		if killC != nil {
			return
		}
		termState = why
		log.Info("exec: stopping agent", "reason", why, "grace", r.grace)
		if err := p.Signal(syscall.SIGTERM); err != nil {
			log.Warn("exec: SIGTERM failed", "err", err)
		}
		killC = time.After(r.grace)
	}
	ctxDone := ctx.Done()
wait:
	for {
		select {
		case <-p.Done():
			break wait
		case <-ctxDone:
			ctxDone = nil
			aborted = true
			terminate("aborted")
		case <-terminal:
			terminal = nil
			endAsks()
			if st.lineTooLong { // set before terminal was closed
				terminate("output line too long")
			} else {
				lingerC = time.After(r.grace)
			}
		case <-lingerC:
			lingerC = nil
			terminate("still running after its final answer")
		case <-killC:
			killC = make(chan time.Time) // never again
			log.Warn("exec: agent ignored SIGTERM; sending SIGKILL", "after", termState)
			if err := p.Signal(syscall.SIGKILL); err != nil {
				log.Warn("exec: SIGKILL failed", "err", err)
			}
		}
	}

	// The command exited and its group was killed: read what is left.
	endAsks()
	drain := time.NewTimer(drainWait)
	for _, done := range []chan struct{}{stdoutDone, stderrDone} {
		select {
		case <-done:
		case <-drain.C:
			log.Warn("exec: output still open after the agent exited; closing it")
			stdoutR.Close()
			stderrR.Close()
			<-done
		}
	}
	drain.Stop()
	stdoutR.Close()
	stderrR.Close()
	stdinW.Close()
	wg.Wait()
	if st.ask != nil {
		st.ask.wait() // after stdout is read: no request comes any more
		r.refused.Add(uint64(st.ask.summarise()))
	}

	status := p.State().String()
	if n := st.malformedCount; n > 0 {
		r.malformed.Add(uint64(n))
		log.Warn("exec: malformed output lines", "count", n, "not_logged", max(0, n-maxLoggedLines))
	}
	if n := st.ignoredCount - maxLoggedLines; n > 0 {
		log.Debug("exec: more output lines ignored", "count", n)
	}
	if n := stderrLines - maxLoggedStderr; n > 0 {
		log.Warn("exec: agent stderr lines not logged (per-turn limit)", "count", n, "logged", maxLoggedStderr)
	}
	if st.textDropped > 0 {
		log.Warn("exec: streamed text over the limit dropped", "bytes", st.textDropped, "limit", maxText)
	}
	res := runner.Result{Text: st.reply()}
	switch {
	case aborted:
		log.Info("exec: agent stopped", "status", status)
		return res, ctx.Err()
	case st.errMsg != nil:
		log.Info("exec: agent reported an error", "status", status, "message", cut(*st.errMsg, maxLoggedField))
		return res, &runner.UserError{Message: *st.errMsg}
	case st.final != nil:
		if !p.State().Success() {
			log.Warn("exec: agent exited with an error after its final answer", "status", status)
		}
		return res, nil
	}
	ee := &ExitError{Status: status, Stderr: tail.lines()}
	log.Warn("exec: agent exited without a final answer", "status", status, "stderr_tail", ee.Stderr)
	return res, ee
}

// readLines calls fn for each line of rd (without its line ending; fn must
// not keep the slice). A line longer than maxLine is passed as soon as it
// is known to be too long — its first maxLine bytes, with tooLong set — and
// the rest of it is skipped, so memory stays bounded and a line without an
// end does not wedge the reader.
func readLines(rd io.Reader, fn func(line []byte, tooLong bool)) {
	br := bufio.NewReaderSize(rd, 64<<10)
	var buf []byte
	skipping := false // the rest of a line already passed as too long
	for {
		part, err := br.ReadSlice('\n')
		switch {
		case skipping:
		case len(buf)+len(part) > maxLine:
			buf = append(buf, part[:maxLine-len(buf)]...)
			fn(buf, true)
			skipping = true
		default:
			buf = append(buf, part...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if !skipping && len(buf) > 0 {
			fn(trimNL(buf), false)
		}
		buf, skipping = buf[:0], false
		if err != nil {
			return
		}
	}
}

func trimNL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.TrimSuffix(b, []byte("\r"))
}

// stderrTail keeps the last stderrKeep lines of stderr.
type stderrTail struct {
	mu  sync.Mutex
	buf []string
}

func (t *stderrTail) add(s string) {
	if strings.TrimSpace(s) == "" {
		return
	}
	s = cut(s, 500)
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.buf) == stderrKeep {
		t.buf = append(t.buf[:0], t.buf[1:]...)
	}
	t.buf = append(t.buf, s)
}

func (t *stderrTail) lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.buf)
}
