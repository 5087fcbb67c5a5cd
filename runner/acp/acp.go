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
package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
	sessions     SessionStore // nil: sessions do not outlive the agent process

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
			return runner.Result{}, &runner.UserError{Message: "The agent could not be started. Try again later."}
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

// open gives the fresh session s of conversation conv (of session key key)
// its agent session. The one the store recorded for the key is restored
// when it is this conversation's — recorded for conv, or for another
// SessionID while the conversation continues (its history is not empty:
// the engine's SessionIDs change with a gateway restart): session/resume
// when the agent advertises sessionCapabilities.resume, else session/load
// when it advertises loadSession (the history that session/load replays as
// session/update notifications reaches no turn — none runs on the session
// yet — so it is dropped). Otherwise, or when restoring fails, session/new
// opens a new one, which the store records; lost then reports that the
// conversation had a session the agent could not restore. The session of
// the key's previous conversation (after /new, a new SessionID with no
// history: gone, or the one the store recorded for another conversation)
// is closed with session/close when the agent advertises
// sessionCapabilities.close.
func (r *Runner) open(ctx context.Context, log *slog.Logger, key, conv string, continues bool, ag *agent, s *session, gone *session) (lost bool, err error) {
	prevConv, prevID := r.recorded(ctx, log, key)
	ours := prevID != "" && (prevConv == conv || continues)
	if gone != nil && gone.ag == ag && gone.id != "" && !continues {
		r.closeSession(ctx, ag, gone.id, log)
	}
	if prevID != "" && !ours && (gone == nil || gone.id != prevID) {
		r.closeSession(ctx, ag, prevID, log)
	}
	if ours {
		if method := ag.caps.restore(); method == "" {
			log.Info("acp: the agent cannot load or resume sessions; the conversation gets a new one", "session_id", cut(prevID, 200))
		} else {
			var restored json.RawMessage
			err := ag.call(ctx, r.startTimeout, method, map[string]any{"sessionId": prevID, "cwd": r.dir, "mcpServers": []any{}}, &restored)
			if err == nil && r.claim(ag, s, prevID) {
				ag.keepModes(s.id, restored)
				ag.keepConfigOptions(s.id, restored)
				log.Info("acp: session restored", "method", method, "session_id", s.id, "conversation", conv, "agent_process", ag.n)
				if prevConv != conv {
					r.record(ctx, log, key, conv, s.id)
				}
				return false, nil
			}
			if err == nil {
				err = errors.New("acp: the session is another live conversation's")
			}
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			if ag.isDead() {
				return false, &runner.UserError{Message: ag.death}
			}
			var te *timeoutError
			if errors.As(err, &te) {
				r.retire(ag, method+" unanswered")
				return false, startFailure(method, err)
			}
			log.Warn("acp: the agent could not restore the conversation's session; it gets a new one",
				"method", method, "session_id", cut(prevID, 200), "err", err)
		}
		lost = true
	}

	var res struct {
		SessionID string `json:"sessionId"`
	}
	var answer json.RawMessage
	err = ag.call(ctx, r.startTimeout, "session/new", map[string]any{"cwd": r.dir, "mcpServers": []any{}}, &answer)
	if err == nil {
		err = json.Unmarshal(answer, &res)
	}
	if retry, uerr := r.signIn(ctx, log, ag, "session/new", err); uerr != nil {
		return false, uerr
	} else if retry {
		err = ag.call(ctx, r.startTimeout, "session/new", map[string]any{"cwd": r.dir, "mcpServers": []any{}}, &answer)
		if err == nil {
			err = json.Unmarshal(answer, &res)
		}
		if ag.authRequired(err) {
			return false, r.signInNeeded(log, ag, "session/new", errors.New("auth_required again after authenticate"))
		}
	}
	if err == nil && res.SessionID == "" {
		err = errors.New("acp: session/new answered no sessionId")
	}
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		log.Warn("acp: session/new failed", "err", err, "agent_process", ag.n)
		var te *timeoutError
		if errors.As(err, &te) {
			r.retire(ag, "session/new unanswered")
		}
		if ag.isDead() {
			return false, &runner.UserError{Message: ag.death}
		}
		return false, startFailure("session/new", err)
	}
	if !r.claim(ag, s, res.SessionID) {
		log.Error("acp: session/new answered the sessionId of another live conversation; turn refused",
			"session_id", cut(res.SessionID, 200), "agent_process", ag.n)
		return false, &runner.UserError{Message: "The agent answered with another conversation's session, so your message was not sent to it. Try again later."}
	}
	ag.keepModes(s.id, answer)
	ag.keepConfigOptions(s.id, answer)
	log.Info("acp: session opened", "session_id", s.id, "conversation", conv, "agent_process", ag.n)
	r.record(ctx, log, key, conv, s.id)
	return lost, nil
}

