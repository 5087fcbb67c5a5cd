package ws

import (
	"context"
	"strings"
	"testing"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
)

// TestIdempotencyKeyCannotTakeTelegramRun (issue 19): a client's
// idempotencyKey is its run's id, and Telegram's run ids are
// "tg-<chat>-<message>". A chat.send or agent request with a key in
// Telegram's namespace is refused in words (over a real WebSocket), and
// Telegram message 950 then still runs.
func TestIdempotencyKeyCannotTakeTelegramRun(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("tui", "")
	for _, method := range []string{"chat.send", "agent"} {
		r := c.call(method, map[string]any{"sessionKey": "main", "message": "/steps say:mine", "idempotencyKey": "tg-1001-950"})
		if r.OK || r.Error == nil || r.Error.Code != CodeInvalidRequest || !strings.Contains(r.Error.Message, "reserved for Telegram") {
			t.Fatalf("%s with idempotencyKey tg-1001-950: %s", method, r.raw)
		}
	}
	ack, err := e.eng.Send(context.Background(), gateway.SendRequest{SessionKey: "telegram:1001", Channel: config.ChannelTelegram,
		ChatRef: "1001", RunID: "tg-1001-950", Text: "/steps say:Hello"})
	if err != nil || ack.Status != gateway.StatusStarted {
		t.Fatalf("Telegram message 950: %+v, %v; want it started", ack, err)
	}
	if out, ok := e.eng.Wait(context.Background(), "tg-1001-950"); !ok || out.Text != "Hello" {
		t.Fatalf("Telegram message 950 ended %+v, %v", out, ok)
	}
}
