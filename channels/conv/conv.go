// Package conv is the conversation core every channel uses: one entry point
// for a message a person sent (Handle), which carries out the conversation
// commands /stop, /status, /new and /help or hands the message to the
// engine, and the words of every answer a person reads that is not a turn's
// own event — the commands' answers, the busy outcomes (queued, collected,
// steered, interrupting, queue full) and the refusals. Telegram, the
// OpenClaw WebSocket protocol and the web chat behave and speak alike
// because they all go through it; a new channel is one package that turns
// its transport into Inbound values and the bus's events into its messages.
//
// A command never starts a turn, is never queued behind one and never
// reaches a runner as a prompt (/mode asks the ACP runner for its modes:
// see Agent). Any other text starting with "/" (a runner's own command such
// as the demo runner's /steps, or an ACP agent's slash command, which ACP
// invokes as prompt text) is not a command here and goes to the runner
// unchanged.
//
// conv sees turns only through values (gateway.TurnStatus,
// gateway.StopResult): it imports no channel, and neither the abort registry
// nor the scheduler (internal/layout checks both).
package conv

import (
	"context"
	"strings"
	"unicode"

	"github.com/turnguard/turnguard/gateway"
)

// Command is a conversation command; None is a message that is not one.
type Command string

// The commands. /start (Telegram's first message) is answered as /help.
const (
	None   Command = ""
	Stop   Command = "stop"
	Status Command = "status"
	New    Command = "new"
	Help   Command = "help"
	// Mode lists or sets the agent's session modes (see Agent).
	Mode Command = "mode"
	// Queue shows the session's busy mode and queue, or sets its busy
	// mode (see QueueControl).
	Queue Command = "queue"
)

// Parse returns the command a message is: its first word, after any
// surrounding spaces, is /stop, /status, /new, /help, /start, /mode or /queue, in any case,
// optionally addressed as /cmd@botname (Telegram's form). forOther is true
// when the first word is a command (ours or not) addressed to another bot
// (any @name when botname is ""): the message is not for this one. Other text, including other
// "/word" commands, is None.
func Parse(text, botname string) (cmd Command, forOther bool) {
	text = strings.TrimSpace(text)
	if !strings.HasPrefix(text, "/") {
		return None, false
	}
	word := text[1:]
	if i := strings.IndexFunc(word, unicode.IsSpace); i >= 0 {
		word = word[:i]
	}
	name, at, hasAt := strings.Cut(word, "@")
	if hasAt && !strings.EqualFold(at, botname) {
		return None, true
	}
	switch strings.ToLower(name) {
	case "stop":
		return Stop, false
	case "status":
		return Status, false
	case "new":
		return New, false
	case "help", "start":
		return Help, false
	case "mode":
		return Mode, false
	case "queue":
		return Queue, false
	}
	return None, false
}

// Engine is what the conversation core needs of the engine
// (*gateway.Engine). It sees turns only as values.
type Engine interface {
	// Send hands a person's message to the engine: it starts a turn, or
	// (the session busy) queues, collects, steers or refuses it per the
	// session's busy mode.
	Send(ctx context.Context, req gateway.SendRequest) (gateway.Ack, error)
	// StatusOf is a snapshot of the session's running turn and queue,
	// wherever they run (in cluster mode: asked of the replica that runs
	// the turn); an *gateway.UnavailableError when that cannot be asked.
	StatusOf(ctx context.Context, sessionKey string) (gateway.TurnStatus, error)
	// Stop aborts the session's running turn and drops its queue.
	Stop(ctx context.Context, sessionKey, requester string, operator bool) (gateway.StopResult, error)
	// Reset starts a fresh conversation for the session.
	Reset(sessionKey string) gateway.SessionInfo
}
