package cluster_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// TestAbortFromAnotherReplica: a run is stopped from a replica that does not
// own it — chat.abort on one, the operator's admin abort on the other — and
// the user watching on the owner sees it aborted with stop reason user.
func TestAbortFromAnotherReplica(t *testing.T) {
	c := start(t, clusterrig.Options{})
	for _, tc := range []struct {
		name  string
		other int // which of the two non-owners stops it
		abort func(t *testing.T, g *clusterrig.Gateway, cl *wsclient.Client, sess, runID string)
	}{
		{"chat.abort", 0, func(t *testing.T, _ *clusterrig.Gateway, cl *wsclient.Client, sess, runID string) {
			f := cl.Abort(sess, runID)
			var p struct {
				Aborted bool     `json:"aborted"`
				RunIDs  []string `json:"runIds"`
			}
			_ = json.Unmarshal(f.Payload, &p)
			if !f.OK || !p.Aborted {
				t.Errorf("chat.abort through a non-owner: ok=%v %s %v; want aborted", f.OK, f.Payload, f.Error)
			}
		}},
		{"admin abort", 1, func(t *testing.T, g *clusterrig.Gateway, _ *wsclient.Client, _, runID string) {
			if code, body := g.AdminAbort(runID); code != http.StatusOK {
				t.Errorf("POST /api/turns/%s/abort on %s: %d %s; want 200", runID, g.ID, code, body)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sess := session("abort-" + strings.ReplaceAll(tc.name, " ", "-"))
			runID := "run-" + tc.name
			clients := watchEverywhere(t, c, sess)
			clients[0].MustStart(sess, hangTurn, runID)
			own := owner(t, c, runID)
			watcher := clients[own]
			watcher.WaitEvent(10*time.Second, "the shell step", toolStarted(runID, "shell"))

			via := others(c, own)[tc.other]
			tc.abort(t, c.Gateway(via), clients[via], sess, runID)
			e := watcher.WaitEvent(10*time.Second, "aborted on the owner", chatState(runID, "aborted"))
			if e.StopReason != "user" {
				t.Errorf("aborted with stop reason %q, want user: %s", e.StopReason, e.Raw)
			}
		})
	}
}
