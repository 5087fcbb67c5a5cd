package acp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	osexec "os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
	execrunner "github.com/turnguard/turnguard/runner/exec"
)

// agent is one running agent process and its connection. It serves many
// ACP sessions; each running turn registers itself under its ACP session id
// so that the session/update notifications and session/request_permission
// requests of that session reach it.
type agent struct {
	n    uint64 // the runner's count of started processes, for the log
	p    *execrunner.Process
	c    *conn
	log  *slog.Logger
	name string // the agent's name (initialize's agentInfo, else the command's), the "llm" step's name

	ready    chan struct{} // closed when initialize is answered (or start-up failed)
	startErr error         // set before ready is closed
	caps     agentCaps     // set before ready is closed
	authIDs  []string      // initialize's authMethods ids (auth.go); set before ready is closed
	authMu   sync.Mutex    // one authenticate at a time

	dead      chan struct{} // closed when the connection is over: the process exited or was stopped
	finished  chan struct{} // closed when the process was reaped and its output read and logged
	deathOnce sync.Once
	death     string // why, for the user (set before dead is closed)

	mu    sync.Mutex
	turns map[string]*turnState // running turns by ACP session id

	box      *sandbox // the fs methods' sandbox
	garbage  lineLog
	unknown  lineLog
	refused  lineLog       // refused requests (fs, busy, malformed permission requests)
	inflight chan struct{} // bounds the agent's requests handled at once
	fsLimit  fsLimit       // bounds the fs requests served at once and their bytes
	terms    terminals     // the terminal methods' commands (terminal.go)
	meta     metas         // each session's commands and modes (commands.go, modes.go)

	ctx    context.Context // done when the agent is dead: its fs requests stop
	cancel context.CancelFunc
}

// agentCaps is what initialize's agentCapabilities advertise, as far as the
// runner uses it: session/load (loadSession), session/resume and
// session/close, session/list (sessionCapabilities.resume, .close and
// .list, present and not null).
type agentCaps struct{ load, resume, close, list bool }

// parseCaps reads agentCapabilities leniently: a malformed field counts as
// not advertised, as ACP's schema says (x-deserialize-default-on-error).
func parseCaps(raw json.RawMessage) agentCaps {
	var c agentCaps
	var top map[string]json.RawMessage
	if json.Unmarshal(raw, &top) != nil {
		return c
	}
	_ = json.Unmarshal(top["loadSession"], &c.load)
	var sc map[string]json.RawMessage
	if json.Unmarshal(top["sessionCapabilities"], &sc) == nil {
		present := func(v json.RawMessage) bool {
			var m map[string]any
			return json.Unmarshal(v, &m) == nil && m != nil
		}
		c.resume, c.close, c.list = present(sc["resume"]), present(sc["close"]), present(sc["list"])
	}
	return c
}

// restore is the method that restores a session the agent served before:
// session/resume (no history replayed) when advertised, else session/load;
// "" when neither is.
func (c agentCaps) restore() string {
	switch {
	case c.resume:
		return "session/resume"
	case c.load:
		return "session/load"
	}
	return ""
}

// Bounds of what one agent process may make the gateway do.
const (
	// maxLine is the longest line read from the agent; a longer one stops
	// the agent (the stream cannot be trusted after it).
	maxLine = 10 << 20
	// maxText bounds the reply text a turn keeps and streams: the engine
	// caps a reply at maxReplyChars (at most 10,000,000 characters), so
	// nothing much past this could be shown.
	maxText = 8 << 20
	// maxInflight bounds the agent's requests (fs, permission) handled at
	// once; more are answered with an error at once.
	maxInflight = 32
	// maxFSInflight bounds the fs requests served at once, and
	// maxFSBytes the bytes they may hold (a read counts maxRead, a write
	// its params); more are answered "busy" at once.
	maxFSInflight = 4
	maxFSBytes    = 16 << 20
	// maxLogged is how many garbage, ignored and stderr lines of one
	// process are logged one by one (the rest are counted).
	maxLogged = 50
	// drainWait bounds how long output is read after the agent exited (a
	// process that escaped the group may hold the pipe open).
	drainWait = 2 * time.Second
	// stopGrace is how long an agent stopped for being idle has between
	// SIGTERM and SIGKILL.
	stopGrace = 2 * time.Second
)

