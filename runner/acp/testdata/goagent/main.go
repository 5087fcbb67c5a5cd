// Command goagent is a test agent of runner/acp's tests built on another
// ACP implementation than the TypeScript SDK: the Go SDK
// (github.com/coder/acp-go-sdk). It behaves like OpenCode where the tests
// need it to:
//
//   - initialize with a clientInfo that is not a valid ACP Implementation
//     (name and version are required) is refused with -32602 Invalid params;
//   - an "always" permission grant is kept per process, for every session
//     (the agent cannot tell conversations apart);
//   - a tool call starts titled "bash" and is renamed to the real command
//     by a later tool_call_update;
//   - a denied tool ends the turn without any text.
//
// Prompts:
//
//	run CMD   a "bash" tool call retitled "Run CMD", asking permission
//	          (allow once, always allow, reject) unless "always" was
//	          granted before in this process; "ran CMD" when allowed,
//	          no text at all when rejected
//	pid       answers with its process id
//	remember X  keeps X in the session; "what did I say" tells it back
//	effort    "effort E": the session's config option "effort" (a select
//	          of low and high, low at first; session/set_config_option
//	          sets it)
//	anything else  "echo: <text>"
//
// initialize advertises session/list: the sessions of this process in the
// requested cwd, titled "go session N".
//
// GOAGENT_SESSIONS, a directory, makes sessions outlive the process: each
// is a file there, and initialize advertises session/resume and
// session/close (not session/load), which are served from those files.
//
// GOAGENT_SLOW_START, a Go duration, delays the answers to initialize and
// to session/new by that much each; GOAGENT_REFUSE_INIT refuses every
// initialize.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"
)

type agent struct {
	conn *acp.AgentSideConnection
	slow time.Duration

	dir string // GOAGENT_SESSIONS: "" keeps sessions in memory only

	mu     sync.Mutex
	n      int
	always map[string]bool          // "always" grants by tool, for the whole process
	memory map[acp.SessionId]string // what "remember" kept, by session
	made   []made                   // the sessions session/new made, in order
	effort map[acp.SessionId]string // the config option "effort", by session
}

// made is a session of this process, as session/list lists it.
type made struct {
	id    acp.SessionId
	cwd   string
	title string
}

// remembered is what session sid keeps, read from its file when the
// session is not in memory; ok is false for an unknown session.
func (a *agent) remembered(sid acp.SessionId) (text string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if text, ok = a.memory[sid]; ok || a.dir == "" {
		return text, ok
	}
	b, err := os.ReadFile(filepath.Join(a.dir, filepath.Base(string(sid))))
	if err != nil {
		return "", false
	}
	a.memory[sid] = string(b)
	return string(b), true
}

// keep sets what session sid keeps, in its file too.
func (a *agent) keep(sid acp.SessionId, text string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.memory[sid] = text
	if a.dir == "" {
		return nil
	}
	return os.WriteFile(filepath.Join(a.dir, filepath.Base(string(sid))), []byte(text), 0o600)
}

func (a *agent) Initialize(ctx context.Context, p acp.InitializeRequest) (acp.InitializeResponse, error) {
	if os.Getenv("GOAGENT_REFUSE_INIT") != "" || p.ClientInfo == nil || p.ClientInfo.Name == "" || p.ClientInfo.Version == "" {
		return acp.InitializeResponse{}, acp.NewInvalidParams(map[string]string{"clientInfo": "name and version: expected string"})
	}
	time.Sleep(a.slow)
	res := acp.InitializeResponse{
		ProtocolVersion: acp.ProtocolVersionNumber,
		AgentInfo:       &acp.Implementation{Name: "go-agent", Version: "1.0.0"},
	}
	res.AgentCapabilities.SessionCapabilities.List = &acp.SessionListCapabilities{}
	if a.dir != "" {
		res.AgentCapabilities.SessionCapabilities.Resume = &acp.SessionResumeCapabilities{}
		res.AgentCapabilities.SessionCapabilities.Close = &acp.SessionCloseCapabilities{}
	}
	return res, nil
}

