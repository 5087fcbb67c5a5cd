// Package acp owns the runner that drives an Agent Client Protocol (ACP)
// agent — Gemini CLI, Claude Code through claude-code-acp, Codex through
// codex-acp, or any other — over JSON-RPC 2.0 on the agent's stdio, one
// JSON message per line. It owns the agent process (started once, in its
// own process group, and shared by every conversation), the ACP session of
// each turnguard conversation, the mapping of the agent's session/update
// notifications onto runner.Callbacks, the agent's permission requests
// (asked through Turn.Ask) and the client's fs methods, which it serves in
// a sandbox: agents.acp.workdir.
//
// Process: started on the first turn (and again after it died or was
// stopped) with the gateway's environment less its GATEWAY_* variables,
// then agents.acp.env, in agents.acp.workdir; initialize (protocol version
// 1, clientInfo turnguard and the gateway's version, fs read and write,
// terminals (see terminal.go); the answer's agentCapabilities say which of session/load,
// session/resume and session/close the runner uses) must be answered within agents.acp.startTimeoutSeconds; an
// agent that refuses it never started, and the user is told so. Its stderr
// goes to the log (the first lines, secrets of agents.acp.env redacted),
// never to the user. On Linux it runs under the shim of runner/exec, so it
// dies with the gateway. A turn that waits for start-up — the process,
// initialize, its session/new — pauses the liveness clock meanwhile
// (Callbacks.Pause, resumed when the prompt is sent): start-up is bounded
// by startTimeoutSeconds alone, never by stepTimeoutSeconds.
//
// Sessions: one ACP session per conversation (Turn.SessionID): session/new
// (cwd = workdir, no MCP servers) on the conversation's first turn, reused
// for the next ones while the agent process runs and the session was used
// within agents.acp.idleSeconds; an agent process with no session left is
// stopped after that long. With a SessionStore (WithSessions; the gateway
// passes its store) the session id is recorded per session key, and after
// a gateway restart, an agent crash or an idle stop the conversation's
// session is restored — session/resume or session/load, whichever the
// agent advertises at initialize (the history session/load replays is
// dropped, never shown) — else the conversation gets a new session and
// the reply starts with messages.AgentContextLost, once. /new (a new
// SessionID) gives the conversation a new session, and the old one is
// closed with session/close where the agent advertises it.
//
// A turn is one session/prompt with the user's message. Its reply is the
// text of the agent_message_chunk updates (messages.AgentNoReply when a
// turn that ended normally had none). Steps: see turnState. The prompt's
// stopReason end_turn ends the turn normally; max_tokens,
// max_turn_requests, refusal and an unasked cancelled end it with a
// *runner.UserError in plain words (the text so far is kept in the Result).
//
// Permissions: the agent's session/request_permission is the person's
// question (Turn.Ask). Its "always" options are the conversation's, never
// the shared process's (see grants): the agent gets the "once" option of
// the same sense, and the runner answers the conversation's later requests
// for the same tool call itself.
//
// Terminals (terminal.go): the agent's terminal/* requests run commands in
// the workdir, bounded and killed with the turn. Sign-in (auth.go): an
// auth_required answer is met with authenticate and agents.acp.authMethod,
// else the person is told the operator must sign the agent in. A request
// the runner gives up on is followed by $/cancel_request
// (cancelrequest.go).
//
// Abort: when ctx is cancelled the runner sends session/cancel and waits for
// the prompt's answer for half the abort grace; an agent that does not
// answer by then is stopped (SIGKILL of its group) — at once when no other
// turn runs on it, else once the last one ends, and no new turn goes to it
// meanwhile. Run returns the text streamed so far and ctx.Err().
//
// Failures never wedge a conversation: the agent crashing mid-turn ends
// the turn with "The agent stopped unexpectedly …"; an output line over 10
// MB stops the agent and ends its turns with a message saying so; lines
// that are not JSON-RPC are logged (the first 50 per process, with the run
// ids of its turns) and ignored. Each time the next message starts a fresh
// process and a fresh session.
//
// Bounds: what an agent makes the gateway do is bounded whatever it sends —
// fs requests (see sandbox; at most maxFSInflight at once holding at most
// maxFSBytes), open tool calls per turn (maxOpenTools, O(1) per update),
// permission options (checkOptions), and the log lines its input causes
// (the first maxLogged of each kind per process, the rest counted). A
// sessionId that session/new answers for a second live conversation fails
// that turn in words instead of mixing the two.
//
// Files: acp.go owns the Runner, its options and Run; lifecycle.go the
// agent process as turns see it (start, initialize, retire, idle sweep);
// restore.go a conversation's agent session (new, resume or load, record,
// close); prompt.go one turn's session/prompt and the agent's requests
// while it runs; agent.go and conn.go the process and its JSON-RPC wire;
// turn.go the session/update notifications of a turn.
package acp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
	execrunner "github.com/turnguard/turnguard/runner/exec"
	"github.com/turnguard/turnguard/timeout"
)