// start starts the agent command in its own process group and begins
// reading its output; initialize is sent by the caller.
func (r *Runner) start(n uint64) (*agent, error) {
	log := r.log.With("agent_process", n)
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("acp: pipe: %w", err)
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		stdinW.Close()
		return nil, fmt.Errorf("acp: pipe: %w", err)
	}
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		for _, f := range []*os.File{stdinR, stdinW, stdoutR, stdoutW} {
			f.Close()
		}
		return nil, fmt.Errorf("acp: pipe: %w", err)
	}
	cmd := osexec.Command(r.path, r.args...)
	cmd.Dir = r.dir
	cmd.Env = execrunner.Environ(r.env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, stdoutW, stderrW
	p, err := execrunner.StartTagged(cmd, execrunner.Tag(r.inst, fmt.Sprintf("acp-%d", n)))
	for _, f := range []*os.File{stdinR, stdoutW, stderrW} {
		f.Close()
	}
	if err != nil {
		stdinW.Close()
		stdoutR.Close()
		stderrR.Close()
		return nil, fmt.Errorf("acp: start %s: %w", r.path, err)
	}
	log.Info("acp: agent started", "pid", p.Pid(), "command", r.path)
	ag := &agent{
		n: n, p: p, log: log, name: r.name, box: r.box,
		ready: make(chan struct{}), dead: make(chan struct{}), finished: make(chan struct{}),
		turns:    map[string]*turnState{},
		garbage:  lineLog{limit: maxLogged},
		unknown:  lineLog{limit: maxLogged},
		refused:  lineLog{limit: maxLogged},
		inflight: make(chan struct{}, maxInflight),
		fsLimit:  fsLimit{max: maxFSInflight, maxBytes: maxFSBytes},
		terms:    terminals{dir: r.dir, env: r.env, inst: r.inst},
	}
	ag.ctx, ag.cancel = context.WithCancel(context.Background())
	ag.c = newConn(stdinW, func() {
		if !ag.isDead() {
			log.Error("acp: writing to the agent failed (it stopped reading its input?); stopping it", "run_ids", ag.runIDs())
			ag.kill("The agent stopped reading its input, so it was stopped. Send your message again to start it anew.")
		}
	})
	stderrDone := make(chan struct{})
	go func() {
		defer close(stderrDone)
		var lines lineLog
		lines.limit = maxLogged * 4
		readLines(stderrR, 64<<10, func(line []byte, tooLong bool) {
			if n := lines.n.Add(1); n <= int64(lines.limit) {
				log.Info("acp: agent stderr", "line", r.redact.Replace(cut(string(line), 2000)))
			}
		})
		// A too-long stderr line ends readLines: read the rest unlogged.
		_, _ = ioDiscard(stderrR)
		if n := lines.count() - int64(lines.limit); n > 0 {
			log.Warn("acp: agent stderr lines not logged (limit)", "count", n, "logged", lines.limit)
		}
	}()
	stdoutDone := make(chan struct{})
	go func() {
		defer close(stdoutDone)
		readLines(stdoutR, maxLine, func(line []byte, tooLong bool) {
			if tooLong {
				ag.log.Error("acp: agent output line over the limit; stopping the agent", "limit", maxLine,
					"run_ids", ag.runIDs())
				ag.kill(fmt.Sprintf("The agent sent a message larger than %d MB, so it was stopped. Send your message again to start it anew.", maxLine>>20))
				return
			}
			ag.line(line)
		})
	}()
	go func() {
		defer close(ag.finished)
		select {
		case <-stdoutDone:
			// The output ended first: whatever the process does now, it
			// cannot be talked to.
			ag.kill("")
			<-p.Done()
		case <-p.Done():
			select {
			case <-stdoutDone:
			case <-time.After(drainWait):
				log.Warn("acp: output still open after the agent exited; closing it")
				stdoutR.Close()
				<-stdoutDone
			}
		}
		stdoutR.Close()
		select {
		case <-stderrDone:
		case <-time.After(drainWait):
			stderrR.Close()
			<-stderrDone
		}
		stderrR.Close()
		stdinW.Close()
		status := p.State().String()
		log.Info("acp: agent process ended", "status", status, "garbage_lines", ag.garbage.count(),
			"refused_requests", ag.refused.count())
		ag.markDead(fmt.Sprintf("The agent stopped unexpectedly (%s). Send your message again to start it anew.", status))
	}()
	return ag, nil
}

