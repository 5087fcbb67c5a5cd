package conv_test

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
)

// Commands addressed to a bot: another bot's are ignored where the channel
// names bots (Telegram); where it does not (WebSocket), "/cmd@name" is an
// ordinary message. A channel's own length cap refuses in words, before
// the engine; a command is never capped.
func TestHandleAddressingAndCaps(t *testing.T) {
	for _, tc := range []struct {
		name, text, bot string
		maxChars        int
		ignored         bool
		cmd             conv.Command
		status          gateway.Status
		words           string
	}{
		{name: "another bot's command", text: "/stop@otherbot", bot: "mybot", ignored: true},
		{name: "this bot's command", text: "/STATUS@MyBot", bot: "mybot", cmd: conv.Status, words: conv.TextIdle},
		{name: "this bot's runner command", text: "/steps@mybot say:hi", bot: "mybot", status: gateway.StatusStarted},
		{name: "no bot names: an ordinary message", text: "/stop@x", status: gateway.StatusStarted},
		{name: "over the channel's cap", text: "123456", maxChars: 5, words: conv.TooLongText(6, 5)},
		{name: "a long command is still a command", text: "/help me please", maxChars: 5, cmd: conv.Help},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src, d := config.NewSource(config.Default()), demo.New()
				eng, err := gateway.New(gateway.Options{Config: src, Runners: map[string]runner.Runner{"demo": d}})
				if err != nil {
					t.Fatal(err)
				}
				eng.Start(context.Background())
				defer eng.Shutdown(context.Background())
				a := conv.Handle(context.Background(), eng, src.Current(), conv.Inbound{
					SessionKey: "k", Channel: "test", Text: tc.text, Bot: tc.bot, MaxChars: tc.maxChars,
				})
				if a.Ignored != tc.ignored || a.Command != tc.cmd || a.Ack.Status != tc.status {
					t.Fatalf("Handle(%q) = ignored %v, command %q, status %q; want %v, %q, %q",
						tc.text, a.Ignored, a.Command, a.Ack.Status, tc.ignored, tc.cmd, tc.status)
				}
				if tc.words != "" && a.Text != tc.words {
					t.Fatalf("Handle(%q) said %q, want %q", tc.text, a.Text, tc.words)
				}
				if tc.status == "" && eng.Status("k").Running {
					t.Fatalf("Handle(%q) started a turn", tc.text)
				}
			})
		})
	}
}

// unreachableOwner is an engine whose sessions' turns run on a replica
// that cannot be asked (cluster mode): StatusOf answers unavailable.
type unreachableOwner struct{ stops int }

func (unreachableOwner) Send(context.Context, gateway.SendRequest) (gateway.Ack, error) {
	return gateway.Ack{}, nil
}

func (unreachableOwner) StatusOf(_ context.Context, key string) (gateway.TurnStatus, error) {
	return gateway.TurnStatus{SessionKey: key}, &gateway.UnavailableError{Cause: gateway.ErrClusterUnavailable}
}

func (u *unreachableOwner) Stop(context.Context, string, string, bool) (gateway.StopResult, error) {
	u.stops++
	return gateway.StopResult{}, nil
}

func (unreachableOwner) Reset(string) gateway.SessionInfo { return gateway.SessionInfo{} }

// /status when the turn's replica cannot be asked says so (try again),
// never "nothing is running"; /new then still passes its stop on (the
// turn may run there).
func TestStatusOfAnUnreachableOwnerIsNotIdle(t *testing.T) {
	eng := &unreachableOwner{}
	cfg := config.Default()
	in := conv.Inbound{SessionKey: "agent:main:x", Channel: "ws", Text: "/status"}
	a := conv.Handle(context.Background(), eng, cfg, in)
	if a.Command != conv.Status || a.Text != messages.Unavailable || a.Err == nil {
		t.Errorf("/status: %+v; want the unavailable words and an error", a)
	}
	in.Text = "/new"
	if a := conv.Handle(context.Background(), eng, cfg, in); a.Command != conv.New || eng.stops != 1 {
		t.Errorf("/new: %+v after %d stops; want the stop passed on", a, eng.stops)
	}
}