// claim gives s the agent's session id, unless another live conversation
// on ag already has it (an agent that answers with it again would mix the
// two).
func (r *Runner) claim(ag *agent, s *session, id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tab.held(ag, id) {
		return false
	}
	s.id = id
	return true
}

// recorded returns the conversation and agent session id the store
// recorded for session key key ("", "" without a store, or when reading
// fails: the conversation then gets a new session).
func (r *Runner) recorded(ctx context.Context, log *slog.Logger, key string) (conv, id string) {
	if r.sessions == nil {
		return "", ""
	}
	ctx, cancel := context.WithTimeout(ctx, r.startTimeout)
	defer cancel()
	conv, id, err := r.sessions.AgentSession(ctx, key)
	if err != nil {
		log.Warn("acp: the conversation's agent session could not be read; it gets a new one", "err", err)
		return "", ""
	}
	return conv, id
}

// record stores id as the agent session of conversation conv of key; a
// failure is logged (the conversation keeps its session while the agent
// runs, and gets a new one after a restart).
func (r *Runner) record(ctx context.Context, log *slog.Logger, key, conv, id string) {
	if r.sessions == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.startTimeout)
	defer cancel()
	if err := r.sessions.SetAgentSession(ctx, key, conv, id); err != nil {
		log.Warn("acp: the conversation's agent session was not recorded", "err", err)
	}
}

// closeSession sends session/close for id, when the agent advertises it
// and no live conversation on ag has the session; the answer is awaited
// (bounded by the start-up timeout) so that the old session's work stops
// before the new one starts, and a failure is only logged.
func (r *Runner) closeSession(ctx context.Context, ag *agent, id string, log *slog.Logger) {
	if !ag.caps.close {
		return
	}
	r.mu.Lock()
	held := r.tab.held(ag, id)
	r.mu.Unlock()
	if held {
		return
	}
	err := ag.call(ctx, r.startTimeout, "session/close", map[string]string{"sessionId": id}, nil)
	ag.meta.forget(id)
	log.Info("acp: old session closed (a new conversation replaced it)", "session_id", cut(id, 200), "err", err)
}

