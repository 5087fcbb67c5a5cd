package acp

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/turnguard/turnguard/runner"
	execrunner "github.com/turnguard/turnguard/runner/exec"
)

// Terminals: the client's terminal methods (initialize advertises
// terminal: true). terminal/create runs a command for the agent — in the
// workdir sandbox, with the agent's environment (the gateway's less its
// GATEWAY_* variables, then agents.acp.env) plus the request's env, stdin
// empty, stdout and stderr together — in its own process group under the
// shim of runner/exec, with a run tag of its own (so a gateway restart's
// cleanup finds it, and it never takes another terminal's processes with
// it). A command with no args that is no executable but holds a space is
// run by /bin/sh -c, as agents that send a shell line expect.
//
// Bounds: a terminal keeps the last min(outputByteLimit, maxTermOutput)
// bytes of its output (truncated from the beginning, at a character
// boundary, as ACP says); a turn has at most maxTerminals terminals that
// are not released (more are refused with an error for the agent); and no
// terminal outlives its turn: when the turn ends, is aborted, or its agent
// dies, every terminal of the turn is killed (SIGKILL of its process group)
// and released.
//
// Liveness: a running terminal is a tool step of its turn, named after the
// command, which completes when the command exits (or is killed); so a
// command that runs longer than stepTimeoutSeconds is a stalled step. Its
// output is activity (runner.ActivityReporter): it resets the liveness
// window only under livenessResetOn: activity, like the agent's thoughts.
const (
	maxTerminals  = 4
	maxTermOutput = 1 << 20
	// maxTermEnv bounds the env entries of one terminal/create.
	maxTermEnv = 256
	// activityEvery throttles the activity a terminal's output reports.
	activityEvery = 500 * time.Millisecond
)

// terminal is one command run for the agent.
type terminal struct {
	id    string
	sid   string // its session
	step  string // its tool call id in the turn's steps
	name  string
	p     *execrunner.Process
	limit int

	exited chan struct{} // closed once the command ended and its output is read

	mu        sync.Mutex
	out       []byte // the output's tail; may hold up to 2*limit bytes before it is cut
	truncated bool
	status    *exitStatus // set before exited is closed
	unwatch   func() bool // stops the release at the turn's end
}

// exitStatus is ACP's TerminalExitStatus.
type exitStatus struct {
	ExitCode *int    `json:"exitCode"`
	Signal   *string `json:"signal"`
}

// terminals are an agent's terminals by id. Safe for concurrent use.
type terminals struct {
	dir  string   // the workdir
	env  []string // agents.acp.env
	inst string   // the gateway instance of the run tags

	mu   sync.Mutex
	n    int
	byID map[string]*terminal
}

// count returns how many unreleased terminals session sid has (mu held).
func (ts *terminals) count(sid string) int {
	n := 0
	for _, t := range ts.byID {
		if t.sid == sid {
			n++
		}
	}
	return n
}