func (a *agent) NewSession(ctx context.Context, p acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	time.Sleep(a.slow)
	a.mu.Lock()
	a.n++
	id := acp.SessionId(fmt.Sprintf("go-%d-%d", os.Getpid(), a.n))
	a.made = append(a.made, made{id: id, cwd: p.Cwd, title: fmt.Sprintf("go session %d", a.n)})
	a.effort[id] = "low"
	a.mu.Unlock()
	if err := a.keep(id, ""); err != nil {
		return acp.NewSessionResponse{}, err
	}
	return acp.NewSessionResponse{SessionId: id, ConfigOptions: effortOption("low")}, nil
}

// effortOption is the config options of a session whose effort is cur.
func effortOption(cur string) []acp.SessionConfigOption {
	values := acp.SessionConfigSelectOptionsUngrouped{{Value: "low", Name: "Low"}, {Value: "high", Name: "High"}}
	return []acp.SessionConfigOption{{Select: &acp.SessionConfigOptionSelect{Id: "effort", Name: "Effort", Type: "select",
		CurrentValue: acp.SessionConfigValueId(cur), Options: acp.SessionConfigSelectOptions{Ungrouped: &values}}}}
}

func (a *agent) Prompt(ctx context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	var text strings.Builder
	for _, b := range p.Prompt {
		if b.Text != nil {
			text.WriteString(b.Text.Text)
		}
	}
	msg := strings.TrimSpace(text.String())
	end := acp.PromptResponse{StopReason: acp.StopReasonEndTurn}
	switch {
	case strings.HasPrefix(msg, "run "):
		return end, a.run(ctx, p.SessionId, strings.TrimPrefix(msg, "run "))
	case msg == "pid":
		return end, a.say(ctx, p.SessionId, fmt.Sprintf("pid %d", os.Getpid()))
	case strings.HasPrefix(msg, "remember "):
		if err := a.keep(p.SessionId, strings.TrimPrefix(msg, "remember ")); err != nil {
			return end, err
		}
		return end, a.say(ctx, p.SessionId, "OK, I will remember "+strings.TrimPrefix(msg, "remember ")+".")
	case msg == "effort":
		a.mu.Lock()
		e := a.effort[p.SessionId]
		a.mu.Unlock()
		return end, a.say(ctx, p.SessionId, "effort "+e)
	case msg == "what did I say":
		if text, _ := a.remembered(p.SessionId); text != "" {
			return end, a.say(ctx, p.SessionId, "You said: "+text)
		}
		return end, a.say(ctx, p.SessionId, "You said nothing yet.")
	}
	return end, a.say(ctx, p.SessionId, "echo: "+msg)
}

func (a *agent) say(ctx context.Context, sid acp.SessionId, text string) error {
	return a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: acp.UpdateAgentMessageText(text)})
}

func (a *agent) update(ctx context.Context, sid acp.SessionId, u acp.SessionUpdate) error {
	return a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: sid, Update: u})
}

