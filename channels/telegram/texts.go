package telegram

import (
	"fmt"
	"strings"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner/demo"
)

// The texts a user reads that are not engine messages. They are plain text.
const (
	textEdited        = "✏️ Edits are not picked up — send the corrected text as a new message."
	textNotText       = "📎 I can only read text messages. Please type your request."
	textEmpty         = "Send me some text and I'll pass it on. /help lists the commands."
	textRestarting    = "⚠️ The gateway is restarting — please send that again in a minute."
	textCannotStart   = "⚠️ Sorry — I couldn't start on that request. Please try again later."
	textNothingToStop = "Nothing is running — there is nothing to stop."
	textStillStopping = "⏳ Already stopping — waiting for the work to end."
	textNotOwner      = "Only the person who sent that request can stop it."
	textCannotStop    = "⚠️ Sorry — I couldn't stop the request. Please try again."
	textNew           = "🆕 New conversation — earlier messages are forgotten."
	textIdle          = "💤 Nothing is running. Send a message to start."
)

// botCommands is the command menu registered with setMyCommands.
var botCommands = []models.BotCommand{
	{Command: "stop", Description: "Stop the request that is running"},
	{Command: "status", Description: "Show the running step and the time left"},
	{Command: "new", Description: "Start a new conversation"},
	{Command: "help", Description: "How this bot works"},
}

func tooLongText(n, limit int) string {
	return fmt.Sprintf("✂️ That message is too long (%d characters; the limit is %d). Please shorten it or split it.", n, limit)
}

// helpText describes the bot, its commands and the turn limits in force.
func helpText(c *config.Config) string {
	tg := c.Channels.Telegram
	s := c.TurnSettings(config.ChannelTelegram, 0)
	var b strings.Builder
	b.WriteString("I pass your messages to an assistant and answer when it is done. While it works you see “typing…”")
	if tg.ShowSteps {
		b.WriteString(", a line for each tool it uses")
	}
	b.WriteString(", and a “⏳ Still working” note if one step takes long.\n\n")
	b.WriteString("Commands:\n")
	b.WriteString("/stop — stop the request that is running\n")
	b.WriteString("/status — what is running, and the time left before each limit\n")
	b.WriteString("/new — start a new conversation (earlier messages are forgotten)\n")
	b.WriteString("/help — this help\n\n")
	fmt.Fprintf(&b, "A request is stopped after %s", messages.Duration(s.Timeout))
	if s.StepTimeout > 0 {
		fmt.Fprintf(&b, ", or after %s without progress", messages.Duration(s.StepTimeout))
	}
	b.WriteString(".")
	if c.RunnerFor(config.ChannelTelegram) == config.RunnerDemo {
		b.WriteString("\n\n")
		b.WriteString(demo.HelpText)
	}
	return b.String()
}

// statusText describes the chat's running turn: its current step and how
// long it has run, the turn's age, and the time left before each deadline.
func (c *Channel) statusText(ch *chat) string {
	run, ok := c.eng.Active(ch.key)
	if !ok {
		return textIdle
	}
	s := run.Snapshot()
	d := func(x int64) messages.Duration { return messages.Duration(max(x, 0)) }
	var b strings.Builder
	if s.State != abort.StateRunning.String() {
		fmt.Fprintf(&b, "⏹️ Stopping (%s) — waiting for the work to end; the request has run for %s.", reasonText(s.StopReason), d(int64(s.Elapsed)))
		return b.String()
	}
	switch {
	case !s.CurrentStep.IsZero():
		fmt.Fprintf(&b, "⏳ Working — step %d: %s, running for %s.", s.CurrentStep.Seq, s.CurrentStep.Label(), d(int64(s.StepElapsed)))
	case !s.LastStep.IsZero():
		fmt.Fprintf(&b, "⏳ Working — last finished step: %s.", s.LastStep.Label())
	default:
		b.WriteString("⏳ Working — no step has started yet.")
	}
	fmt.Fprintf(&b, "\nThe request has run for %s.", d(int64(s.Elapsed)))
	if s.Paused {
		b.WriteString("\n⏸️ Paused — waiting for a person; the no-progress clock is stopped.")
	}
	b.WriteString("\nTime left:")
	if run.Settings.StepTimeout > 0 && !s.Paused {
		fmt.Fprintf(&b, "\n• %s before the no-progress limit (%s)", d(int64(s.UntilStep)), messages.Duration(run.Settings.StepTimeout))
	}
	fmt.Fprintf(&b, "\n• %s before the time limit (%s)", d(int64(s.UntilWall)), messages.Duration(run.Settings.Timeout))
	if run.Settings.MaxTurnTime > 0 {
		fmt.Fprintf(&b, "\n• %s before the hard maximum (%s)", d(int64(s.UntilCeiling)), messages.Duration(run.Settings.MaxTurnTime))
	}
	b.WriteString("\nSend /stop to stop it.")
	return b.String()
}

// reasonText names a stop reason in words.
func reasonText(r event.StopReason) string {
	switch r {
	case event.ReasonTimeout:
		return "time limit reached"
	case event.ReasonStepTimeout:
		return "no progress"
	case event.ReasonMaxTurnTime:
		return "hard maximum reached"
	case event.ReasonUser:
		return "stopped by /stop"
	case event.ReasonShutdown:
		return "gateway shutting down"
	}
	return string(r)
}
