package conv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/acp"
)

// Agent is what the conversation core asks of a runner with commands and
// modes of its own (*acp.Runner), per session key: /help lists its
// commands after the gateway's, /mode lists and sets its modes.
type Agent interface {
	Commands(key string) []acp.Command
	Modes(key string) (acp.Modes, bool)
	SetMode(ctx context.Context, key, id string) error
}

// RunnerSource is an engine that names the runner a channel's turns run on
// (*gateway.Engine). An engine that is not one (a cluster node, whose
// agent may run on another replica) has no Agent here: /help lists only
// the gateway's commands and /mode says there are no modes.
type RunnerSource interface {
	RunnerOf(channel string) runner.Runner
}

// agentOf returns the Agent of channel's runner, nil when there is none.
func agentOf(eng Engine, channel string) Agent {
	rs, ok := eng.(RunnerSource)
	if !ok {
		return nil
	}
	a, _ := rs.RunnerOf(channel).(Agent)
	return a
}

// SessionLister is a runner that can list the agent's own sessions
// (*acp.Runner, with an agent that advertises session/list).
type SessionLister interface {
	ListSessions(ctx context.Context, key string) (acp.AgentSessions, error)
}

// agentSessions is /status's part about the agent's sessions: "" when the
// channel's runner cannot list them, the agent does not support it, no
// session serves the conversation yet, or the agent failed to answer —
// /status still answers about the turn.
func agentSessions(ctx context.Context, eng Engine, in Inbound) string {
	rs, ok := eng.(RunnerSource)
	if !ok {
		return ""
	}
	l, ok := rs.RunnerOf(in.Channel).(SessionLister)
	if !ok {
		return ""
	}
	list, err := l.ListSessions(ctx, in.SessionKey)
	if err != nil || len(list.Sessions) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n\n" + messages.AgentSessionsHeading(len(list.Sessions), list.More))
	for _, s := range list.Sessions {
		name := s.Title
		if name == "" {
			name = s.ID
		}
		b.WriteString("\n" + messages.AgentSessionLine(name, s.ID == list.Current))
	}
	return b.String()
}

// agentHelp is /help's part about the agent: /mode and the agent's
// commands for the conversation of key ("" without an Agent).
func agentHelp(a Agent, key string) string {
	if a == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n\n" + messages.HelpModeLine)
	if cmds := a.Commands(key); len(cmds) > 0 {
		b.WriteString("\n\n" + messages.AgentCommandsHeading)
		for _, c := range cmds {
			b.WriteString("\n" + messages.AgentCommandLine(c.Name, c.Description))
		}
	}
	return b.String()
}

// doMode carries out /mode (list the agent's modes) and /mode <id>
// (switch to one with session/set_mode).
func doMode(ctx context.Context, eng Engine, in Inbound) Answer {
	a := agentOf(eng, in.Channel)
	if a == nil {
		return Answer{Command: Mode, Text: messages.AgentNoModes}
	}
	ms, ok := a.Modes(in.SessionKey)
	switch {
	case !ok:
		return Answer{Command: Mode, Text: messages.AgentNoSessionYet}
	case len(ms.Available) == 0:
		return Answer{Command: Mode, Text: messages.AgentNoModes}
	}
	id := commandArg(in.Text)
	if id == "" {
		list := make([]messages.AgentMode, len(ms.Available))
		for i, m := range ms.Available {
			list[i] = messages.AgentMode{ID: m.ID, Name: m.Name, Description: m.Description}
		}
		return Answer{Command: Mode, Text: messages.AgentModes(ms.Current, list)}
	}
	err := a.SetMode(ctx, in.SessionKey, id)
	switch {
	case err == nil:
		return Answer{Command: Mode, Text: messages.AgentModeSet(id)}
	case errors.Is(err, acp.ErrUnknownMode):
		return Answer{Command: Mode, Err: err, Text: messages.AgentModeUnknown(cutArg(id))}
	case errors.Is(err, acp.ErrNoSession):
		return Answer{Command: Mode, Err: err, Text: messages.AgentNoSessionYet}
	case errors.Is(err, acp.ErrNoModes):
		return Answer{Command: Mode, Err: err, Text: messages.AgentNoModes}
	}
	return Answer{Command: Mode, Err: fmt.Errorf("setting mode of %s: %w", in.SessionKey, err), Failed: true, Text: messages.AgentModeFailed}
}

// commandArg is the text after a command's first word, trimmed.
func commandArg(text string) string {
	text = strings.TrimSpace(text)
	i := strings.IndexFunc(text, unicode.IsSpace)
	if i < 0 {
		return ""
	}
	return strings.TrimSpace(text[i:])
}

// cutArg bounds an argument echoed back to the person.
func cutArg(s string) string {
	if r := []rune(s); len(r) > 64 {
		return string(r[:64]) + "…"
	}
	return s
}