// prompt runs session/prompt on session id and serves the turn's
// permission requests until the agent answers, dies or ignores a cancel.
func (r *Runner) prompt(ctx context.Context, turn runner.Turn, cb runner.Callbacks, ag *agent, s *session, log *slog.Logger) (runner.Result, error) {
	id := s.id
	ts := newTurnState(turn.RunID, cb)
	// ctx ends with the turn (ts.end) or the agent: the fs requests of the
	// turn's session stop then.
	ts.ctx, ts.cancel = context.WithCancel(ag.ctx)
	ts.begin(ag.name) // before the prompt is sent: its updates may come at once
	ag.mu.Lock()
	ag.turns[id] = ts
	ag.mu.Unlock()
	askCtx, cancelAsks := context.WithCancel(ctx)
	var asks sync.WaitGroup
	defer func() {
		ts.end()
		if n := ts.ignored(); n > 0 {
			log.Warn("acp: tool calls over the limit of open ones not followed", "count", n, "limit", maxOpenTools)
		}
		ag.mu.Lock()
		if ag.turns[id] == ts {
			delete(ag.turns, id)
		}
		ag.mu.Unlock()
		cancelAsks()
		asks.Wait()
		for {
			select {
			case a := <-ts.perms:
				_ = ag.c.reply(a.id, a.cancelled(), nil)
				a.done()
			default:
				return
			}
		}
	}()

	params := map[string]any{"sessionId": id, "prompt": []map[string]string{{"type": "text", "text": turn.Message}}}
	reqID, respC, err := ag.c.request("session/prompt", params)
	if err != nil {
		log.Warn("acp: session/prompt not sent", "err", err)
		if ag.isDead() {
			return runner.Result{}, &runner.UserError{Message: ag.death}
		}
		r.retire(ag, "cannot write to it")
		return runner.Result{}, &runner.UserError{Message: "The agent could not be reached. Send your message again to start it anew."}
	}
	defer ag.c.forget(reqID)

	var (
		ctxDone  = ctx.Done()
		giveUp   <-chan time.Time
		canceled bool
	)
	for {
		select {
		case resp := <-respC:
			text, _ := ts.end()
			return r.finish(ctx, ag, resp, text, log)
		case <-ag.dead:
			select {
			case resp := <-respC: // answered before it died
				text, _ := ts.end()
				return r.finish(ctx, ag, resp, text, log)
			default:
			}
			text, _ := ts.end()
			if canceled {
				return runner.Result{Text: text}, ctx.Err()
			}
			log.Warn("acp: the agent stopped during the turn", "reason", ag.death, "agent_process", ag.n)
			return runner.Result{Text: text}, &runner.UserError{Message: ag.death}
		case a := <-ts.perms:
			asks.Go(func() { r.answer(askCtx, turn, ag, s, a, log) })
		case <-ctxDone:
			ctxDone, canceled = nil, true
			log.Info("acp: turn aborted; sending session/cancel", "session_id", id, "wait", r.cancelWait)
			if err := ag.c.notify("session/cancel", map[string]string{"sessionId": id}); err != nil {
				log.Warn("acp: session/cancel not sent", "err", err)
			}
			t := time.NewTimer(r.cancelWait)
			defer t.Stop()
			giveUp = t.C
		case <-giveUp:
			log.Warn("acp: the agent did not answer session/cancel; stopping it", "after", r.cancelWait, "agent_process", ag.n)
			ag.abandon(reqID, "session/prompt")
			r.retire(ag, "ignored session/cancel")
			text, _ := ts.end()
			return runner.Result{Text: text}, ctx.Err()
		}
	}
}

// finish turns the prompt's answer into the turn's result.
func (r *Runner) finish(ctx context.Context, ag *agent, resp response, text string, log *slog.Logger) (runner.Result, error) {
	res := runner.Result{Text: text}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if resp.err != nil {
		if ag.authRequired(resp.err) {
			return res, &authNeeded{err: resp.err} // promptSigned signs in
		}
		var re *rpcError
		if errors.As(resp.err, &re) {
			log.Warn("acp: session/prompt failed", "code", re.Code, "message", cut(re.Message, 500))
			return res, &runner.UserError{Message: "The agent could not answer: " + cut(oneLine(re.Message), 300)}
		}
		if ag.isDead() {
			log.Warn("acp: the agent stopped during the turn", "reason", ag.death, "agent_process", ag.n)
			return res, &runner.UserError{Message: ag.death}
		}
		return res, fmt.Errorf("acp: session/prompt: %w", resp.err)
	}
	var out struct {
		StopReason string `json:"stopReason"`
	}
	if err := json.Unmarshal(resp.result, &out); err != nil {
		log.Warn("acp: session/prompt answer unreadable", "err", err)
		return res, &runner.UserError{Message: "The agent's answer could not be read."}
	}
	if msg := stopMessage(out.StopReason); msg != "" {
		log.Info("acp: turn ended early", "stop_reason", cut(out.StopReason, 50))
		return res, &runner.UserError{Message: msg}
	}
	if strings.TrimSpace(text) == "" {
		// An agent may just stop, say after the person denied its tool: the
		// person reads a sentence, not an empty reply.
		log.Info("acp: turn ended without any text")
		res.Text = messages.AgentNoReply
	}
	return res, nil
}