// run is one "bash" tool call of command cmd.
func (a *agent) run(ctx context.Context, sid acp.SessionId, cmd string) error {
	id := acp.ToolCallId("bash-" + strings.ReplaceAll(cmd, " ", "-"))
	title := "Run " + cmd
	if err := a.update(ctx, sid, acp.StartToolCall(id, "bash", acp.WithStartKind(acp.ToolKindExecute),
		acp.WithStartStatus(acp.ToolCallStatusPending))); err != nil {
		return err
	}
	if err := a.update(ctx, sid, acp.UpdateToolCall(id, acp.WithUpdateTitle(title),
		acp.WithUpdateStatus(acp.ToolCallStatusInProgress))); err != nil {
		return err
	}
	a.mu.Lock()
	granted := a.always["bash"]
	a.mu.Unlock()
	if !granted {
		res, err := a.conn.RequestPermission(ctx, acp.RequestPermissionRequest{
			SessionId: sid,
			ToolCall: acp.ToolCallUpdate{ToolCallId: id, Title: acp.Ptr(title), Kind: acp.Ptr(acp.ToolKindExecute),
				RawInput: map[string]any{"command": cmd}},
			Options: []acp.PermissionOption{
				{OptionId: "once", Name: "Allow once", Kind: acp.PermissionOptionKindAllowOnce},
				{OptionId: "always", Name: "Always allow", Kind: acp.PermissionOptionKindAllowAlways},
				{OptionId: "reject", Name: "Reject", Kind: acp.PermissionOptionKindRejectOnce},
			},
		})
		if err != nil {
			return err
		}
		chosen := ""
		if res.Outcome.Selected != nil {
			chosen = string(res.Outcome.Selected.OptionId)
		}
		switch chosen {
		case "always":
			a.mu.Lock()
			if a.always == nil {
				a.always = map[string]bool{}
			}
			a.always["bash"] = true
			a.mu.Unlock()
		case "once":
		default: // rejected or cancelled: the turn ends without a word
			return a.update(ctx, sid, acp.UpdateToolCall(id, acp.WithUpdateStatus(acp.ToolCallStatusFailed)))
		}
	}
	if err := a.update(ctx, sid, acp.UpdateToolCall(id, acp.WithUpdateStatus(acp.ToolCallStatusCompleted))); err != nil {
		return err
	}
	return a.say(ctx, sid, "ran "+cmd)
}

func (a *agent) Cancel(context.Context, acp.CancelNotification) error { return nil }

func (a *agent) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, nil
}

func (a *agent) CloseSession(_ context.Context, p acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	if a.dir == "" {
		return acp.CloseSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionClose)
	}
	a.mu.Lock()
	delete(a.memory, p.SessionId)
	a.mu.Unlock()
	return acp.CloseSessionResponse{}, os.Remove(filepath.Join(a.dir, filepath.Base(string(p.SessionId))))
}

func (a *agent) ListSessions(_ context.Context, p acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	res := acp.ListSessionsResponse{Sessions: []acp.SessionInfo{}}
	for _, m := range a.made {
		if p.Cwd == nil || *p.Cwd == m.cwd {
			res.Sessions = append(res.Sessions, acp.SessionInfo{SessionId: m.id, Cwd: m.cwd, Title: acp.Ptr(m.title)})
		}
	}
	return res, nil
}

func (a *agent) ResumeSession(_ context.Context, p acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	if a.dir == "" {
		return acp.ResumeSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionResume)
	}
	if _, ok := a.remembered(p.SessionId); !ok {
		return acp.ResumeSessionResponse{}, acp.NewInvalidParams(map[string]string{"sessionId": "unknown session"})
	}
	return acp.ResumeSessionResponse{}, nil
}

func (a *agent) SetSessionConfigOption(_ context.Context, p acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	v := p.ValueId
	if v == nil || v.ConfigId != "effort" || (v.Value != "low" && v.Value != "high") {
		return acp.SetSessionConfigOptionResponse{}, acp.NewInvalidParams(map[string]string{"configId": "only effort, low or high"})
	}
	a.mu.Lock()
	a.effort[v.SessionId] = string(v.Value)
	a.mu.Unlock()
	return acp.SetSessionConfigOptionResponse{ConfigOptions: effortOption(string(v.Value))}, nil
}

func (a *agent) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetMode)
}

func main() {
	a := &agent{dir: os.Getenv("GOAGENT_SESSIONS"), memory: map[acp.SessionId]string{}, effort: map[acp.SessionId]string{}}
	if s := os.Getenv("GOAGENT_SLOW_START"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			fmt.Fprintln(os.Stderr, "goagent: GOAGENT_SLOW_START:", err)
			os.Exit(2)
		}
		a.slow = d
	}
	a.conn = acp.NewAgentSideConnection(a, os.Stdout, os.Stdin)
	<-a.conn.Done()
}
