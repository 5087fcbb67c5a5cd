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

// newStoredEngine starts an engine on rn whose history loader is h; the
// test's cleanup shuts it down.
func newStoredEngine(t *testing.T, h *storedHistory, rn runner.Runner, adjust func(*config.Config)) *Engine {
	t.Helper()
	e, err := New(Options{Config: config.NewSource(testConfig(t, adjust)), Runners: map[string]runner.Runner{"demo": rn}, History: h.load})
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	t.Cleanup(func() { e.Shutdown(context.Background()) })
	return e
}

// TestSessionsAreEvictedWhenIdleOrOverTheCap: any client can create
// sessions; the engine keeps at most server.maxSessions, drops those unused
// for server.sessionIdleSeconds, never drops one with an active turn, and
// reloads an evicted session's history from the store.
func TestSessionsAreEvictedWhenIdleOrOverTheCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &storedHistory{}
		e := newStoredEngine(t, h, blockingRunner, func(c *config.Config) {
			c.Server.MaxSessions = 3
			c.Server.SessionIdleSeconds = 60
		})
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
		if _, msgs, _ := e.History(ctx, "s0", 0); len(msgs) != len(stored) || h.calls.Load() != loads+1 {
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

// TestSessionIDSurvivesEviction: a client sees the same sessionId for a
// conversation whose history is unchanged, even when the session was
// evicted while idle and reloaded from the store; only a reset changes it
// (and the reset id survives eviction too).
func TestSessionIDSurvivesEviction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &storedHistory{}
		e := newStoredEngine(t, h, blockingRunner, func(c *config.Config) { c.Server.SessionIdleSeconds = 60 })
		ctx := context.Background()
		// evictedID lets "a" idle out, touches it again and returns its id;
		// it fails unless "a" was really evicted (its history reloaded).
		evictedID := func(step string) string {
			faketime.Advance(61 * time.Second)
			e.History(ctx, "other", 0) // evicts "a"
			if sessionKeys(e)["a"] {
				t.Fatalf("%s: session a was not evicted", step)
			}
			loads := h.calls.Load()
			id, _, _ := e.History(ctx, "a", 0)
			if h.calls.Load() != loads+1 {
				t.Fatalf("%s: session a was not reloaded", step)
			}
			return id
		}
		first, _, _ := e.History(ctx, "a", 0)
		if other, _, _ := e.History(ctx, "b", 0); other == first {
			t.Fatalf("sessions a and b share the id %s", first)
		}
		if again := evictedID("idle"); again != first {
			t.Fatalf("sessionId after eviction %s, was %s", again, first)
		}
		reset := e.Reset("a").ID
		if reset == first {
			t.Fatal("reset kept the sessionId")
		}
		if again := evictedID("after reset"); again != reset {
			t.Fatalf("sessionId of a reset session after eviction %s, was %s", again, reset)
		}
	})
}
