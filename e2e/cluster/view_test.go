package cluster_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// TestReloadOnAnotherReplicaFindsTheTurnAndItsQuestion (issue 20, one view
// from every replica): a web chat's turn runs on one replica and asks its
// person a question, a second message waits behind it; the page is
// reloaded and a load balancer puts its WebSocket on a replica that does
// not own the turn. The re-attach (chat.history's turnguard block) shows
// the running turn, the queued message and the open question with its id,
// approval.list {sessionKey} lists the question there, and /status names
// the running turn — as on the owner.
func TestReloadOnAnotherReplicaFindsTheTurnAndItsQuestion(t *testing.T) {
	c := start(t, clusterrig.Options{})
	sess := session("reload-view")
	first := c.Dial(t, 0)
	first.History(sess)
	first.MustStart(sess, "/steps ask:deploy say:Finished", "run-view-1")
	own := owner(t, c, "run-view-1")
	via := others(c, own)[0]
	asked := first.WaitEvent(10*time.Second, "the question", func(e wsclient.Event) bool {
		return e.Name == "approval" && e.RunID == "run-view-1" && e.State == "requested"
	})
	var q struct {
		Approval struct{ ID string } `json:"approval"`
	}
	if err := json.Unmarshal(asked.Raw, &q); err != nil || q.Approval.ID == "" {
		t.Fatalf("approval event %s: %v", asked.Raw, err)
	}
	if a := first.Send(sess, "/steps say:next", "run-view-2"); !a.OK || a.Status != "queued" {
		t.Fatalf("the second message: %+v %s, want queued", a, a.Raw)
	}

	// The reload, on a replica that runs nothing of the session.
	reloaded := c.Dial(t, via)
	f := reloaded.Call("chat.history", map[string]any{"sessionKey": sess, "limit": 200})
	var h struct {
		Turnguard struct {
			ActiveRun *struct {
				RunID string `json:"runId"`
			} `json:"activeRun"`
			Queue     []struct{ RunID string } `json:"queue"`
			Approvals []struct {
				ID    string `json:"id"`
				RunID string `json:"runId"`
			} `json:"approvals"`
		} `json:"turnguard"`
	}
	if !f.OK || json.Unmarshal(f.Payload, &h) != nil {
		t.Fatalf("chat.history on %s: ok=%v %s %v", c.Gateway(via).ID, f.OK, f.Payload, f.Error)
	}
	tg := h.Turnguard
	if tg.ActiveRun == nil || tg.ActiveRun.RunID != "run-view-1" || len(tg.Queue) != 1 || tg.Queue[0].RunID != "run-view-2" ||
		len(tg.Approvals) != 1 || tg.Approvals[0].ID != q.Approval.ID || tg.Approvals[0].RunID != "run-view-1" {
		t.Fatalf("re-attach on %s (not the owner %s): %s; want run-view-1 running, run-view-2 queued, question %s open",
			c.Gateway(via).ID, c.Gateway(own).ID, f.Payload, q.Approval.ID)
	}
	l := reloaded.Call("approval.list", map[string]any{"sessionKey": sess})
	var list struct {
		Approvals []struct{ ID string } `json:"approvals"`
	}
	if !l.OK || json.Unmarshal(l.Payload, &list) != nil || len(list.Approvals) != 1 || list.Approvals[0].ID != q.Approval.ID {
		t.Fatalf("approval.list on %s: ok=%v %s %v; want question %s", c.Gateway(via).ID, l.OK, l.Payload, l.Error, q.Approval.ID)
	}
	reloaded.Send(sess, "/status", "run-view-status")
	st := reloaded.WaitEvent(10*time.Second, "the answer to /status", chatState("run-view-status", "final"))
	if !strings.Contains(string(st.Raw), "1 message waiting") || strings.Contains(string(st.Raw), "Nothing is running") {
		t.Errorf("/status on %s: %s; want the running turn and its queue", c.Gateway(via).ID, st.Raw)
	}

	// The person answers from the reloaded page; the turn goes on.
	if a := reloaded.Call("approval.resolve", map[string]any{"id": q.Approval.ID, "optionId": "allow", "sessionKey": sess}); !a.OK {
		t.Fatalf("approval.resolve on %s: %s %v", c.Gateway(via).ID, a.Payload, a.Error)
	}
	reloaded.WaitEvent(15*time.Second, "the reply on the reloaded page", chatState("run-view-1", "final"))
}
