package telegram

import (
	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/messages"
)

// The texts a user reads that are not engine messages and are Telegram's
// own (the command answers are package conv's). They are plain text.
const (
	textEdited  = "✏️ Edits are not picked up — send the corrected text as a new message."
	textNotText = "📎 I can only read text messages. Please type your request."

	// The words every channel shares (package conv).
	textEmpty         = conv.TextEmpty
	textNothingToStop = conv.TextNothingToStop
	textNotOwner      = conv.TextNotOwner
	textStillStopping = conv.TextStillStopping
	textNew           = conv.TextNew
	textIdle          = conv.TextIdle
)

// botCommands is the command menu registered with setMyCommands.
var botCommands = botMenu(conv.GatewayMenu)

var tooLongText = conv.TooLongText

// helpProgress is what /help says a Telegram user sees while a turn works.
func helpProgress(c *config.Config) string {
	tg := c.Channels.Telegram
	return messages.TelegramProgress(tg.Streaming, tg.ShowSteps)
}

// helpText describes the bot, its commands and the turn limits in force.
func helpText(c *config.Config) string {
	return conv.HelpText(c, config.ChannelTelegram, helpProgress(c))
}