func ioDiscard(f *os.File) (int64, error) {
	var buf [32 << 10]byte
	var n int64
	for {
		m, err := f.Read(buf[:])
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
}

// markDead ends the connection: pending requests fail, and every turn on it
// sees dead closed. The first reason given wins.
func (ag *agent) markDead(why string) {
	ag.deathOnce.Do(func() {
		ag.death = why
		close(ag.dead) // before the pending requests fail: their callers read death
		ag.cancel()
		ag.c.close()
	})
}

// kill stops the process group at once (SIGKILL). why, when not empty, is
// what the turns running on it tell the user.
func (ag *agent) kill(why string) {
	if why != "" {
		ag.markDead(why)
	}
	if err := ag.p.Signal(syscall.SIGKILL); err != nil {
		ag.log.Warn("acp: SIGKILL failed", "err", err)
	}
}

// stop ends an agent that is no longer needed: SIGTERM, then SIGKILL after
// stopGrace.
func (ag *agent) stop(reason string) {
	ag.log.Info("acp: stopping agent", "reason", reason)
	ag.markDead("The agent was stopped. Send your message again to start it anew.")
	_ = ag.p.Signal(syscall.SIGTERM)
	go func() {
		select {
		case <-ag.p.Done():
		case <-time.After(stopGrace):
			_ = ag.p.Signal(syscall.SIGKILL)
		}
	}()
}

func (ag *agent) isDead() bool {
	select {
	case <-ag.dead:
		return true
	default:
		return false
	}
}

// runIDs lists the runs of the turns on this agent, for log lines that
// belong to no single turn.
func (ag *agent) runIDs() []string {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	ids := make([]string, 0, len(ag.turns))
	for _, t := range ag.turns {
		ids = append(ids, t.runID)
	}
	return ids
}

func (ag *agent) turn(sessionID string) *turnState {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	return ag.turns[sessionID]
}

// line handles one line of the agent's stdout.
func (ag *agent) line(b []byte) {
	if len(bytes.TrimSpace(b)) == 0 {
		return
	}
	var m message
	if err := json.Unmarshal(b, &m); err != nil || m.JSONRPC != "2.0" {
		ag.garbage.log(ag.log, "acp: agent output is not a JSON-RPC message; ignored",
			"line", cut(string(b), 200), "run_ids", ag.runIDs())
		return
	}
	switch {
	case m.Method != "" && len(m.ID) > 0:
		ag.request(&m)
	case m.Method != "":
		ag.notification(&m)
	case len(m.ID) > 0:
		if !ag.c.deliver(&m) {
			ag.unknown.log(ag.log, "acp: response to no pending request; ignored", "id", cut(string(m.ID), 50))
		}
	default:
		ag.garbage.log(ag.log, "acp: JSON-RPC message with neither method nor id; ignored",
			"line", cut(string(b), 200), "run_ids", ag.runIDs())
	}
}

// notification handles a notification of the agent: session/update goes to
// the turn running on its session; anything else is logged and ignored.
func (ag *agent) notification(m *message) {
	if m.Method != "session/update" {
		ag.unknown.log(ag.log, "acp: notification ignored", "method", cut(m.Method, 100))
		return
	}
	var n struct {
		SessionID string          `json:"sessionId"`
		Update    json.RawMessage `json:"update"`
	}
	if err := json.Unmarshal(m.Params, &n); err != nil {
		ag.unknown.log(ag.log, "acp: malformed session/update ignored", "err", err)
		return
	}
	ag.meta.sessionUpdate(n.SessionID, n.Update)
	if t := ag.turn(n.SessionID); t != nil {
		t.update(n.Update)
	}
}

// request handles a request of the agent. Permission requests and
// elicitations go to the turn running on their session (which asks the
// person); fs requests are
// served here, in the workdir sandbox, and terminal requests too (see
// terminal.go); everything else is method-not-found.
// At most maxInflight are handled at once.
func (ag *agent) request(m *message) {
	select {
	case ag.inflight <- struct{}{}:
	default:
		ag.refused.logAt(ag.log, slog.LevelInfo, "acp: agent request refused: too many at once", "method", cut(m.Method, 100))
		_ = ag.c.reply(m.ID, nil, &rpcError{Code: codeServerBusy, Message: "too many requests at once"})
		return
	}
	done := func() { <-ag.inflight }
	switch m.Method {
	case "session/request_permission":
		var req permissionRequest
		if err := json.Unmarshal(m.Params, &req); err != nil {
			done()
			_ = ag.c.reply(m.ID, nil, &rpcError{Code: codeInvalidParams, Message: "invalid params: " + err.Error()})
			return
		}
		if err := checkOptions(req); err != nil {
			done()
			ag.refused.logAt(ag.log, slog.LevelWarn, "acp: permission request refused", "err", cut(err.Error(), 300), "run_ids", ag.runIDs())
			_ = ag.c.reply(m.ID, nil, &rpcError{Code: codeInvalidParams, Message: "invalid params: " + err.Error()})
			return
		}
		t := ag.turn(req.SessionID)
		if t == nil || !t.askPermission(permissionAsk{id: m.ID, req: req, done: done}) {
			done()
			ag.refused.logAt(ag.log, slog.LevelInfo, "acp: permission request answered cancelled: no running turn can take it",
				"session_id", cut(req.SessionID, 100))
			_ = ag.c.reply(m.ID, permissionCancelled(), nil)
		}
	case "elicitation/create":
		req, err := parseElicit(m.Params)
		if err != nil {
			done()
			_ = ag.c.reply(m.ID, nil, &rpcError{Code: codeInvalidParams, Message: "invalid params: " + err.Error()})
			return
		}
		t := ag.turn(req.SessionID)
		if req.SessionID == "" || t == nil || !t.askPermission(permissionAsk{id: m.ID, elicit: &req, done: done}) {
			done()
			ag.refused.logAt(ag.log, slog.LevelInfo, "acp: elicitation answered cancel: no running turn can take it",
				"session_id", cut(req.SessionID, 100))
			_ = ag.c.reply(m.ID, elicitCancelled(), nil)
		}
	case "fs/read_text_file", "fs/write_text_file":
		size := int64(maxRead)
		if m.Method == "fs/write_text_file" {
			size = int64(len(m.Params))
		}
		if !ag.fsLimit.take(size) {
			done()
			ag.refused.logAt(ag.log, slog.LevelInfo, "acp: fs request refused: too many at once", "method", m.Method)
			_ = ag.c.reply(m.ID, nil, &rpcError{Code: codeServerBusy, Message: "too many file requests at once: send the next one when one is answered"})
			return
		}
		go func() {
			defer done()
			defer ag.fsLimit.give(size)
			res, e := ag.fs(m.Method, m.Params)
			if ag.isDead() {
				return
			}
			if e != nil {
				ag.refused.logAt(ag.log, slog.LevelInfo, "acp: fs request refused", "method", m.Method, "err", cut(e.Message, 300), "run_ids", ag.runIDs())
			}
			_ = ag.c.reply(m.ID, res, e)
		}()
	case "terminal/create", "terminal/output", "terminal/wait_for_exit", "terminal/kill", "terminal/release":
		ag.terminal(m, done)
	default:
		done()
		_ = ag.c.reply(m.ID, nil, &rpcError{Code: codeMethodNotFound, Message: "method not found: " + cut(m.Method, 100)})
	}
}

// fs serves the fs methods in the runner's sandbox (see fs.go), until the
// turn of the request's session ends or the agent dies. A result is always a
// JSON object: fs/write_text_file's is {}, never null (ACP's
// WriteTextFileResponse is an object).
func (ag *agent) fs(method string, params json.RawMessage) (any, *rpcError) {
	ctx := ag.ctx
	var p struct {
		SessionID string `json:"sessionId"`
	}
	if json.Unmarshal(params, &p) == nil {
		if t := ag.turn(p.SessionID); t != nil && t.ctx != nil {
			ctx = t.ctx
		}
	}
	res, e := ag.box.serve(ctx, method, params)
	if e == nil && res == nil {
		res = struct{}{}
	}
	return res, e
}

// fsLimit bounds the fs requests served at once (max) and the bytes they
// hold (maxBytes). Safe for concurrent use.
type fsLimit struct {
	mu            sync.Mutex
	max, n        int
	maxBytes, use int64
}

// take reserves a slot and size bytes; false when either bound is reached.
func (l *fsLimit) take(size int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n >= l.max || l.use+size > l.maxBytes {
		return false
	}
	l.n++
	l.use += size
	return true
}

// give returns what take reserved.
func (l *fsLimit) give(size int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n--
	l.use -= size
}

// call sends a request and waits for its answer for at most timeout, until
// the agent dies, or until ctx is done; a request given up on is abandoned
// ($/cancel_request).
func (ag *agent) call(ctx context.Context, timeout time.Duration, method string, params, out any) error {
	id, ch, err := ag.c.request(method, params)
	if err != nil {
		return err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-ch:
		if r.err != nil {
			return r.err
		}
		if out != nil && len(r.result) > 0 {
			if err := json.Unmarshal(r.result, out); err != nil {
				return fmt.Errorf("acp: %s: bad answer: %w", method, err)
			}
		}
		return nil
	case <-t.C:
		ag.abandon(id, method)
		return &timeoutError{method: method, after: timeout}
	case <-ctx.Done():
		ag.abandon(id, method)
		return ctx.Err()
	}
}

// timeoutError is a request the agent did not answer in time.
type timeoutError struct {
	method string
	after  time.Duration
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("acp: the agent did not answer %s within %s", e.method, e.after)
}

// startFailure words a start-up failure for the user: never the agent's
// stderr, and no Go error chain. method is the request that failed:
// initialize (the agent never started) or session/new (it started but
// refused the conversation's session).
func startFailure(method string, err error) *runner.UserError {
	var te *timeoutError
	var re *rpcError
	switch {
	case errors.As(err, &te):
		return &runner.UserError{Message: messages.AgentStartTimedOut(messages.Duration(te.after))}
	case errors.As(err, &re) && method == "initialize":
		return &runner.UserError{Message: messages.AgentStartFailed(cut(oneLine(re.Message), 300))}
	case errors.As(err, &re):
		return &runner.UserError{Message: messages.AgentSessionRefused(cut(oneLine(re.Message), 300))}
	}
	return &runner.UserError{Message: messages.AgentCannotStart}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// cut shortens s to at most n bytes (at a rune boundary), marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && n < len(s) && s[n]&0xc0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
