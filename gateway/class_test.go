package gateway

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"

	"github.com/turnguard/turnguard/internal/faketime"
)

// TestStatusAndLiveCarryTheClass: /status (Status) and /api/turns (Live)
// say what a running turn is doing, as the scheduler decides it: a step
// that heartbeats is long-running past progressNotifyAfterSeconds, a silent
// one stalled.
func TestStatusAndLiveCarryTheClass(t *testing.T) {
	for _, tt := range []struct {
		script string
		want   []string // at 1 s, at 6 s
	}{
		{"/steps build:1m:hb=1s", []string{"working", "long_running"}},
		{"/steps build:hang", []string{"working", "stalled"}},
	} {
		t.Run(tt.script, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				v := newEnv(t, func(c *config.Config) {
					c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(5)
					c.Agents.Defaults.StepTimeoutSeconds = secs(20)
				})
				v.send(t, "r1", tt.script)
				for i, at := range []time.Duration{time.Second, 5 * time.Second} {
					faketime.Advance(at)
					st := v.e.Status("main")
					live := v.e.Live()
					if st.Turn.Class != tt.want[i] || len(live) != 1 || live[0].Class != tt.want[i] {
						t.Errorf("step %d: Status class %q, Live %+v; want %q", i, st.Turn.Class, live, tt.want[i])
					}
				}
			})
		})
	}
}
