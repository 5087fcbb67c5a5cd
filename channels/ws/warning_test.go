package ws

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
)

// TestBudgetWarningFrame: at 80 % of the wall clock (chat.send timeoutMs
// 10000) a watching client gets one agent lifecycle event with phase
// "warning", the words the person reads and when the turn will be stopped,
// before the stop.
func TestBudgetWarningFrame(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) {
			c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(0)
		}})
		c, _ := e.connect("tui", "")
		c.wait = time.Minute
		start := time.Now()
		c.request("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "w", "timeoutMs": 10000})
		times := readRun(c, "w")
		if got := transcript(c, "w", start, times); !strings.Contains(got, "8s lifecycle:warning\n10s tool:result shell error") ||
			strings.Count(got, "lifecycle:warning") != 1 {
			t.Fatalf("transcript:\n%s\nwant one lifecycle warning at 8 s, before the stop at 10 s", got)
		}
		for _, f := range c.all {
			if f.Event == "agent" && f.str("data.phase") == "warning" {
				if f.str("data.message") != "⏳ Your request will be stopped in 2 s unless it finishes." ||
					f.get("data.deadlineAt") != float64(start.Add(10*time.Second).UnixMilli()) {
					t.Errorf("warning frame %s", f.raw)
				}
			}
		}
	})
}
