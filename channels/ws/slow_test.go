package ws

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"

	"github.com/turnguard/turnguard/internal/faketime"
)

// A client that stops reading while a reply streams loses deltas (merged
// into one carrying all their text) but never the final.
func TestSlowClientLosesDeltasNotFinal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) { c.Server.SendQueue = 8 }})
		c, _ := e.connect("tui", "")
		// Two llm steps stream 2 × 6 chunks over 2s; the client reads
		// nothing for 5s (the pipe has no buffer: the writer blocks on the
		// first frame at once).
		c.request("chat.send", map[string]any{"sessionKey": "main", "message": "/steps llm:1s llm:1s say:end", "idempotencyKey": "slow"})
		faketime.Advance(5 * time.Second)
		synctest.Wait()

		var deltas int
		var text string
		for {
			f := c.read()
			if f.Event == "chat" && f.str("state") == "delta" {
				deltas++
				text += f.str("deltaText")
				if full := f.str("message.content.0.text"); full != text {
					t.Fatalf("delta %d: full text %q, deltaText so far %q", deltas, full, text)
				}
			}
			if f.Event == "chat" && f.str("state") == "final" {
				if f.str("message.content.0.text") != text {
					t.Fatalf("final %q, deltas %q", f.str("message.content.0.text"), text)
				}
				break
			}
		}
		if want := "Thinking about the next step. Thinking about the next step. end"; text != want {
			t.Fatalf("text %q", text)
		}
		if deltas >= 11 || e.srv.stats.droppedDeltas.Load() == 0 {
			t.Fatalf("%d deltas delivered, %d dropped: the slow client should have lost some", deltas, e.srv.stats.droppedDeltas.Load())
		}
	})
}

// A client that does not read while frames that cannot be dropped pile up
// is closed with 1013 "slow consumer"; the others are not affected.
func TestSlowConsumerClosedWith1013(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) { c.Server.SendQueue = 4 }})
		slow, _ := e.connect("tui", "")
		slow.call("sessions.subscribe", map[string]any{})
		fast, _ := e.connect("tui", "")
		for i := range 5 {
			run := fmt.Sprintf("r%d", i)
			fast.call("chat.send", map[string]any{"sessionKey": "s" + run, "message": "/steps a:10ms b:10ms", "idempotencyKey": run})
			fast.chat(run, "final")
		}
		code, reason := slow.closed()
		if code != 1013 || reason != "slow consumer" {
			t.Fatalf("slow client closed %d %q", code, reason)
		}
		if !strings.Contains(e.logs.String(), "closing slow websocket client") {
			t.Fatal("no log line for the slow consumer")
		}
		if r := fast.call("health", nil); !r.OK {
			t.Fatalf("fast client after: %s", r.raw)
		}
		synctest.Wait()
		if n := e.srv.Clients(); n != 1 {
			t.Fatalf("%d clients, want 1", n)
		}
	})
}
