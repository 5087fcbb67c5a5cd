package gateway

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/internal/faketime"
	"github.com/turnguard/turnguard/runner"
)

func sessionKeys(e *Engine) map[string]bool {
	keys := map[string]bool{}
	for _, s := range e.Sessions() {
		keys[s.Key] = true
	}
	return keys
}

// TestSessionsAreEvictedWhenIdleOrOverTheCap: any client can create
// sessions; the engine keeps at most server.maxSessions, drops those unused
// for server.sessionIdleSeconds, never drops one with an active turn, and
// reloads an evicted session's history from the store.
func TestSessionsAreEvictedWhenIdleOrOverTheCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &storedHistory{}
		c := testConfig(t, func(c *config.Config) {
			c.Server.MaxSessions = 3
			c.Server.SessionIdleSeconds = 60
		})
		e, err := New(Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": blockingRunner}, History: h.load})
		if err != nil {
			t.Fatal(err)
		}
		e.Start(context.Background())
		defer e.Shutdown(context.Background())
		ctx := context.Background()

		// "busy" has a turn that runs throughout; it is the least recently
		// used session, and is never evicted.
		if _, err := e.Send(ctx, SendRequest{SessionKey: "busy", Channel: "ws", RunID: "busy-1", Text: "work"}); err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			e.History(ctx, fmt.Sprintf("s%d", i), 0)
		}
		keys := sessionKeys(e)
		if len(keys) != 3 || !keys["busy"] || !keys["s9"] || !keys["s8"] {
			t.Fatalf("over the cap: sessions %v, want busy, s8, s9", keys)
		}
		loads := h.calls.Load()
		if _, msgs := e.History(ctx, "s0", 0); len(msgs) != len(stored) || h.calls.Load() != loads+1 {
			t.Fatalf("evicted session s0: %d messages after %d loads, want it reloaded from the store", len(msgs), h.calls.Load()-loads)
		}

		faketime.Advance(61 * time.Second)
		e.History(ctx, "fresh", 0)
		keys = sessionKeys(e)
		if len(keys) != 2 || !keys["busy"] || !keys["fresh"] {
			t.Fatalf("after 61s idle: sessions %v, want busy and fresh", keys)
		}
		if _, busy := e.Active("busy"); !busy {
			t.Fatal("the busy session lost its turn")
		}
	})
}