// ProtocolVersion is the ACP version the runner speaks.
const ProtocolVersion = 1

// Runner runs turns on an ACP agent. It is safe for concurrent use by many
// turns. Create it with New.
type Runner struct {
	path         string
	args         []string
	env          []string // agents.acp.env as KEY=value, sorted
	dir          string
	name         string // the command's base name: the "llm" step's name until the agent names itself
	version      string // the gateway's version: initialize's clientInfo.version
	idle         time.Duration
	startTimeout time.Duration
	authMethod   string // agents.acp.authMethod: see auth.go
	cancelWait   time.Duration
	log          *slog.Logger
	inst         string
	redact       *strings.Replacer
	box          *sandbox
	sessions     SessionStore        // nil: sessions do not outlive the agent process
	signInAlert  func(problem error) // nil: none; see WithSignInAlert
	signInState  atomic.Int32        // signInUnknown, signInOK or signInNeeded: what signInAlert was told last

	mu       sync.Mutex
	cur      *agent // the agent new turns go to; nil before the first
	curUsed  time.Time
	started  uint64
	tab      *table
	running  map[*agent]int
	retiring map[*agent]bool // agents that take no new turn and are stopped when their last one ends
	timer    *time.Timer
	retired  bool
}

var _ runner.Runner = (*Runner)(nil)

// Option configures a Runner.
type Option func(*Runner)

// WithInstance sets the gateway instance that starts the agent processes'
// run tags (see runner/exec.Tag).
func WithInstance(id string) Option { return func(r *Runner) { r.inst = id } }

// WithVersion sets the gateway's version, which initialize sends to the
// agent as clientInfo.version (ACP requires one; default "unknown").
func WithVersion(v string) Option {
	return func(r *Runner) {
		if v != "" {
			r.version = v
		}
	}
}

// WithSignInAlert tells alert when the agent's sign-in state changes: a
// non-nil error the first time a turn fails because the agent needs a
// sign-in turnguard cannot do (see auth.go; the error says why, never a
// secret), nil the first time a prompt succeeds after that — and on the
// runner's first successful prompt, so that a rebuilt runner closes what
// the previous one opened. alert must not block. The gateway raises an
// operator alert and shows the runner's problem on the dashboard with it.
func WithSignInAlert(alert func(problem error)) Option {
	return func(r *Runner) { r.signInAlert = alert }
}

// SessionStore keeps, per session key, the agent session of its current
// conversation across gateway restarts (store.AgentSessions implements it):
// AgentSession returns the conversation and agent session id recorded
// ("", "" when none); SetAgentSession replaces them.
type SessionStore interface {
	AgentSession(ctx context.Context, sessionKey string) (conversation, agentSessionID string, err error)
	SetAgentSession(ctx context.Context, sessionKey, conversation, agentSessionID string) error
}

// WithSessions keeps the conversations' agent sessions in st, so that a
// conversation resumes its agent session after a gateway restart, an agent
// crash or an idle stop (see the package documentation). Without it a
// conversation's session lives as long as its agent process.
func WithSessions(st SessionStore) Option { return func(r *Runner) { r.sessions = st } }

