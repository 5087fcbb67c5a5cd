package ws

import (
	"fmt"
	"slices"
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

// A client that stops reading while a run streams text, runs a tool and
// streams again gets the run's frames in its order when it reads again:
// every payload seq higher than the last, and the text streamed after the
// tool never in a delta before the tool's events (a later delta is merged
// into a queued one only when no other frame of the run is queued after
// it).
func TestSlowClientKeepsTheRunsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) { c.Server.SendQueue = 64 }})
		c, _ := e.connect("tui", "")
		c.request("chat.send", map[string]any{"sessionKey": "main", "message": "/steps llm:1s web_search:100ms llm:1s say:end",
			"idempotencyKey": "order"})
		faketime.Advance(5 * time.Second)
		synctest.Wait()

		var last float64
		var order []string
		toolStarted := false
		for {
			f := c.read()
			if f.str("runId") != "order" || (f.Event != "agent" && f.Event != "chat") {
				continue
			}
			seq, _ := f.get("seq").(float64)
			if seq <= last {
				t.Fatalf("%s frame with seq %v after %v: %s", f.Event, seq, last, f.Payload)
			}
			last = seq
			switch {
			case f.Event == "agent" && f.str("stream") == "tool" && f.str("data.phase") == "start":
				toolStarted = true
				order = append(order, "tool start")
			case f.Event == "chat" && f.str("state") == "delta":
				full := f.str("message.content.0.text")
				if !toolStarted && strings.Count(full, "Thinking") > 1 {
					t.Fatalf("a delta before the tool started carries the text streamed after it: %q", full)
				}
				order = append(order, "delta")
			case f.Event == "chat" && f.str("state") == "final":
				order = append(order, "final")
				if !slices.Contains(order, "tool start") {
					t.Fatalf("frames of the run: %v, no tool start", order)
				}
				return
			}
		}
	})
}
