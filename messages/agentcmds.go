package messages

import (
	"fmt"
	"strings"
)

// AgentCommandsHeading starts /help's list of the agent's own slash
// commands, after the gateway's.
const AgentCommandsHeading = "The agent's own commands (sent to it as you type them):"

// AgentCommandLine is one line of /help's list of the agent's commands.
func AgentCommandLine(name, description string) string {
	if description == "" {
		return "/" + name
	}
	return "/" + name + " — " + description
}

// HelpModeLine is /help's line for /mode when the runner is an ACP agent.
const HelpModeLine = "/mode — the agent's modes and settings; /mode <id> switches to a mode, /mode <setting> <value> changes a setting"

// AgentNoModes is /mode's answer when the agent (or the runner) has no
// modes.
const AgentNoModes = "This assistant has no modes."

// AgentNoSessionYet is /mode's answer before the agent serves the
// conversation (nothing sent since it started or since /new).
const AgentNoSessionYet = "The agent has not started on this conversation yet: send it a message first, then use /mode."

// AgentMode is one mode in AgentModes' list.
type AgentMode struct{ ID, Name, Description string }

// AgentModes lists the agent's modes for /mode, marking the current one.
func AgentModes(current string, modes []AgentMode) string {
	var b strings.Builder
	b.WriteString("The agent's modes (✅ the current one):\n")
	for _, m := range modes {
		mark := "▫️"
		if m.ID == current {
			mark = "✅"
		}
		fmt.Fprintf(&b, "%s %s", mark, m.ID)
		if m.Name != "" && m.Name != m.ID {
			fmt.Fprintf(&b, " (%s)", m.Name)
		}
		if m.Description != "" {
			b.WriteString(" — " + m.Description)
		}
		b.WriteString("\n")
	}
	b.WriteString("\nSend /mode <id> to switch.")
	return b.String()
}

// AgentModeSet is /mode <id>'s answer when the agent switched.
func AgentModeSet(id string) string { return fmt.Sprintf("✅ The agent is now in mode %s.", id) }

// AgentModeUnknown is /mode <id>'s answer when the agent has no such mode.
func AgentModeUnknown(id string) string {
	return fmt.Sprintf("The agent has no mode %q. Send /mode to see its modes.", id)
}

// AgentModeFailed is /mode <id>'s answer when the agent did not switch.
const AgentModeFailed = "The agent could not switch modes. Try again later."

// AgentBusyElsewhere is /mode's answer to a change of mode or setting
// while the conversation's turn runs on another server of the cluster:
// its modes are listed from there, but only that server changes them.
const AgentBusyElsewhere = "The agent is working on this conversation on another server right now. Change its mode or settings when its reply is done."

// The gateway's commands as a menu lists them (Telegram's command menu,
// the web chat's suggestions).
const (
	MenuStop   = "Stop the request that is running"
	MenuStatus = "Show the running step and the time left"
	MenuNew    = "Start a new conversation"
	MenuQueue  = "What happens to messages sent while it works"
	MenuHelp   = "How this bot works"
)

// MenuModeDescription is /mode's entry in Telegram's command menu of a
// chat whose runner is an ACP agent.
const MenuModeDescription = "List or switch the agent's modes"

// MenuAgentCommand is the menu entry of an agent command the agent gave no
// description.
const MenuAgentCommand = "The agent's command"

// AgentSessionsHeading starts /status's part about the agent's own
// sessions (ACP session/list, where the agent supports it): n listed, more
// when the agent has others not shown.
func AgentSessionsHeading(n int, more bool) string {
	if more {
		return fmt.Sprintf("🗂 The agent's sessions (%d shown, it has more):", n)
	}
	return fmt.Sprintf("🗂 The agent's sessions (%d):", n)
}

// AgentSessionLine is one of them: its title (else its id), marked when it
// is the one serving this conversation.
func AgentSessionLine(name string, current bool) string {
	if current {
		return "• " + name + " ← this conversation"
	}
	return "• " + name
}

// AgentConfigOption is one of the agent's settings (ACP config options) in
// AgentConfigOptions' list: a select with its value ids, or an on/off
// boolean (Current "on" or "off").
type AgentConfigOption struct {
	ID, Name, Current string
	Values            []string
	Boolean           bool
}

// AgentConfigOptions lists the agent's settings for /mode, after its modes
// (if any).
func AgentConfigOptions(opts []AgentConfigOption) string {
	var b strings.Builder
	b.WriteString("The agent's settings:\n")
	for _, o := range opts {
		fmt.Fprintf(&b, "⚙️ %s", o.ID)
		if o.Name != "" && o.Name != o.ID {
			fmt.Fprintf(&b, " (%s)", o.Name)
		}
		fmt.Fprintf(&b, ": %s", o.Current)
		switch {
		case o.Boolean:
			b.WriteString(" — on or off")
		case len(o.Values) > 0:
			b.WriteString(" — one of " + strings.Join(o.Values, ", "))
		}
		b.WriteString("\n")
	}
	b.WriteString("\nSend /mode <setting> <value> to change one.")
	return b.String()
}

// AgentConfigSet is /mode <setting> <value>'s answer when the agent took it.
func AgentConfigSet(id, value string) string {
	return fmt.Sprintf("✅ The agent's setting %s is now %s.", id, value)
}

// AgentConfigUnknown is /mode <setting> <value>'s answer when the agent
// has no such setting.
func AgentConfigUnknown(id string) string {
	return fmt.Sprintf("The agent has no setting %q. Send /mode to see its settings.", id)
}

// AgentConfigValueUnknown is /mode <setting> <value>'s answer when value
// is not one of the setting's.
func AgentConfigValueUnknown(id, value string) string {
	return fmt.Sprintf("%q is not a value of the agent's setting %s. Send /mode to see them.", value, id)
}

// AgentConfigFailed is /mode <setting> <value>'s answer when the agent did
// not change the setting.
const AgentConfigFailed = "The agent could not change the setting. Try again later."
