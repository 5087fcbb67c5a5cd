// Package conv owns what every channel does with the conversation commands
// /stop, /status, /new and /help: recognising them in a message (Parse),
// carrying them out against the engine (Stop, New) and the words of their
// answers (the Text… constants, StatusText, HelpText), so Telegram, the
// OpenClaw WebSocket protocol and the web chat behave and speak alike.
//
// A command never starts a turn and never reaches a runner. Any other text
// starting with "/" (a runner's own command such as the demo runner's
// /steps) is not a command here and goes to the runner as before.
// conv imports no channel: channels depend on it, not the other way.
package conv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner/demo"
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
)

// Parse returns the command a message is: its first word, after any
// surrounding spaces, is /stop, /status, /new, /help or /start, in any case,
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
	}
	return None, false
}

// Engine is what the commands need of the engine (*gateway.Engine).
type Engine interface {
	// Active returns the session's running turn, if any.
	Active(sessionKey string) (*abort.Run, bool)
	// Abort stops the session's running turn (runID "") with reason.
	Abort(ctx context.Context, sessionKey, runID string, reason event.StopReason, requester string, operator bool) (gateway.AbortResult, error)
	// Reset starts a fresh conversation for the session.
	Reset(sessionKey string) gateway.SessionInfo
}

// StopResult is what /stop did. Text is the answer in words, "" when the
// stop notice that the abort publishes is the whole answer.
type StopResult struct {
	gateway.AbortResult
	Text string
}

// DoStop aborts the session's running turn with stop reason user, on
// behalf of requester (the turn's owner, or anyone when operator). The
// error is gateway.ErrNotOwner (Text says so) or another failure of the
// engine (Text is TextCannotStop); it is nil when nothing was running.
func DoStop(ctx context.Context, eng Engine, key, requester string, operator bool) (StopResult, error) {
	run, ok := eng.Active(key)
	if !ok {
		return StopResult{Text: TextNothingToStop}, nil
	}
	res, err := eng.Abort(ctx, key, "", event.ReasonUser, requester, operator)
	switch {
	case errors.Is(err, gateway.ErrNotOwner):
		return StopResult{Text: TextNotOwner}, err
	case err != nil:
		return StopResult{Text: TextCannotStop}, fmt.Errorf("stopping the turn of %s: %w", key, err)
	case !res.Aborted && run.State() != abort.StateRunning:
		return StopResult{AbortResult: res, Text: TextStillStopping}, nil
	case !res.Aborted:
		return StopResult{AbortResult: res, Text: TextNothingToStop}, nil
	}
	return StopResult{AbortResult: res}, nil
}

// DoNew stops the session's running turn (if requester may), then starts
// a fresh conversation. It returns the answer in words; the error is
// gateway.ErrNotOwner when the turn is someone else's (nothing was reset).
func DoNew(ctx context.Context, eng Engine, key, requester string, operator bool) (string, error) {
	if _, ok := eng.Active(key); ok {
		if _, err := eng.Abort(ctx, key, "", event.ReasonUser, requester, operator); errors.Is(err, gateway.ErrNotOwner) {
			return TextNotOwner, err
		}
	}
	eng.Reset(key)
	return TextNew, nil
}

// The answers of the commands, in plain text.
const (
	TextNothingToStop = "Nothing is running — there is nothing to stop."
	TextStillStopping = "⏳ Already stopping — waiting for the work to end."
	TextNotOwner      = "Only the person who sent that request can stop it."
	TextCannotStop    = "⚠️ Sorry — I couldn't stop the request. Please try again."
	TextNew           = "🆕 New conversation — earlier messages are forgotten."
	TextIdle          = "💤 Nothing is running. Send a message to start."
)

// HelpText describes the commands and the turn limits in force for
// channel. progress is the channel's sentence about what a user sees while
// a turn works ("" for none).
func HelpText(c *config.Config, channel, progress string) string {
	s := c.TurnSettings(channel, 0)
	var b strings.Builder
	b.WriteString("I pass your messages to an assistant and answer when it is done.")
	if progress != "" {
		b.WriteString(" " + progress)
	}
	b.WriteString("\n\n")
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
	if c.RunnerFor(channel) == config.RunnerDemo {
		b.WriteString("\n\n")
		b.WriteString(demo.HelpText)
	}
	return b.String()
}

// StatusText describes the session's running turn (run, ok from
// Engine.Active): its current step and how long it has run, the turn's
// age, and the time left before each deadline; TextIdle when none runs.
func StatusText(run *abort.Run, ok bool) string {
	if !ok {
		return TextIdle
	}
	s := run.Snapshot()
	d := func(x int64) messages.Duration { return messages.Duration(max(x, 0)) }
	var b strings.Builder
	if s.State != abort.StateRunning.String() {
		fmt.Fprintf(&b, "⏹️ Stopping (%s) — waiting for the work to end; the request has run for %s.", ReasonText(s.StopReason), d(int64(s.Elapsed)))
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

// ReasonText names a stop reason in words.
func ReasonText(r event.StopReason) string {
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
	case event.ReasonSuperseded:
		return "replaced by a newer message"
	}
	return string(r)
}
