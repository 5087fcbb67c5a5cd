package conv

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
)

// QueueControl is what /queue asks of the engine (*gateway.Engine): the
// session's busy rules and queue, and its own busy mode. An engine that is
// not one answers /queue with the configured rules only.
type QueueControl interface {
	QueueInfo(ctx context.Context, sessionKey, channel string) (gateway.QueueInfo, error)
	SetBusyMode(ctx context.Context, sessionKey string, mode gateway.BusyMode) error
}

// doQueue carries out /queue (show the session's busy mode, overflow rule
// and queue) and /queue <mode> (set the session's busy mode, kept across
// restarts; /queue default goes back to the configured one).
func doQueue(ctx context.Context, eng Engine, cfg *config.Config, in Inbound) Answer {
	qc, ok := eng.(QueueControl)
	arg := strings.ToLower(commandArg(in.Text))
	if arg == "" {
		var info gateway.QueueInfo
		var err error
		if ok {
			info, err = qc.QueueInfo(ctx, in.SessionKey, in.Channel)
		} else {
			mode, maxQueued := cfg.BusyFor(in.Channel)
			info = gateway.QueueInfo{Mode: gateway.BusyMode(mode), Overflow: cfg.OverflowFor(in.Channel), MaxQueued: maxQueued,
				Debounce: cfg.DebounceFor(in.Channel)}
			var st gateway.TurnStatus
			st, err = eng.StatusOf(ctx, in.SessionKey)
			info.Queue = st.Queue
		}
		if err != nil {
			return Answer{Command: Queue, Err: fmt.Errorf("queue of %s: %w", in.SessionKey, err), Text: ErrorText(err, 0, 0)}
		}
		return Answer{Command: Queue, Text: queueText(info)}
	}
	mode := gateway.BusyMode(arg)
	if arg == messages.BusyModeDefault {
		mode = ""
	} else if !mode.Valid() {
		return Answer{Command: Queue, Err: gateway.ErrInvalidBusyMode, Text: messages.QueueModeUnknown(cutArg(commandArg(in.Text)))}
	}
	if !ok {
		return Answer{Command: Queue, Text: messages.QueueModeFailed, Failed: true,
			Err: fmt.Errorf("busy mode of %s: this engine keeps none", in.SessionKey)}
	}
	if err := qc.SetBusyMode(ctx, in.SessionKey, mode); err != nil && !errors.Is(err, gateway.ErrInvalidBusyMode) {
		return Answer{Command: Queue, Err: fmt.Errorf("setting the busy mode of %s: %w", in.SessionKey, err), Failed: true,
			Text: messages.QueueModeFailed}
	}
	if mode == "" {
		configured, _ := cfg.BusyFor(in.Channel)
		return Answer{Command: Queue, Text: messages.QueueModeDefault(configured)}
	}
	return Answer{Command: Queue, Text: messages.QueueModeSet(string(mode))}
}

// queueText is the answer to /queue for info.
func queueText(info gateway.QueueInfo) string {
	waiting := make([]string, len(info.Queue))
	for i, m := range info.Queue {
		waiting[i] = m.Text
	}
	debounce := ""
	if info.Debounce > 0 {
		debounce = messages.FormatDuration(info.Debounce)
	}
	return messages.QueueView(string(info.Mode), info.Own, info.Overflow, info.MaxQueued, debounce, waiting)
}
