package gateway

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/turnguard/turnguard/config"
)

// TestRunIDNamespaces (issue 19): a run id is also its message's
// idempotency key, and Telegram's are "tg-<chat>-<message>". A message of
// another channel (a WebSocket client's idempotencyKey) in that namespace
// is refused before the idempotency lookup: it neither takes Telegram
// message 950's run (which then runs) nor learns of one that exists.
func TestRunIDNamespaces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, nil)
		ctx := context.Background()
		ws := func(runID string) error {
			_, err := v.e.Send(ctx, SendRequest{SessionKey: "main", Channel: config.ChannelWS, RunID: runID, Text: "/steps say:mine", Owner: "conn1"})
			return err
		}
		for _, id := range []string{"tg-1001-950", "tg-"} {
			if err := ws(id); !errors.Is(err, ErrReservedRunID) {
				t.Fatalf("ws message with run id %q: %v, want ErrReservedRunID", id, err)
			}
		}
		ack, err := v.e.Send(ctx, SendRequest{SessionKey: "telegram:1001", Channel: config.ChannelTelegram, ChatRef: "1001",
			RunID: "tg-1001-950", Text: "/steps say:Hello"})
		if err != nil || ack.Status != StatusStarted {
			t.Fatalf("Telegram message 950: %+v, %v; want it started", ack, err)
		}
		if err := ws("tg-1001-950"); !errors.Is(err, ErrReservedRunID) {
			t.Fatalf("ws message repeating Telegram's run id: %v, want ErrReservedRunID", err)
		}
		if err := ws("TG-1001-950x"); err != nil {
			t.Fatalf("a ws key outside the namespace: %v", err)
		}
		synctest.Wait()
		if n := strings.Count(v.sink.transcript(), "turn_started"); n != 2 {
			t.Fatalf("%d turns started, want Telegram's and the ws one outside the namespace:\n%s", n, v.sink.transcript())
		}
	})
}