// stopMessage words a stopReason other than end_turn for the user ("" for
// end_turn).
func stopMessage(reason string) string {
	switch reason {
	case "end_turn":
		return ""
	case "max_tokens":
		return "The agent stopped: it reached its output limit (max tokens) before finishing."
	case "max_turn_requests":
		return "The agent stopped: it reached its limit of model requests for one turn."
	case "refusal":
		return "The agent refused to continue with this request."
	case "cancelled":
		return "The agent cancelled the turn."
	}
	return fmt.Sprintf("The agent stopped early (%s).", cut(oneLine(reason), 50))
}

// answer asks the person a permission request of the agent and replies
// with the chosen option; a stopped turn (ctx done) or a request without
// options is answered cancelled. "Always" answers are the conversation's,
// never the shared agent process's (see grants): a request the
// conversation answered "always" before is answered at once, and the
// agent only ever gets a "once" option.
func (r *Runner) answer(ctx context.Context, turn runner.Turn, ag *agent, s *session, a permissionAsk, log *slog.Logger) {
	defer a.done()
	if a.elicit != nil {
		r.elicit(ctx, turn, ag, a, log)
		return
	}
	if len(a.req.Options) == 0 {
		_ = ag.c.reply(a.id, permissionCancelled(), nil)
		return
	}
	q := question(a.req)
	if opt, ok := s.grants.recall(q); ok {
		log.Info("acp: permission answered by the conversation's earlier \"always\" answer", "tool", q.Tool, "option", opt)
		if err := ag.c.reply(a.id, permissionAnswer(runner.Answer{OptionID: opt}, nil), nil); err != nil {
			log.Warn("acp: permission answer not sent", "err", err)
		}
		return
	}
	q.Options = scopedOptions(q.Options)
	if len(q.Options) == 0 {
		log.Warn("acp: permission request offers only \"always\" options, which would hold for every conversation; answered cancelled", "tool", q.Tool)
		_ = ag.c.reply(a.id, permissionCancelled(), nil)
		return
	}
	ans, err := turn.Ask(ctx, q)
	log.Info("acp: permission answered", "tool", q.Tool, "outcome", ans.Outcome, "option", ans.OptionID, "err", err)
	if err == nil {
		ans.OptionID = s.grants.settle(q, ans.OptionID)
	}
	if err := ag.c.reply(a.id, permissionAnswer(ans, err), nil); err != nil {
		log.Warn("acp: permission answer not sent", "err", err)
	}
}

// elicit asks the person the agent's elicitation/create, when buttons can
// answer it (elicit.go), and sends the agent the answer.
func (r *Runner) elicit(ctx context.Context, turn runner.Turn, ag *agent, a permissionAsk, log *slog.Logger) {
	ea, err := elicitQuestion(*a.elicit)
	if err != nil {
		log.Info("acp: elicitation declined: it cannot be asked in chat", "why", err.Error())
		if err := ag.c.reply(a.id, elicitResponse{Action: "decline"}, nil); err != nil {
			log.Warn("acp: elicitation answer not sent", "err", err)
		}
		return
	}
	ans, err := turn.Ask(ctx, ea.q)
	res := ea.answer(ans, err)
	log.Info("acp: elicitation answered", "action", res.Action, "outcome", ans.Outcome, "option", ans.OptionID, "err", err)
	if err := ag.c.reply(a.id, res, nil); err != nil {
		log.Warn("acp: elicitation answer not sent", "err", err)
	}
}