// New validates cfg and returns a runner; no process starts before the
// first turn. abortGrace is the turn's abort grace (≤ 0: the default): an
// aborted turn's agent has half of it to answer session/cancel. log
// receives the agent's stderr and protocol problems (nil: discard). The
// command must exist (looked up in PATH when it has no slash; a relative
// path is relative to workdir) and workdir, if set, must be a directory.
func New(cfg config.ACP, abortGrace time.Duration, log *slog.Logger, opts ...Option) (*Runner, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if abortGrace <= 0 {
		abortGrace = timeout.DefaultAbortGraceSeconds * time.Second
	}
	r := &Runner{
		args: slices.Clone(cfg.Args), log: log, cancelWait: abortGrace / 2,
		idle:         seconds(cfg.IdleSeconds, 1800),
		startTimeout: seconds(cfg.StartTimeoutSeconds, 60),
		authMethod:   cfg.AuthMethod,
		version:      "unknown",
		running:      map[*agent]int{}, retiring: map[*agent]bool{},
	}
	r.tab = newTable(r.idle)
	for _, o := range opts {
		o(r)
	}
	r.redact = execrunner.SecretRedactor(cfg.Env)

	dir := cfg.Workdir
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, fmt.Errorf("agents.acp.workdir: %w", err)
		}
		dir = wd
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("agents.acp.workdir: %w", err)
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("agents.acp.workdir: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("agents.acp.workdir: %q is not a directory", cfg.Workdir)
	}
	r.dir = dir
	if r.box, err = newSandbox(dir); err != nil {
		return nil, fmt.Errorf("agents.acp.workdir: %w", err)
	}

	cmd := strings.TrimSpace(cfg.Command)
	if cmd == "" {
		return nil, errors.New("agents.acp.command: required: the ACP agent to run, e.g. gemini or npx")
	}
	if r.path, err = execrunner.ResolveCommand("agents.acp", cmd, r.dir); err != nil {
		return nil, err
	}
	r.name = filepath.Base(r.path)
	if r.env, err = execrunner.EnvList("agents.acp", cfg.Env); err != nil {
		return nil, err
	}
	return r, nil
}

func seconds(v, def float64) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v * float64(time.Second))
}

// Run does one turn. See the package documentation.
func (r *Runner) Run(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
	if err := ctx.Err(); err != nil {
		return runner.Result{}, err
	}
	if cb == nil {
		cb = runner.Nop{}
	}
	log := r.log.With("run_id", turn.RunID)
	conv := turn.SessionID
	if conv == "" {
		conv = "key:" + turn.SessionKey
	}
	// Start-up — the process, initialize, session/new — is bounded by
	// startTimeoutSeconds, not by the liveness window: the liveness clock
	// is paused while the turn waits for it and resumes when the prompt is
	// sent, so a slow start is never blamed on the turn.
	paused := false
	starting := func() {
		if !paused {
			paused = true
			cb.Pause(messages.AgentStarting)
		}
	}
	started := func() {
		if paused {
			paused = false
			cb.Resume()
		}
	}
	defer started()
	var (
		ag    *agent
		s     *session
		fresh bool
		gone  *session
	)
	for attempt := 0; ; attempt++ {
		a, err := r.agentFor(ctx, log, starting)
		if err != nil {
			return runner.Result{}, err
		}
		r.mu.Lock()
		if r.cur == a && !a.isDead() {
			ag = a
			s, fresh, gone = r.tab.take(turn.SessionKey, conv, ag, time.Now())
			r.running[ag]++
		}
		r.mu.Unlock()
		if ag != nil {
			break
		}
		if attempt == 2 {
			return runner.Result{}, &runner.UserError{Message: messages.AgentCannotStart}
		}
	}
	defer r.release(ag, s)

	lost := false
	if fresh {
		starting()
		var err error
		// The engine's SessionID is its process's: after a gateway restart
		// the same conversation has another one, and its history (empty
		// after /new) says that it goes on.
		continues := len(turn.History) > 0
		if lost, err = r.open(ctx, log, turn.SessionKey, conv, continues, ag, s, gone); err != nil {
			return runner.Result{}, err
		}
	}
	started()
	if !lost {
		return r.promptSigned(ctx, turn, cb, ag, s, log)
	}
	// The person is told, once, before the reply: the new session is the
	// conversation's from now on.
	notice := messages.AgentContextLost + "\n\n"
	cb.Delta(notice)
	res, err := r.promptSigned(ctx, turn, cb, ag, s, log)
	res.Text = notice + res.Text
	return res, err
}

// Retire stops the runner taking turns (a rebuilt runner replaces it): its
// agent is stopped once the turns running on it end. Later turns fail with
// a *runner.UserError.
func (r *Runner) Retire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retired = true
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	if ag := r.cur; ag != nil && !ag.isDead() {
		r.retireLocked(ag, "runner replaced")
	}
}

// Close stops the agent processes at once (SIGKILL of their groups) and
// returns once they are reaped and their output is logged; turns on them
// end with "The agent was stopped." For shutdown and tests.
func (r *Runner) Close() error {
	r.mu.Lock()
	r.retired = true
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	var all []*agent
	for ag := range r.running {
		all = append(all, ag)
	}
	if r.cur != nil {
		all = append(all, r.cur)
	}
	r.mu.Unlock()
	for _, ag := range all {
		ag.kill("The agent was stopped.")
	}
	for _, ag := range all {
		<-ag.finished
	}
	return nil
}
