package ws

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner"
)

// streamer is a runner that streams the number of 100-byte chunks its
// message names, as fast as it can, and returns.
var streamer = runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
	n, _ := strconv.Atoi(strings.Fields(turn.Message)[0])
	for i := range n {
		cb.Delta(fmt.Sprintf("%08d", i) + strings.Repeat("x", 91) + " ")
	}
	return runner.Result{}, ctx.Err()
})

// bigReplies lifts the reply cap (agents.defaults.maxReplyChars) above the
// longest streamed reply here (16,000 × 100 B), so nothing is cut.
func bigReplies(c *config.Config) { c.Agents.Defaults.MaxReplyChars = 2_000_000 }

// streamedText is the reply streamer sends for n chunks.
func streamedText(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(fmt.Sprintf("%08d", i) + strings.Repeat("x", 91) + " ")
	}
	return b.String()
}

// TestStreamingIsLinearInTheReply: 4,000 chunks of 100 B (a 400 KB reply)
// streamed to a watcher. Each chat delta must carry the whole text so far
// (the TUI draws message, not deltaText), so sending one delta per chunk
// put O(reply²) bytes on the wire — 61 MB for this 400 KB reply before —
// and encoded them all.
// The watcher now gets a few deltas whose deltaTexts still add up to the
// reply, each with the full text so far, then the final; the bytes on the
// wire stay a small multiple of the reply.
func TestStreamingIsLinearInTheReply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 4000
		e := newPipeEnv(t, envOpts{runner: streamer, adjust: bigReplies})
		c, _ := e.connect("tui", "")
		// The run's first frames may come before the response: read them all.
		c.request("chat.send", map[string]any{"sessionKey": "main", "message": strconv.Itoa(n), "idempotencyKey": "stream"})
		want := streamedText(n)
		var text string
		var deltas, wire int
		for {
			f := c.read()
			wire += len(f.raw)
			if f.Event != "chat" {
				continue
			}
			if f.str("state") == "delta" {
				deltas++
				text += f.str("deltaText")
				if full := f.str("message.content.0.text"); full != text {
					t.Fatalf("delta %d: full text (%d bytes) is not the deltaTexts so far (%d bytes)", deltas, len(full), len(text))
				}
				continue
			}
			if f.str("state") != "final" || f.str("message.content.0.text") != want {
				t.Fatalf("run ended %s with %d bytes, want final with %d", f.str("state"), len(f.str("message.content.0.text")), len(want))
			}
			break
		}
		if text != want {
			t.Fatalf("the deltaTexts add up to %d bytes, want the reply's %d", len(text), len(want))
		}
		t.Logf("%d chunks → %d deltas, %d bytes on the wire for a %d-byte reply", n, deltas, wire, len(want))
		if wire > 8*len(want) {
			t.Fatalf("%d bytes on the wire for a %d-byte reply (%d deltas): quadratic", wire, len(want), deltas)
		}
	})
}

// BenchmarkStreamDeltas measures a turn that streams n × 100 B chunks to
// one watcher through the real path: runner callback → engine → bus → ws
// server → a loopback socket → a gorilla client that reads every frame
// until the final. "per-delta" is the old behaviour (every chunk encoded
// and sent with the full text so far) as the baseline.
func BenchmarkStreamDeltas(b *testing.B) {
	cases := []struct {
		name     string
		n        int
		interval Options
	}{
		{"per-delta/n=2000", 2000, Options{DeltaInterval: -1}},
		{"per-delta/n=4000", 4000, Options{DeltaInterval: -1}},
		{"throttled/n=2000", 2000, Options{}},
		{"throttled/n=4000", 4000, Options{}},
		{"throttled/n=16000", 16000, Options{}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			e := newTCPEnv(b, envOpts{runner: streamer, opts: tc.interval, adjust: bigReplies})
			c, _ := e.connect("tui", "")
			var wire int
			b.ResetTimer()
			for i := range b.N {
				run := fmt.Sprintf("bench-%d", i)
				c.request("chat.send", map[string]any{"sessionKey": "main", "message": strconv.Itoa(tc.n), "idempotencyKey": run})
				c.ws.SetReadDeadline(time.Now().Add(5 * time.Minute)) // the baseline is slow
				final := []byte(`"runId":"` + run + `","sessionKey":"agent:main:main","seq":`)
				for {
					_, data, err := c.ws.ReadMessage()
					if err != nil {
						b.Fatal(err)
					}
					wire += len(data)
					if bytes.Contains(data, final) && bytes.Contains(data, []byte(`"state":"final"`)) {
						break
					}
				}
			}
			b.ReportMetric(float64(wire)/float64(b.N), "wireB/op")
		})
	}
}
