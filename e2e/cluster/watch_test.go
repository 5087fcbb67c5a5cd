package cluster_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/testwait"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// TestWatchFromEveryReplica: one session watched from all three replicas
// while a turn streams: every watcher sees the same kept events in the same
// order, ending in the final — or its socket is closed with 1012 (reload
// the history), never a silent gap. Then the same while a NATS node is
// SIGKILLed mid-turn.
func TestWatchFromEveryReplica(t *testing.T) {
	c := start(t, clusterrig.Options{})
	for _, tc := range []struct {
		name     string
		killNATS int // -1: none
	}{
		{"steady", -1},
		{"a NATS node killed", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sess := session("watch-" + strings.ReplaceAll(tc.name, " ", "-"))
			runID := "run-watch-" + fmt.Sprint(tc.killNATS+1)
			watchers := watchEverywhere(t, c, sess)
			watchers[0].MustStart(sess, streamTurn, runID)
			if tc.killNATS >= 0 {
				for _, w := range watchers {
					w.WaitEvent(10*time.Second, "the run's first event", func(e wsclient.Event) bool { return e.RunID == runID })
				}
				c.NATS().Kill(tc.killNATS)
				t.Cleanup(func() { c.NATS().Restart(tc.killNATS) })
			}
			var want []string
			wantFrom := -1
			for i, w := range watchers {
				e, code, ok := w.WaitEnd(20*time.Second, runID)
				if !ok {
					if code != 1012 {
						t.Errorf("r%d: the socket closed with %d mid-run, want 1012 or the run's end", i+1, code)
						continue
					}
					// What the client does after 1012: reconnect, reload the history.
					re := c.Dial(t, i)
					testwait.Until(t, 20*time.Second, fmt.Sprintf("r%d: the final reply in the reloaded history", i+1), func() bool {
						return hasReply(re.History(sess), streamedReply)
					})
					continue
				}
				if e.State != "final" {
					t.Errorf("r%d: the run ended %s, want final: %s", i+1, e.State, e.Raw)
				}
				// The agent stream's lifecycle end follows the chat final.
				w.WaitEvent(10*time.Second, "the run's lifecycle end", func(e wsclient.Event) bool {
					return e.RunID == runID && e.Name == "agent" && e.Stream == "lifecycle" && e.Data.Phase == "end"
				})
				sig := signature(w.RunEvents(runID))
				if wantFrom < 0 {
					want, wantFrom = sig, i
					continue
				}
				if !slices.Equal(sig, want) {
					t.Errorf("r%d saw a different event sequence than r%d:\n r%d: %s\n r%d: %s", i+1, wantFrom+1,
						i+1, strings.Join(sig, "\n     "), wantFrom+1, strings.Join(want, "\n     "))
				}
			}
		})
	}
}