// termRequest is the params of the terminal methods.
type termRequest struct {
	SessionID  string   `json:"sessionId"`
	TerminalID string   `json:"terminalId"`
	Command    string   `json:"command"`
	Args       []string `json:"args"`
	Env        []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"env"`
	Cwd             *string `json:"cwd"`
	OutputByteLimit *int64  `json:"outputByteLimit"`
}

// terminal serves one terminal request; done releases its in-flight slot.
// A request of a session with no running turn is refused: a terminal lives
// within a turn.
func (ag *agent) terminal(m *message, done func()) {
	go func() {
		defer done()
		res, e := ag.serveTerminal(m.Method, m.Params)
		if ag.isDead() {
			return
		}
		if e != nil {
			ag.refused.logAt(ag.log, slog.LevelInfo, "acp: terminal request refused", "method", m.Method, "err", cut(e.Message, 300), "run_ids", ag.runIDs())
		}
		if e == nil && res == nil {
			res = struct{}{}
		}
		_ = ag.c.reply(m.ID, res, e)
	}()
}

func (ag *agent) serveTerminal(method string, params json.RawMessage) (any, *rpcError) {
	var p termRequest
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, &rpcError{Code: codeInvalidParams, Message: "invalid params: " + err.Error()}
	}
	if method == "terminal/create" {
		return ag.createTerminal(p)
	}
	ag.terms.mu.Lock()
	t := ag.terms.byID[p.TerminalID]
	ag.terms.mu.Unlock()
	if t == nil || t.sid != p.SessionID {
		return nil, &rpcError{Code: codeInvalidParams, Message: "invalid params: no terminal " + cut(p.TerminalID, 100) + " in this session"}
	}
	switch method {
	case "terminal/output":
		return t.output(), nil
	case "terminal/wait_for_exit":
		select {
		case <-t.exited:
			return t.status, nil
		case <-ag.dead:
			return nil, &rpcError{Code: codeInternal, Message: "the client is stopping"}
		}
	case "terminal/kill":
		t.kill()
		return nil, nil
	default: // terminal/release
		ag.releaseTerminal(t)
		return nil, nil
	}
}

// createTerminal starts a terminal for the running turn of p's session.
func (ag *agent) createTerminal(p termRequest) (any, *rpcError) {
	ts := ag.turn(p.SessionID)
	if ts == nil || ts.ctx == nil || ts.ctx.Err() != nil {
		return nil, &rpcError{Code: codeInvalidParams, Message: "invalid params: no turn is running in this session"}
	}
	if strings.TrimSpace(p.Command) == "" || strings.ContainsRune(p.Command, 0) {
		return nil, &rpcError{Code: codeInvalidParams, Message: "invalid params: command is required"}
	}
	dir := ag.terms.dir
	if p.Cwd != nil && *p.Cwd != "" {
		rel, e := ag.box.rel(*p.Cwd)
		if e != nil {
			return nil, e
		}
		d, err := filepath.EvalSymlinks(filepath.Join(ag.box.dir, rel))
		if err != nil {
			return nil, &rpcError{Code: codeInvalidParams, Message: "invalid params: cwd: " + err.Error()}
		}
		if _, e := ag.box.rel(d); e != nil {
			return nil, e // a symbolic link out of the workdir
		}
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return nil, &rpcError{Code: codeInvalidParams, Message: "invalid params: cwd is not a directory"}
		}
		dir = d
	}
	env := ag.terms.env
	if len(p.Env) > maxTermEnv {
		return nil, &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf("invalid params: more than %d env entries", maxTermEnv)}
	}
	if len(p.Env) > 0 {
		m := make(map[string]string, len(p.Env))
		for _, e := range p.Env {
			m[e.Name] = e.Value
		}
		extra, err := execrunner.EnvList("terminal/create", m)
		if err != nil {
			return nil, &rpcError{Code: codeInvalidParams, Message: "invalid params: " + err.Error()}
		}
		env = append(env[:len(env):len(env)], extra...)
	}
	path, args := p.Command, p.Args
	resolved, err := execrunner.ResolveCommand("terminal/create", p.Command, dir)
	switch {
	case err == nil:
		path = resolved
	case len(args) == 0 && strings.ContainsAny(p.Command, " \t"):
		path, args = "/bin/sh", []string{"-c", p.Command}
	default:
		return nil, &rpcError{Code: codeInvalidParams, Message: "invalid params: " + err.Error()}
	}
	limit := maxTermOutput
	if l := p.OutputByteLimit; l != nil && *l >= 0 && *l < int64(limit) {
		limit = int(*l)
	}

	ag.terms.mu.Lock()
	if ag.terms.count(p.SessionID) >= maxTerminals {
		ag.terms.mu.Unlock()
		return nil, &rpcError{Code: codeServerBusy, Message: fmt.Sprintf("too many terminals: at most %d at once; release one first", maxTerminals)}
	}
	ag.terms.n++
	id := "term-" + strconv.Itoa(ag.terms.n)
	if ag.terms.byID == nil {
		ag.terms.byID = map[string]*terminal{}
	}
	t := &terminal{id: id, sid: p.SessionID, step: "\x00" + id, limit: limit, exited: make(chan struct{}),
		name: cut(oneLine(strings.Join(append([]string{p.Command}, p.Args...), " ")), 200)}
	ag.terms.byID[id] = t // reserves the slot while the command starts
	ag.terms.mu.Unlock()

	rd, wr, err := os.Pipe()
	if err == nil {
		cmd := osexec.Command(path, args...)
		cmd.Dir = dir
		cmd.Env = execrunner.Environ(env...)
		cmd.Stdout, cmd.Stderr = wr, wr
		t.p, err = execrunner.StartTagged(cmd, execrunner.Tag(ag.terms.inst, ts.runID+"/"+id))
		wr.Close()
		if err != nil {
			rd.Close()
		}
	}
	if err != nil {
		ag.terms.mu.Lock()
		delete(ag.terms.byID, id)
		ag.terms.mu.Unlock()
		return nil, &rpcError{Code: codeInternal, Message: "the command could not be started: " + err.Error()}
	}
	ag.log.Info("acp: terminal started", "terminal", id, "command", t.name, "pid", t.p.Pid(), "run_id", ts.runID)
	ts.terminalStep(t.step, t.name, true)
	go t.read(rd, ts)
	// No terminal outlives its turn (or its agent): ts.ctx ends with both.
	stop := context.AfterFunc(ts.ctx, func() { ag.releaseTerminal(t) })
	t.mu.Lock()
	t.unwatch = stop
	t.mu.Unlock()
	go func() {
		<-t.exited
		ts.terminalStep(t.step, t.name, false)
	}()
	return map[string]string{"terminalId": id}, nil
}

// read keeps the tail of the command's output until it ends, then records
// its exit status and closes exited. Output is activity for the turn.
func (t *terminal) read(rd *os.File, ts *turnState) {
	defer close(t.exited)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		var buf [32 << 10]byte
		var last time.Time
		for {
			n, err := rd.Read(buf[:])
			if n > 0 {
				t.add(buf[:n])
				if now := time.Now(); now.Sub(last) >= activityEvery {
					last = now
					ts.activity()
				}
			}
			if err != nil {
				return
			}
		}
	}()
	<-t.p.Done()
	select {
	case <-readDone:
	case <-time.After(drainWait):
		// A process that escaped the group holds the pipe open.
	}
	rd.Close()
	<-readDone
	t.mu.Lock()
	t.status = statusOf(t.p.State())
	t.mu.Unlock()
}

// terminalStep opens (start) or completes the tool step of a terminal.
func (t *turnState) terminalStep(id, name string, start bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	if start {
		_ = t.startTool(id, name)
	} else {
		t.complete(id)
	}
}

// activity reports a sign of life that is no step (see update).
func (t *turnState) activity() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	if a, ok := t.cb.(runner.ActivityReporter); ok {
		a.Activity()
	}
}

// add appends output, keeping the last limit bytes (amortized: the buffer
// is cut once it holds twice that).
func (t *terminal) add(b []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out = append(t.out, b...)
	if len(t.out) > 2*t.limit || t.limit == 0 {
		if drop := len(t.out) - t.limit; drop > 0 {
			t.out = append(t.out[:0], t.out[drop:]...)
			t.truncated = true
		}
	}
}

// termOutput is ACP's TerminalOutputResponse.
type termOutput struct {
	Output     string      `json:"output"`
	Truncated  bool        `json:"truncated"`
	ExitStatus *exitStatus `json:"exitStatus,omitempty"`
}

// output returns the output's tail, cut at a character boundary.
func (t *terminal) output() termOutput {
	t.mu.Lock()
	defer t.mu.Unlock()
	out, truncated := t.out, t.truncated
	if len(out) > t.limit {
		out, truncated = out[len(out)-t.limit:], true
	}
	if truncated {
		for len(out) > 0 && out[0]&0xc0 == 0x80 {
			out = out[1:]
		}
	}
	return termOutput{Output: strings.ToValidUTF8(string(out), "\uFFFD"), Truncated: truncated, ExitStatus: t.status}
}

// kill stops the command's process group (SIGKILL); the terminal stays.
func (t *terminal) kill() {
	if t.p != nil {
		_ = t.p.Signal(syscall.SIGKILL)
	}
}

// releaseTerminal kills t's command and forgets t.
func (ag *agent) releaseTerminal(t *terminal) {
	t.kill()
	t.mu.Lock()
	if t.unwatch != nil {
		t.unwatch()
	}
	t.mu.Unlock()
	ag.terms.mu.Lock()
	if ag.terms.byID[t.id] == t {
		delete(ag.terms.byID, t.id)
		ag.log.Info("acp: terminal released", "terminal", t.id)
	}
	ag.terms.mu.Unlock()
}

// statusOf words a process state as ACP's exit status.
func statusOf(st *os.ProcessState) *exitStatus {
	s := &exitStatus{}
	if st == nil {
		return s
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		name := signalName(ws.Signal())
		s.Signal = &name
		return s
	}
	code := st.ExitCode()
	if code >= 0 {
		s.ExitCode = &code
	}
	return s
}

func signalName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return sig.String()
}
