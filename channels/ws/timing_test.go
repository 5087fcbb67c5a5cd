package ws

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"

	"github.com/turnguard/turnguard/internal/faketime"
)

// These tests run inside synctest bubbles over net.Pipe: the gateway's
// timers (ticks, handshake timeout, keepalive, step deadlines) run on fake
// time, so the asserted instants are exact.

func secs(v float64) *float64 { return &v }

func TestTicksEveryIntervalWithGapFreeSeq(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) { c.Server.TickIntervalMs = 2000 }})
		c, _ := e.connect("tui", "")
		start := time.Now()
		var last int64
		for i := 1; i <= 5; i++ {
			f := c.read()
			if f.Event != "tick" {
				t.Fatalf("frame %d: %s, want a tick", i, f.raw)
			}
			if at := time.Since(start); at != time.Duration(i)*2*time.Second {
				t.Fatalf("tick %d at %v, want every 2s", i, at)
			}
			ts := int64(f.get("ts").(float64))
			if last != 0 && ts-last != 2000 {
				t.Fatalf("tick ts step %d ms", ts-last)
			}
			last = ts
			if *f.Seq != uint64(i) {
				t.Fatalf("tick %d has seq %d", i, *f.Seq)
			}
		}
		// Events and ticks share the connection's seq.
		c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps say:hi", "idempotencyKey": "r"})
		c.chat("r", "final")
		faketime.Advance(2 * time.Second)
		c.until("tick", func(f frame) bool { return f.Event == "tick" })
	})
}

func TestHandshakeTimeoutClosesWith1008(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{})
		c := e.connectRaw("")
		c.wait = time.Minute
		start := time.Now()
		c.read() // challenge
		code, reason := c.closed()
		if code != 1008 || reason != "connect timeout" || time.Since(start) != 10*time.Second {
			t.Fatalf("closed %d %q after %v, want 1008 \"connect timeout\" after 10s", code, reason, time.Since(start))
		}
	})
}

// transcript returns the run's events as "<time since start> <event>" lines.
func transcript(c *client, run string, start time.Time, times map[string]time.Time) string {
	var lines []string
	for _, f := range c.all {
		if f.Type != "event" || f.str("runId") != run {
			continue
		}
		at := times[f.raw].Sub(start)
		var l string
		switch f.Event {
		case "chat":
			l = "chat:" + f.str("state")
			if m := f.str("errorMessage"); m != "" {
				l += fmt.Sprintf(" %s %q", f.str("stopReason"), m)
			}
		case "agent":
			l = f.str("stream") + ":" + f.str("data.phase")
			switch f.str("stream") {
			case "tool":
				l += " " + f.str("data.name")
				if f.get("data.isError") == true {
					l += " error"
				}
			case "item":
				l += fmt.Sprintf(" %q %s", f.str("data.title"), f.str("data.status"))
			}
		}
		lines = append(lines, fmt.Sprintf("%v %s", at, l))
	}
	return strings.Join(lines, "\n")
}

// readRun reads frames until the run's lifecycle end (or error), recording
// when each arrived.
func readRun(c *client, run string) map[string]time.Time {
	times := map[string]time.Time{}
	for {
		f := c.read()
		times[f.raw] = time.Now()
		if f.Event == "agent" && f.str("runId") == run && f.str("stream") == "lifecycle" &&
			(f.str("data.phase") == "end" || f.str("data.phase") == "error") {
			return times
		}
	}
}

func TestLongStepKeepaliveAndProgressNotice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) {
			c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(30)
			c.Agents.Defaults.ProgressRepeatSeconds = secs(50)
		}})
		c, _ := e.connect("tui", "")
		c.wait = time.Minute
		start := time.Now()
		c.request("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:95s say:ok", "idempotencyKey": "long"})
		times := readRun(c, "long")
		want := `0s lifecycle:start
0s tool:start shell
20s lifecycle:running
30s item:update "⏳ Still working — shell has been running for 30 s…" running
30s lifecycle:running
50s lifecycle:running
1m10s lifecycle:running
1m20s item:update "⏳ Still working — shell has been running for 1 min 20 s…" running
1m20s lifecycle:running
1m35s tool:result shell
1m35s item:end "shell" completed
1m35s chat:delta
1m35s chat:final
1m35s lifecycle:end`
		if got := transcript(c, "long", start, times); got != want {
			t.Fatalf("transcript:\n%s\nwant:\n%s", got, want)
		}
	})
}

// TestLongLLMStepHasNoItemBlock: an LLM call has no tool line, so its
// progress notice is not an item (which would open a block in the middle of
// the streamed reply); lifecycle "running" events still keep the TUI's
// watchdog quiet.
func TestLongLLMStepHasNoItemBlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) {
			c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(30)
			c.Agents.Defaults.ProgressRepeatSeconds = secs(50)
		}})
		c, _ := e.connect("tui", "")
		c.wait = time.Minute
		start := time.Now()
		c.request("chat.send", map[string]any{"sessionKey": "main", "message": "/steps llm:40s", "idempotencyKey": "llm"})
		times := readRun(c, "llm")
		got := transcript(c, "llm", start, times)
		if strings.Contains(got, "item:") {
			t.Fatalf("an LLM step's progress opened an item block:\n%s", got)
		}
		if !strings.Contains(got, "30s lifecycle:running") {
			t.Fatalf("no lifecycle running at the progress notice:\n%s", got)
		}
	})
}