// agentFor returns the agent new turns go to, starting one when there is
// none (or it died, or is retiring), once it has answered initialize;
// waiting is called first when it has not answered yet.
func (r *Runner) agentFor(ctx context.Context, log *slog.Logger, waiting func()) (*agent, error) {
	r.mu.Lock()
	if r.retired {
		r.mu.Unlock()
		return nil, &runner.UserError{Message: "The agent is being restarted. Send your message again."}
	}
	ag := r.cur
	if ag == nil || ag.isDead() || r.retiring[ag] {
		r.started++
		var err error
		ag, err = r.start(r.started)
		if err != nil {
			r.mu.Unlock()
			log.Error("acp: agent not started", "err", err)
			return nil, &runner.UserError{Message: "The agent could not be started. Try again later."}
		}
		r.cur, r.curUsed = ag, time.Now()
		go r.initialize(ag)
	}
	r.mu.Unlock()
	select {
	case <-ag.ready:
	default:
		waiting()
		select {
		case <-ag.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if ag.startErr != nil {
		return nil, ag.startErr
	}
	return ag, nil
}

// initialize sends initialize, bounded by the start-up timeout, and closes
// ag.ready; an agent that fails it is stopped.
func (r *Runner) initialize(ag *agent) {
	defer close(ag.ready)
	var res struct {
		ProtocolVersion int `json:"protocolVersion"`
		AgentInfo       *struct {
			Name  string `json:"name"`
			Title string `json:"title"`
		} `json:"agentInfo"`
		AgentCapabilities json.RawMessage `json:"agentCapabilities"`
		AuthMethods       json.RawMessage `json:"authMethods"`
	}
	params := map[string]any{
		"protocolVersion": ProtocolVersion,
		"clientCapabilities": map[string]any{
			"fs":          map[string]bool{"readTextFile": true, "writeTextFile": true},
			"terminal":    true,
			"elicitation": map[string]any{"form": struct{}{}, "url": struct{}{}},
		},
		"clientInfo": map[string]string{"name": "turnguard", "title": "turnguard", "version": r.version},
	}
	err := ag.call(context.Background(), r.startTimeout, "initialize", params, &res)
	if err == nil && res.ProtocolVersion != ProtocolVersion {
		ag.log.Error("acp: the agent speaks another protocol version", "version", res.ProtocolVersion)
		ag.startErr = &runner.UserError{Message: fmt.Sprintf("The agent speaks ACP version %d; turnguard speaks version %d.", res.ProtocolVersion, ProtocolVersion)}
		ag.kill("The agent was stopped.")
		return
	}
	if err != nil {
		ag.log.Error("acp: initialize failed; stopping the agent", "err", err)
		ag.startErr = startFailure("initialize", err)
		ag.kill("The agent was stopped.")
		return
	}
	if i := res.AgentInfo; i != nil {
		if n := strings.TrimSpace(i.Name); n != "" {
			ag.name = cut(n, 100)
		}
	}
	ag.caps = parseCaps(res.AgentCapabilities)
	ag.authIDs = authMethods(res.AuthMethods)
	ag.log.Info("acp: agent initialized", "agent", ag.name, "load_session", ag.caps.load,
		"resume_session", ag.caps.resume, "close_session", ag.caps.close, "auth_methods", ag.authIDs)
}

// retire stops new turns from going to ag and stops it — now if no turn
// runs on it, else when the last one ends.
func (r *Runner) retire(ag *agent, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retireLocked(ag, why)
}

func (r *Runner) retireLocked(ag *agent, why string) {
	if r.running[ag] == 0 {
		delete(r.retiring, ag)
		ag.log.Info("acp: stopping agent", "reason", why)
		ag.kill("The agent was stopped. Send your message again to start it anew.")
		return
	}
	ag.log.Info("acp: agent retiring: stopped when its running turns end", "reason", why, "running", r.running[ag])
	r.retiring[ag] = true
}

// release ends a turn's use of s on ag.
func (r *Runner) release(ag *agent, s *session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	r.tab.release(s, now)
	if r.running[ag]--; r.running[ag] <= 0 {
		delete(r.running, ag)
		if r.retiring[ag] {
			r.retireLocked(ag, "its last turn ended")
		}
	}
	if ag == r.cur {
		r.curUsed = now
	}
	r.sweepLocked(now)
}

// sweep forgets idle sessions and stops an idle agent; it runs on a timer
// set for the next expiry.
func (r *Runner) sweep() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweepLocked(time.Now())
}

func (r *Runner) sweepLocked(now time.Time) {
	next := r.tab.expire(now)
	if ag := r.cur; ag != nil && !ag.isDead() && r.running[ag] == 0 && r.tab.uses(ag) == 0 {
		if at := r.curUsed.Add(r.idle); !now.Before(at) {
			ag.stop("idle")
			r.cur = nil
		} else if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	if !next.IsZero() {
		r.timer = time.AfterFunc(next.Sub(now), r.sweep)
	}
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
