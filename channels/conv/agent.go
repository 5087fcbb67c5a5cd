package conv

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/turnguard/turnguard/gateway"
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

// Configurer is an Agent with settings other than modes (*acp.Runner: the
// agent's config options): /mode lists them after the modes and /mode
// <setting> <value> changes one.
type Configurer interface {
	ConfigOptions(key string) ([]acp.ConfigOption, bool)
	SetConfigOption(ctx context.Context, key, id, value string) error
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

// agentFor returns the Agent that answers /help and /mode for in's
// conversation: the local runner's when its agent has a session for it;
// else, when the session's turn runs on another replica (StatusOf asks
// the owner: gateway.TurnStatus.Agent), a view of the owner's agent, which
// lists but does not set (errElsewhere); else the local one (nil when the
// channel's runner has no agent).
func agentFor(ctx context.Context, eng Engine, in Inbound) Agent {
	local := agentOf(eng, in.Channel)
	if local != nil {
		if _, ok := local.Modes(in.SessionKey); ok {
			return local
		}
	}
	if st, err := eng.StatusOf(ctx, in.SessionKey); err == nil && st.Agent != nil {
		return remoteAgent{*st.Agent}
	}
	return local
}

// errElsewhere: the conversation's agent runs its turn on another replica,
// whose agent alone can change its mode or settings.
var errElsewhere = errors.New("the agent's session runs on another replica")

// remoteAgent is the view of an agent that runs the conversation's turn
// on another replica (an Agent and a Configurer that only list).
type remoteAgent struct{ v gateway.AgentView }

func (r remoteAgent) Commands(string) []acp.Command                 { return r.v.Commands }
func (r remoteAgent) Modes(string) (acp.Modes, bool)                { return r.v.Modes, true }
func (r remoteAgent) SetMode(context.Context, string, string) error { return errElsewhere }
func (r remoteAgent) ConfigOptions(string) ([]acp.ConfigOption, bool) {
	return r.v.Options, true
}
func (r remoteAgent) SetConfigOption(context.Context, string, string, string) error {
	return errElsewhere
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

// doMode carries out /mode (list the agent's modes and settings), /mode
// <id> (switch to a mode with session/set_mode) and /mode <setting>
// <value> (change a setting with session/set_config_option).
func doMode(ctx context.Context, eng Engine, in Inbound) Answer {
	a := agentFor(ctx, eng, in)
	if a == nil {
		return Answer{Command: Mode, Text: messages.AgentNoModes}
	}
	ms, ok := a.Modes(in.SessionKey)
	if !ok {
		return Answer{Command: Mode, Text: messages.AgentNoSessionYet}
	}
	cf, _ := a.(Configurer)
	var opts []acp.ConfigOption
	if cf != nil {
		opts, _ = cf.ConfigOptions(in.SessionKey)
	}
	if len(ms.Available) == 0 && len(opts) == 0 {
		return Answer{Command: Mode, Text: messages.AgentNoModes}
	}
	id, value, _ := strings.Cut(commandArg(in.Text), " ")
	value = strings.TrimSpace(value)
	switch {
	case id == "":
		return Answer{Command: Mode, Text: modesText(ms, opts)}
	case value != "" && cf != nil:
		return doSetting(ctx, cf, in, id, value)
	}
	if len(ms.Available) == 0 || slices.ContainsFunc(opts, func(o acp.ConfigOption) bool { return o.ID == id }) {
		return Answer{Command: Mode, Text: modesText(acp.Modes{}, opts)} // a setting named without a value: its values
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
	case errors.Is(err, errElsewhere):
		return Answer{Command: Mode, Err: err, Text: messages.AgentBusyElsewhere}
	}
	return Answer{Command: Mode, Err: fmt.Errorf("setting mode of %s: %w", in.SessionKey, err), Failed: true, Text: messages.AgentModeFailed}
}

// modesText lists the agent's modes, then its settings (each part only
// when there is any).
func modesText(ms acp.Modes, opts []acp.ConfigOption) string {
	var parts []string
	if len(ms.Available) > 0 {
		list := make([]messages.AgentMode, len(ms.Available))
		for i, m := range ms.Available {
			list[i] = messages.AgentMode{ID: m.ID, Name: m.Name, Description: m.Description}
		}
		parts = append(parts, messages.AgentModes(ms.Current, list))
	}
	if len(opts) > 0 {
		list := make([]messages.AgentConfigOption, len(opts))
		for i, o := range opts {
			list[i] = messages.AgentConfigOption{ID: o.ID, Name: o.Name, Current: o.Current, Boolean: o.Boolean}
			for _, v := range o.Values {
				list[i].Values = append(list[i].Values, v.ID)
			}
		}
		parts = append(parts, messages.AgentConfigOptions(list))
	}
	return strings.Join(parts, "\n\n")
}

// doSetting carries out /mode <setting> <value>.
func doSetting(ctx context.Context, cf Configurer, in Inbound, id, value string) Answer {
	err := cf.SetConfigOption(ctx, in.SessionKey, id, value)
	switch {
	case err == nil:
		return Answer{Command: Mode, Text: messages.AgentConfigSet(id, value)}
	case errors.Is(err, acp.ErrUnknownOption):
		return Answer{Command: Mode, Err: err, Text: messages.AgentConfigUnknown(cutArg(id))}
	case errors.Is(err, acp.ErrUnknownValue):
		return Answer{Command: Mode, Err: err, Text: messages.AgentConfigValueUnknown(cutArg(id), cutArg(value))}
	case errors.Is(err, acp.ErrNoSession):
		return Answer{Command: Mode, Err: err, Text: messages.AgentNoSessionYet}
	case errors.Is(err, errElsewhere):
		return Answer{Command: Mode, Err: err, Text: messages.AgentBusyElsewhere}
	}
	return Answer{Command: Mode, Err: fmt.Errorf("changing setting %s of %s: %w", cutArg(id), in.SessionKey, err), Failed: true, Text: messages.AgentConfigFailed}
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