func TestStepTimeoutShownAsAbortedAndStored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) {
			c.Agents.Defaults.StepTimeoutSeconds = secs(2)
			c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(0)
		}})
		c, _ := e.connect("tui", "")
		start := time.Now()
		c.request("chat.send", map[string]any{"sessionKey": "main", "message": "/steps web_search:300ms shell:hang", "idempotencyKey": "stuck"})
		times := readRun(c, "stuck")
		notice := "⚠️ No progress for 2 s — shell never finished (last completed: web_search). The task may be stuck. Retry or ask for a simpler approach."
		want := `0s lifecycle:start
0s tool:start web_search
300ms tool:result web_search
300ms tool:start shell
2.3s tool:result shell error
2.3s chat:aborted step_timeout "` + notice + `"
2.3s lifecycle:end`
		if got := transcript(c, "stuck", start, times); got != want {
			t.Fatalf("transcript:\n%s\nwant:\n%s", got, want)
		}
		synctest.Wait()
		h := c.call("chat.history", map[string]any{"sessionKey": "agent:main:main"})
		if h.str("messages.1.content.0.text") != notice || h.str("messages.1.role") != "assistant" || h.str("messages.1.stopReason") != "step_timeout" {
			t.Fatalf("history %s", h.raw)
		}
	})
}

func TestChatSendTimeoutMs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{})
		c, _ := e.connect("cli", "")
		start := time.Now()
		c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "t", "timeoutMs": 3000})
		f := c.chat("t", "aborted")
		if time.Since(start) != 3*time.Second || f.str("stopReason") != "timeout" ||
			!strings.HasPrefix(f.str("errorMessage"), "⚠️ This request was stopped at its time limit of 3 s") {
			t.Fatalf("after %v: %s", time.Since(start), f.raw)
		}
	})
}

func TestShutdownAbortsTurnsThenCloses1012(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{})
		c, _ := e.connect("tui", "")
		c.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "s"})
		go func() {
			e.eng.Shutdown(context.Background())
			e.srv.Shutdown(context.Background())
		}()
		ab := c.chat("s", "aborted")
		if ab.str("stopReason") != "shutdown" || !strings.Contains(ab.str("errorMessage"), "shutting down") {
			t.Fatalf("aborted %s", ab.raw)
		}
		c.until("shutdown event", func(f frame) bool { return f.Event == "shutdown" })
		if code, _ := c.closed(); code != 1012 {
			t.Fatalf("close code %d, want 1012", code)
		}
		synctest.Wait()
		if n := e.srv.Clients(); n != 0 {
			t.Fatalf("%d clients after shutdown", n)
		}
		if _, resp, err := e.dial(""); err == nil || resp == nil || resp.StatusCode != 503 {
			t.Fatalf("dial after shutdown: %v %v, want 503", err, resp)
		}
	})
}

func TestRateLimitAndFlood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) {
			c.Server.RequestsPerSecond = 2
			c.Server.RequestBurst = 3
		}})
		c, _ := e.connect("cli", "")
		var got []string
		for range 5 {
			r := c.call("health", nil)
			if r.OK {
				got = append(got, "ok")
			} else {
				got = append(got, fmt.Sprintf("%s retryable=%v after=%dms", r.Error.Code, r.Error.Retryable, r.Error.RetryAfterMs))
			}
		}
		want := "ok ok ok UNAVAILABLE retryable=true after=500ms UNAVAILABLE retryable=true after=500ms"
		if strings.Join(got, " ") != want {
			t.Fatalf("got %v\nwant %s", got, want)
		}
		faketime.Advance(500 * time.Millisecond) // one token back
		if r := c.call("health", nil); !r.OK {
			t.Fatalf("after refill: %s", r.raw)
		}
		// A sustained flood: 100 refusals in a row close the connection.
		for range 120 {
			c.request("health", nil)
		}
		code, reason := c.closed()
		if code != 1008 || reason != "rate limit exceeded" {
			t.Fatalf("flood: close %d %q", code, reason)
		}
	})
}

func TestOversizedFrameAfterHello(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) { c.Server.MaxPayloadBytes = 1000 }})
		c, _ := e.connect("cli", "")
		c.call("chat.send", map[string]any{"message": strings.Repeat("x", 500), "idempotencyKey": "fits"})
		c.request("chat.send", map[string]any{"message": strings.Repeat("x", 2000), "idempotencyKey": "too-big"})
		if code, _ := c.closed(); code != 1009 {
			t.Fatalf("close %d, want 1009", code)
		}
	})
}

// An idle client stays connected as long as it answers the pings that go
// out with the ticks; one that answers nothing is dropped after
// 2 × tickIntervalMs + 10 s.
func TestPingsKeepIdleClientsAndDropDeadOnes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) { c.Server.TickIntervalMs = 2000 }})
		alive, _ := e.connect("tui", "")
		dead, _ := e.connect("tui", "")
		dead.ws.SetPingHandler(func(string) error { return nil }) // never pongs
		start := time.Now()
		droppedAfter := make(chan time.Duration, 1)
		dead.ws.SetReadDeadline(time.Time{})
		go func() {
			for {
				if _, _, err := dead.ws.ReadMessage(); err != nil {
					droppedAfter <- time.Since(start)
					return
				}
			}
		}()
		for range 15 { // 30 s of ticks, answering pings while reading
			alive.read()
		}
		if r := alive.call("health", nil); !r.OK {
			t.Fatalf("idle client after 30s: %s", r.raw)
		}
		if d := <-droppedAfter; d != 14*time.Second {
			t.Fatalf("silent client dropped after %v, want 14s", d)
		}
	})
}
