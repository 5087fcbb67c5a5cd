package ws

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
)

// TestChatHistoryUnavailableWhileTheStoreIsDown (issue 20, defect 7): with
// the store down, chat.history of a session this gateway has not loaded
// yet is refused with UNAVAILABLE, retryable, in words — never answered as
// an empty conversation. Once the store answers, the history is there.
func TestChatHistoryUnavailableWhileTheStoreIsDown(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	e := newTCPEnv(t, envOpts{history: func(ctx context.Context, key string, limit int) ([]gateway.Message, error) {
		if down.Load() {
			return nil, errors.New("dial tcp 10.0.0.5:5432: connection refused")
		}
		return []gateway.Message{{Role: "user", Text: "hello", Time: time.Now()}, {Role: "assistant", Text: "hi", StopReason: "stop", Time: time.Now()}}, nil
	}})
	c, _ := e.connect("tui", "")
	r := c.call("chat.history", map[string]any{"sessionKey": "main"})
	if r.OK || r.Error == nil || r.Error.Code != CodeUnavailable || !r.Error.Retryable ||
		r.Error.Message != messages.HistoryUnavailable || fmt.Sprint(r.Error.Details) != "map[code:HISTORY_UNAVAILABLE]" {
		t.Fatalf("chat.history with the store down: %s", r.raw)
	}
	down.Store(false)
	if r := c.call("chat.history", map[string]any{"sessionKey": "main"}); !r.OK || len(r.get("messages").([]any)) != 2 {
		t.Fatalf("chat.history once the store answers: %s", r.raw)
	}
}
