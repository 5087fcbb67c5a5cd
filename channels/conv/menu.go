// The command suggestions of a conversation (the web chat's "/" list, the
// WebSocket commands.list): the gateway's commands, then /mode and the
// agent's own when the channel's runner has an agent.

package conv

import (
	"context"
	"slices"

	"github.com/turnguard/turnguard/messages"
)

// MenuEntry is one command a person can type: its name without the slash
// and what it does.
type MenuEntry struct {
	Name        string `json:"name"`
	Description string `json:"description"`
}

// GatewayMenu is the gateway's own commands, in the order menus list them
// (they always come first and win over an agent's command of the same
// name).
var GatewayMenu = []MenuEntry{
	{Name: string(Stop), Description: messages.MenuStop},
	{Name: string(Status), Description: messages.MenuStatus},
	{Name: string(New), Description: messages.MenuNew},
	{Name: string(Queue), Description: messages.MenuQueue},
	{Name: string(Help), Description: messages.MenuHelp},
}

// Menu lists the commands a person can type in in's conversation: the
// gateway's (GatewayMenu); then, when the channel's runner has an agent
// (the owner's while the turn runs on another replica, see agentFor),
// /mode and the agent's commands not named like one of the gateway's —
// at most limit entries in all (limit ≤ 0: no limit beyond the agent's
// own bound on its commands).
func Menu(ctx context.Context, eng Engine, in Inbound, limit int) []MenuEntry {
	a := agentFor(ctx, eng, in)
	if a == nil {
		return slices.Clone(GatewayMenu)
	}
	return AgentMenu(a, in.SessionKey, limit)
}

// AgentMenu is Menu for a conversation (session key key) whose runner has
// the agent a (Telegram's per-chat command menu too): GatewayMenu, /mode,
// then a's commands not named like one of those (nor "start", Telegram's),
// at most limit entries (limit ≤ 0: no limit).
func AgentMenu(a Agent, key string, limit int) []MenuEntry {
	menu := append(slices.Clone(GatewayMenu), MenuEntry{Name: string(Mode), Description: messages.MenuModeDescription})
	for _, c := range a.Commands(key) {
		if limit > 0 && len(menu) >= limit {
			break
		}
		if c.Name == "start" || slices.ContainsFunc(menu, func(m MenuEntry) bool { return m.Name == c.Name }) {
			continue // the gateway's command wins
		}
		desc := c.Description
		if desc == "" {
			desc = messages.MenuAgentCommand
		}
		menu = append(menu, MenuEntry{Name: c.Name, Description: desc})
	}
	return menu
}
