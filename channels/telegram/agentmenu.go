package telegram

import (
	"context"
	"strings"
	"time"

	"github.com/go-telegram/bot"
	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/config"
)

// maxMenu is how many commands Telegram takes in one menu.
const maxMenu = 100

// menuTimeout bounds one setMyCommands call for a chat's menu.
const menuTimeout = 30 * time.Second

// agentMenu is the command menu of a chat whose runner has commands of its
// own (conv.Agent) for session key key: the gateway's commands first
// (botCommands, then /mode), then the agent's not named like one of them,
// at most maxMenu in all. nil when the agent has none for key (the chat
// keeps the bot's default menu).
func agentMenu(a conv.Agent, key string) []models.BotCommand {
	if len(a.Commands(key)) == 0 {
		return nil
	}
	return botMenu(conv.AgentMenu(a, key, maxMenu))
}

// botMenu is entries as Telegram's command menu.
func botMenu(entries []conv.MenuEntry) []models.BotCommand {
	menu := make([]models.BotCommand, len(entries))
	for i, m := range entries {
		menu[i] = models.BotCommand{Command: m.Name, Description: m.Description}
	}
	return menu
}

// menuKey is a menu's identity, to set a chat's menu only when it changed.
func menuKey(menu []models.BotCommand) string {
	var b strings.Builder
	for _, m := range menu {
		b.WriteString(m.Command + "\x00" + m.Description + "\x00")
	}
	return b.String()
}

// syncMenuLocked, after a turn of chat ch ended, gives the chat its own
// command menu (setMyCommands with BotCommandScopeChat) when its runner is
// an agent with commands for the chat and they changed since the menu
// last set: at most one call per chat at a time, in the background
// (tracked by wg); a failure is logged and tried again after the next
// turn. Called with c.mu held.
func (c *Channel) syncMenuLocked(ch *chat) {
	a, ok := c.eng.RunnerOf(config.ChannelTelegram).(conv.Agent)
	if !ok || ch.menuBusy || c.closed {
		return
	}
	ch.menuBusy = true
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		menu := agentMenu(a, ch.key)
		key := menuKey(menu)
		c.mu.Lock()
		same := key == ch.menu
		c.mu.Unlock()
		var err error
		if menu != nil && !same {
			ctx, cancel := context.WithTimeout(c.baseCtx, menuTimeout)
			_, err = c.bot.SetMyCommands(ctx, &bot.SetMyCommandsParams{Commands: menu, Scope: &models.BotCommandScopeChat{ChatID: ch.id}})
			cancel()
			if err != nil {
				c.log.Warn("telegram: setMyCommands for the chat failed; its menu lacks the agent's commands", "chat", ch.id, "err", c.red.err(err))
			}
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		ch.menuBusy = false
		if menu != nil && err == nil {
			ch.menu = key
		}
	}()
}
