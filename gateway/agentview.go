// The agent's view of a session (its slash commands, modes and settings)
// carried in TurnStatus, so that a replica that does not run the session's
// turn answers /help and /mode with what the owner's agent offers
// (StatusOf asks the owner; cluster/node and cluster/inproc carry the
// TurnStatus whole).

package gateway

import "github.com/turnguard/turnguard/runner/acp"

// AgentView is what the agent of a session's running turn offers its
// conversation on the replica that runs it: its slash commands, its modes
// and its settings (config options). Nil in a TurnStatus when nothing
// runs, or the runner has no agent of its own or no session for the
// conversation.
type AgentView struct {
	Commands []acp.Command      `json:",omitempty"`
	Modes    acp.Modes          // Available empty: no modes
	Options  []acp.ConfigOption `json:",omitempty"`
}

// agentViewer is a runner with an agent of its own (*acp.Runner).
type agentViewer interface {
	Commands(key string) []acp.Command
	Modes(key string) (acp.Modes, bool)
	ConfigOptions(key string) ([]acp.ConfigOption, bool)
}

// agentView returns the view of the agent of channel's runner for the
// session key, nil when the runner has no agent or the agent no session
// for it (bounded by the runner's own limits on commands, modes and
// options).
func (e *Engine) agentView(channel, key string) *AgentView {
	a, ok := e.RunnerOf(channel).(agentViewer)
	if !ok {
		return nil
	}
	ms, ok := a.Modes(key)
	if !ok {
		return nil
	}
	opts, _ := a.ConfigOptions(key)
	return &AgentView{Commands: a.Commands(key), Modes: ms, Options: opts}
}
