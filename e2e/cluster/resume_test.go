package cluster_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/testwait"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// TestKillOwnerMidTurnResumes: with agents.defaults.resume on, the replica
// running a turn is SIGKILLed while the model answers (replay-safe). A
// survivor takes the turn over and runs it again as attempt 2 of 3: the
// history read through another replica has the resuming notice once, no
// "please send it again", and the resumed attempt's reply once — whose
// agent read the note that its previous attempt was interrupted.
func TestKillOwnerMidTurnResumes(t *testing.T) {
	const reply = "Resumed after the takeover"
	c := start(t, clusterrig.Options{Lease: 3 * time.Second, Config: func(_ int, cfg map[string]any) {
		clusterrig.Set(cfg, "agents.defaults.resume.enabled", true)
	}})
	sess := session("kill-owner-resumes")
	clients := watchEverywhere(t, c, sess)
	clients[0].MustStart(sess, "/steps llm:6s say:"+strings.ReplaceAll(reply, " ", "_"), "run-resumed")
	own := owner(t, c, "run-resumed")
	reader := clients[others(c, own)[0]]
	// The model streams: the kill comes while it answers.
	reader.WaitEvent(10*time.Second, "the model's streamed text, on a non-owner", chatState("run-resumed", "delta"))
	c.Gateway(own).Kill()

	var h wsclient.History
	testwait.Until(t, c.Lease()+30*time.Second, "the resumed attempt's reply in the history of "+sess, func() bool {
		f, err := reader.CallErr("chat.history", map[string]any{"sessionKey": sess, "limit": 200})
		if err != nil {
			reader = c.Dial(t, others(c, own)[0]) // told to reload (1012) during the takeover, as the web chat is
			return false
		}
		h = wsclient.History{}
		return f.OK && json.Unmarshal(f.Payload, &h) == nil && hasReply(h, reply)
	})
	notices := interruptedNotices(h)
	if len(notices) != 1 || !strings.Contains(notices[0], "resuming it (attempt 2 of 3)") {
		t.Errorf("the interrupted turn's notices %q, want one resuming notice", notices)
	}
	var replies []string
	for _, m := range h.Messages {
		if m.Role == "assistant" && strings.Contains(m.Text(), reply) {
			replies = append(replies, m.Text())
		}
	}
	if len(replies) != 1 || !strings.Contains(replies[0], "[Gateway note: this is attempt 2 of 3 of the request below.") {
		t.Errorf("the resumed replies %q, want one, showing the gateway's note", replies)
	}
}
