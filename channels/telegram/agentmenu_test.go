package telegram

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner/acp"
	"github.com/turnguard/turnguard/runner/demo"
)

// chatMenu is a setMyCommands call scoped to one chat (fakeAPI.chatMenus).
type chatMenu struct {
	chat     int64
	commands []models.BotCommand
}

// commandsRunner is the demo runner with commands of its own per session
// key, as the ACP runner has its agent's (conv.Agent).
type commandsRunner struct {
	*demo.Runner
	mu   sync.Mutex
	cmds []acp.Command
}

func (r *commandsRunner) Commands(string) []acp.Command {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.cmds)
}

func (r *commandsRunner) Modes(string) (acp.Modes, bool) { return acp.Modes{}, true }

func (r *commandsRunner) SetMode(context.Context, string, string) error { return acp.ErrNoModes }

// TestAgentCommandsMenu: after a turn, a chat whose runner has commands
// gets its own command menu (setMyCommands scoped to the chat): the
// gateway's commands first, then /mode, then the agent's, one named like
// a gateway command dropped; the same menu is not set again after the next
// turn; changed commands are.
func TestAgentCommandsMenu(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rn := &commandsRunner{Runner: demo.New(), cmds: []acp.Command{{Name: "echo", Description: "Say it back"}, {Name: "stop", Description: "the agent's stop"}, {Name: "plan"}}}
		h := newHarness(t, setup{runner: rn})
		defer h.stop()
		h.say(alice, "hello")
		h.advance(5 * time.Second)
		h.say(alice, "again")
		h.advance(5 * time.Second)
		want := append(slices.Clone(botCommands),
			models.BotCommand{Command: "mode", Description: messages.MenuModeDescription},
			models.BotCommand{Command: "echo", Description: "Say it back"},
			models.BotCommand{Command: "plan", Description: messages.MenuAgentCommand})
		h.api.mu.Lock()
		got := slices.Clone(h.api.chatMenus)
		h.api.mu.Unlock()
		if len(got) != 1 || got[0].chat != alice || !slices.Equal(got[0].commands, want) {
			t.Fatalf("chat menus set %+v, want once for %d: %+v", got, alice, want)
		}

		rn.mu.Lock()
		rn.cmds = rn.cmds[:1]
		rn.mu.Unlock()
		h.say(alice, "once more")
		h.advance(5 * time.Second)
		h.api.mu.Lock()
		got = slices.Clone(h.api.chatMenus)
		h.api.mu.Unlock()
		if len(got) != 2 || !slices.Equal(got[1].commands, want[:len(want)-1]) {
			t.Errorf("after the commands changed: %+v", got)
		}
	})
}
