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

// TestStopFromAnotherReplicaDropsTheQueue: a user's turn runs on one
// replica; their next message, sent through another replica, waits in the
// owner's queue; their /stop, sent through that other replica too, stops
// the turn and drops the waiting message: it never runs anywhere.
func TestStopFromAnotherReplicaDropsTheQueue(t *testing.T) {
	c := start(t, clusterrig.Options{})
	sess := session("stop-queue")
	clients := watchEverywhere(t, c, sess)
	clients[0].MustStart(sess, hangTurn, "run-stop-1")
	own := owner(t, c, "run-stop-1")
	clients[own].WaitEvent(10*time.Second, "the shell step", toolStarted("run-stop-1", "shell"))
	via := others(c, own)[0]
	if a := clients[via].Send(sess, "/steps say:never", "run-stop-2"); !a.OK || a.Status != "queued" {
		t.Fatalf("the second message through %s: %+v %s, want queued", c.Gateway(via).ID, a, a.Raw)
	}
	if stop := clients[via].Send(sess, "/stop", "run-stop-3"); !stop.OK || !strings.Contains(string(stop.Raw), `"aborted":true`) {
		t.Fatalf("/stop through %s: %s %v, want the turn aborted", c.Gateway(via).ID, stop.Raw, stop.Err)
	}
	// The answer to /stop, in the chat, counts the dropped message.
	said := clients[via].WaitEvent(10*time.Second, "the answer to /stop", chatState("run-stop-3", "final"))
	if !strings.Contains(string(said.Raw), "1 queued message was dropped.") {
		t.Errorf("the answer to /stop: %s, want the dropped message counted", said.Raw)
	}
	e := clients[own].WaitEvent(10*time.Second, "the turn aborted on the owner", chatState("run-stop-1", "aborted"))
	if e.StopReason != "user" {
		t.Errorf("aborted with stop reason %q, want user", e.StopReason)
	}
	// The session's next message runs at once: nothing was left queued
	// before it, and the dropped one never ran anywhere.
	clients[via].Send(sess, "/steps say:after", "run-stop-4")
	clients[own].WaitEvent(15*time.Second, "the next message's reply", chatState("run-stop-4", "final"))
	for _, cl := range clients {
		for _, ev := range cl.RunEvents("run-stop-2") {
			if ev.Name == "agent" || ev.State == "final" {
				t.Errorf("the dropped message ran: %s %s", ev.Name, ev.Raw)
			}
		}
	}
}
