package cluster_test

import (
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// TestHistoryFollowsTheSessionAcrossReplicas: a replica keeps an idle
// session's history while the database shows nothing new since, and reads
// it again once another replica ran a turn of the session (issue 21: the
// check instead of a reload before every turn). Each replica's history,
// read after the other's turn, has every reply, once, in order.
func TestHistoryFollowsTheSessionAcrossReplicas(t *testing.T) {
	c := start(t, clusterrig.Options{Replicas: 2})
	sess := session("history-across")
	cls := []*wsclient.Client{c.Dial(t, 0), c.Dial(t, 1)}
	turn := func(replica int, reply, runID string) {
		t.Helper()
		cls[replica].MustStart(sess, "/steps say:"+reply, runID)
		cls[replica].WaitEvent(15*time.Second, "the final of "+runID, chatState(runID, "final"))
	}
	replies := func(replica int) []string {
		t.Helper()
		var out []string
		for _, m := range cls[replica].History(sess).Messages {
			if m.Role == "assistant" {
				out = append(out, m.Text())
			}
		}
		return out
	}
	want := func(step string, replica int, texts ...string) {
		t.Helper()
		got := replies(replica)
		if len(got) != len(texts) {
			t.Fatalf("%s: replica %d's history has the replies %q, want %q", step, replica, got, texts)
		}
		for i := range texts {
			if got[i] != texts[i] {
				t.Fatalf("%s: replica %d's history has the replies %q, want %q", step, replica, got, texts)
			}
		}
	}

	turn(0, "one", "hist-1")
	turn(0, "two", "hist-2") // replica 0 keeps its cache: nothing changed
	want("two turns on replica 0", 0, "one", "two")
	want("replica 1's first read", 1, "one", "two")
	turn(1, "three", "hist-3")
	want("after replica 1's turn", 0, "one", "two", "three")
	turn(0, "four", "hist-4")
	want("after replica 0's turn", 1, "one", "two", "three", "four")
	want("replica 0 again", 0, "one", "two", "three", "four")
}
