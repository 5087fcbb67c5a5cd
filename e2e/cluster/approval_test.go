package cluster_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/fakebot"
	"github.com/turnguard/turnguard/internal/testwait"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// TestApprovalAnsweredThroughAnotherReplica: a turn on one replica asks its
// person a question (the demo runner's ask:deploy); the answer comes
// through a replica that does not run the turn — the person's web chat
// connected there (approval.resolve), or an operator's admin API there —
// and is passed to the owner over NATS: the turn goes on and its watcher on
// the owner sees the reply; the watchers elsewhere saw the question too.
func TestApprovalAnsweredThroughAnotherReplica(t *testing.T) {
	c := start(t, clusterrig.Options{})
	for _, tc := range []struct {
		name   string
		other  int
		answer func(t *testing.T, g *clusterrig.Gateway, cl *wsclient.Client, sess, id string)
	}{
		{"chat", 0, func(t *testing.T, _ *clusterrig.Gateway, cl *wsclient.Client, sess, id string) {
			f := cl.Call("approval.resolve", map[string]any{"id": id, "optionId": "allow", "sessionKey": sess})
			if !f.OK || !strings.Contains(string(f.Payload), `"outcome":"selected"`) {
				t.Errorf("approval.resolve through a non-owner: ok=%v %s %v", f.OK, f.Payload, f.Error)
			}
		}},
		{"operator", 1, func(t *testing.T, g *clusterrig.Gateway, _ *wsclient.Client, _, id string) {
			// This replica lists the question, asked elsewhere, from the
			// store (which the owner's recorder writes a moment after
			// asking), and finds its conversation there to pass the answer on.
			testwait.Until(t, 10*time.Second, g.ID+"'s /api/approvals lists the question asked elsewhere", func() bool {
				var list struct {
					Approvals []struct {
						ID        string `json:"id"`
						Elsewhere bool   `json:"elsewhere"`
					} `json:"approvals"`
				}
				if err := g.OperatorGet("/api/approvals", &list); err != nil {
					return false
				}
				return slices.ContainsFunc(list.Approvals, func(a struct {
					ID        string `json:"id"`
					Elsewhere bool   `json:"elsewhere"`
				}) bool {
					return a.ID == id && a.Elsewhere
				})
			})
			var code int
			var body string
			testwait.Until(t, 10*time.Second, "the operator's answer through "+g.ID, func() bool {
				code, body = g.AdminPost("/api/approvals/"+id, `{"optionId":"allow"}`)
				return code != http.StatusNotFound
			})
			if code != http.StatusOK || !strings.Contains(body, `"outcome": "selected"`) {
				t.Errorf("POST /api/approvals/%s on %s: %d %s", id, g.ID, code, body)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sess := session("approval-" + tc.name)
			runID := "run-approval-" + tc.name
			clients := watchEverywhere(t, c, sess)
			clients[0].MustStart(sess, "/steps ask:deploy say:Finished", runID)
			own := owner(t, c, runID)
			via := others(c, own)[tc.other]
			// The question reaches the watchers on every replica; the id
			// comes from the one the answer goes through.
			e := clients[via].WaitEvent(10*time.Second, "the question on "+c.Gateway(via).ID, func(e wsclient.Event) bool {
				return e.Name == "approval" && e.RunID == runID && e.State == "requested"
			})
			var p struct {
				Approval struct{ ID, Title string } `json:"approval"`
			}
			if err := json.Unmarshal(e.Raw, &p); err != nil || p.Approval.ID == "" || p.Approval.Title != "Run deploy" {
				t.Fatalf("approval event %s: %v", e.Raw, err)
			}
			tc.answer(t, c.Gateway(via), clients[via], sess, p.Approval.ID)
			fin := clients[own].WaitEvent(15*time.Second, "the reply on the owner", chatState(runID, "final"))
			if !strings.Contains(string(fin.Raw), "deploy ran (allowed). Finished") {
				t.Errorf("final %s, want the allowed reply", fin.Raw)
			}
		})
	}
}

// TestTelegramApprovalInACluster: a question asked in a Telegram chat whose
// turn runs on one of three replicas (one of them polling the shared fake
// Bot API, the updates partitioned by chat): the question arrives with its
// buttons, a tap is answered with a toast, the question is edited into its
// answer without buttons, and the agent's reply follows — the outbox and
// the update stream of a cluster carry approvals as one gateway does.
func TestTelegramApprovalInACluster(t *testing.T) {
	c := start(t, clusterrig.Options{Telegram: true, Lease: 3 * time.Second})
	bot := c.Bot()
	bot.Say("/steps ask:deploy say:Finished")
	q := bot.WaitShown(20*time.Second, "the question with its buttons", func(m fakebot.Shown) bool {
		return strings.HasPrefix(m.Text, "🔐 Approval needed: Run deploy") && len(m.Buttons) > 0
	})
	if got := q.Labels(); !slices.Equal(got, []string{"Allow", "Deny"}) {
		t.Fatalf("buttons %q, want Allow and Deny", got)
	}
	alice := fakebot.User{ID: 7, Username: "alice", FirstName: "Alice"}
	query := bot.Press(alice, q.ID, q.Buttons[0][0].Data)
	if a := bot.WaitAnswer(15*time.Second, query); a.Text != "Allowed" {
		t.Errorf("the tap's toast %q, want Allowed", a.Text)
	}
	bot.WaitShown(15*time.Second, "the question edited into its answer", func(m fakebot.Shown) bool {
		return m.ID == q.ID && m.Text == "✅ Allowed by @alice: Run deploy" && m.Buttons == nil
	})
	bot.WaitSent(15*time.Second, "the agent's reply", func(text string) bool {
		return strings.Contains(text, "deploy ran (allowed). Finished")
	})
}
