package conv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
)

// Inbound is one message a person sent through a channel.
type Inbound struct {
	SessionKey string
	Channel    string // config.ChannelTelegram, config.ChannelWS, …: picks limits, busy mode and runner
	ChatRef    string // the channel's reference for replies
	// Sender is who sent it: the owner of the turn it starts and the
	// requester of /stop and /new ("" = anyone may stop the turn).
	Sender string
	// Operator may stop anyone's turn.
	Operator bool
	Text     string
	// ID is the message's id in its channel, the run id of the turn it
	// starts: a message delivered twice is one turn ("" = a fresh id).
	ID string
	// Timeout is a per-request wall clock (0 = configured).
	Timeout time.Duration
	// Bot is this bot's name for commands addressed as /cmd@bot: one
	// addressed to another bot is ignored. "" when the channel has no such
	// form: "/cmd@name" is then an ordinary message.
	Bot string
	// MaxChars is the channel's own cap on a message's length, checked
	// before the engine's (0 = only the engine's server.maxMessageChars).
	MaxChars int
	// Progress is the channel's sentence in /help about what a person sees
	// while a turn works ("" for none).
	Progress string
}

// Answer is what Handle did with a message.
type Answer struct {
	// Ignored: the message is a command addressed to another bot (Bot
	// set); nothing was done and nothing is to be said.
	Ignored bool
	// Command is the command carried out; None when the message went to
	// the engine.
	Command Command
	// Text is what to show the person now, "" when the turn's events are
	// the whole answer (a turn that started; a /stop whose stop notice the
	// abort publishes, with nothing dropped).
	Text string
	// Ack is Send's answer (Command None, Err nil).
	Ack gateway.Ack
	// Stopped is what /stop (or the stop of /new) did.
	Stopped gateway.StopResult
	// Err is the engine's refusal or failure, for a channel that answers in
	// its own protocol (errors.As *gateway.BusyError, *gateway.QueueFullError,
	// …) or logs it; Text holds the words either way.
	Err error
	// Failed: Err is a failure of the gateway, not a refusal the words
	// explain — the channel logs it (the person reads only TextCannotStart
	// or TextCannotStop).
	Failed bool
}

// Handle carries out a person's message: a command (see Parse) is done at
// once and never starts a turn; any other message goes to the engine's
// Send. The Answer carries the words to show and what the engine said, so
// a channel can also answer in its own protocol.
func Handle(ctx context.Context, eng Engine, cfg *config.Config, in Inbound) Answer {
	cmd, forOther := Parse(in.Text, in.Bot)
	if forOther && in.Bot != "" {
		return Answer{Ignored: true}
	}
	switch cmd {
	case Stop:
		res, err := eng.Stop(ctx, in.SessionKey, in.Sender, in.Operator)
		a := Answer{Command: Stop, Stopped: res, Err: err, Text: StopText(res, err)}
		if err != nil && !errors.Is(err, gateway.ErrNotOwner) {
			a.Err, a.Failed = fmt.Errorf("stopping the turn of %s: %w", in.SessionKey, err), true
		}
		return a
	case Status:
		st, err := eng.StatusOf(ctx, in.SessionKey)
		if err != nil {
			// "Nothing is running" could be a lie: the turn may run on a
			// replica that cannot be asked now.
			return Answer{Command: Status, Err: fmt.Errorf("status of %s: %w", in.SessionKey, err), Text: ErrorText(err, 0, 0)}
		}
		return Answer{Command: Status, Text: StatusText(st) + agentSessions(ctx, eng, in)}
	case New:
		return doNew(ctx, eng, in)
	case Help:
		return Answer{Command: Help, Text: HelpText(cfg, in.Channel, in.Progress) + agentHelp(agentFor(ctx, eng, in), in.SessionKey)}
	case Mode:
		return doMode(ctx, eng, in)
	case Queue:
		return doQueue(ctx, eng, cfg, in)
	}
	text := in.Text
	if in.Bot != "" && strings.HasPrefix(text, "/") {
		text = stripBotName(text) // "/steps@bot x" → "/steps x": the runner's own commands
	}
	if n := utf8.RuneCountInString(text); in.MaxChars > 0 && n > in.MaxChars {
		return Answer{Text: TooLongText(n, in.MaxChars), Err: fmt.Errorf("%d characters, limit %d: %w", n, in.MaxChars, gateway.ErrTooLong)}
	}
	ack, err := eng.Send(ctx, gateway.SendRequest{
		SessionKey: in.SessionKey, Channel: in.Channel, ChatRef: in.ChatRef, RunID: in.ID,
		Text: text, Timeout: in.Timeout, Owner: in.Sender,
	})
	if err != nil {
		words := ErrorText(err, utf8.RuneCountInString(text), cfg.Server.MaxMessageChars)
		return Answer{Ack: ack, Err: err, Text: words, Failed: words == TextCannotStart}
	}
	return Answer{Ack: ack, Text: AckText(ack)}
}

// doNew stops the session's running turn and drops its queue (if the
// sender may), then starts a fresh conversation. A turn someone else owns
// is left alone and nothing is reset (Err gateway.ErrNotOwner).
func doNew(ctx context.Context, eng Engine, in Inbound) Answer {
	// In cluster mode the turn may run on another replica: Stop passes
	// the stop there.
	st, err := eng.StatusOf(ctx, in.SessionKey)
	var res gateway.StopResult
	if err != nil || st.Running || len(st.Queue) > 0 {
		res, err = eng.Stop(ctx, in.SessionKey, in.Sender, in.Operator)
		if errors.Is(err, gateway.ErrNotOwner) {
			return Answer{Command: New, Stopped: res, Err: err, Text: TextNotOwner}
		}
	}
	eng.Reset(in.SessionKey)
	a := Answer{Command: New, Stopped: res, Text: NewText(res.Dropped)}
	if err != nil { // the conversation is fresh anyway; the channel logs why the stop failed
		a.Err, a.Failed = fmt.Errorf("stopping the turn of %s for /new: %w", in.SessionKey, err), true
	}
	return a
}

// stripBotName removes "@bot" from a leading command word.
func stripBotName(text string) string {
	end := strings.IndexFunc(text, unicode.IsSpace)
	if end < 0 {
		end = len(text)
	}
	if at := strings.IndexByte(text[:end], '@'); at >= 0 {
		return text[:at] + text[end:]
	}
	return text
}
