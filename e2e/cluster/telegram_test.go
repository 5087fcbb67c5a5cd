package cluster_test

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/testwait"
)

// TestTelegramAcrossReplicas: one fake Bot API shared by the three
// replicas. A turn started from Telegram whose replica is SIGKILLed ends in
// the chat with exactly one interrupted message; /stop sent from Telegram
// stops a turn whichever replica runs it; when the replica that polls the
// Bot API is SIGKILLed another takes over, and the messages sent meanwhile
// are each answered once, in order.
func TestTelegramAcrossReplicas(t *testing.T) {
	c := start(t, clusterrig.Options{Telegram: true, Lease: 3 * time.Second})
	bot := c.Bot()

	t.Run("owner killed", func(t *testing.T) {
		bot.Say(hangTurn)
		own, runID := ownerOfSession(t, c, telegramSession)
		killed := c.Gateway(own).Kill()
		bot.WaitSent(c.Lease()+10*time.Second, "telling the user the turn was interrupted", telegramInterrupted)
		t.Logf("run %s on r%d: the interrupted message came %v after the kill", runID, own+1, time.Since(killed))
		// A second notice would come from another survivor or a redelivery
		// of the outbox row: give both their chance.
		time.Sleep(c.Lease() + time.Second) // real time: showing that nothing more comes
		n := 0
		for _, text := range bot.Sent() {
			if telegramInterrupted(text) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d interrupted messages reached the chat, want exactly 1:%s", n, bot)
		}
		c.Gateway(own).Restart()
	})

	t.Run("/stop", func(t *testing.T) {
		bot.Say(hangTurn) // the session is free again: the takeover ended its turn

		own, runID := ownerOfSession(t, c, telegramSession)
		bot.Say("/stop")
		bot.WaitSent(10*time.Second, "saying the request was stopped", func(text string) bool {
			return strings.Contains(text, "Stopped")
		})
		testwait.Until(t, 10*time.Second, fmt.Sprintf("run %s leaves r%d's live turns", runID, own+1), func() bool {
			var live struct {
				Turns []struct {
					RunID string `json:"runId"`
				} `json:"turns"`
			}
			if err := c.Gateway(own).OperatorGet("/api/turns", &live); err != nil {
				return false
			}
			for _, tr := range live.Turns {
				if tr.RunID == runID {
					return false
				}
			}
			return true
		})
		if conflicts := bot.Conflicts(); conflicts > 0 {
			t.Logf("getUpdates conflicts seen (several replicas polled at once): %d", conflicts)
		}
	})
	t.Run("poller killed", func(t *testing.T) {
		bot.Say("/steps say:Before_the_poller_dies")
		bot.WaitSent(15*time.Second, "answering before the kill", func(s string) bool { return strings.Contains(s, "Before the poller dies") })
		polls := bot.Polls()
		poller := slices.IndexFunc(c.Gateways(), func(g *clusterrig.Gateway) bool { return g.ID == polls[len(polls)-1].Via })
		if poller < 0 {
			t.Fatalf("the last poll came through %q, no replica's URL", polls[len(polls)-1].Via)
		}
		killed := c.Gateway(poller).Kill()
		const n = 5
		afterKill := regexp.MustCompile(`After the kill [0-9]+`)
		var want []string
		for k := range n {
			bot.Say(fmt.Sprintf("/steps say:After_the_kill_%d", k+1))
			want = append(want, fmt.Sprintf("After the kill %d", k+1))
		}
		got := func() []string {
			var out []string
			for _, text := range bot.Sent() {
				out = append(out, afterKill.FindAllString(text, -1)...)
			}
			return out
		}
		testwait.Until(t, c.Lease()+20*time.Second, "every message after the kill answered", func() bool { return len(got()) >= n })
		time.Sleep(c.Lease() + time.Second) // real time: showing that no message is answered twice
		if g := got(); !slices.Equal(g, want) {
			t.Errorf("after the poller's death the chat got %q; want each message answered once, in order: %q", g, want)
		}
		for _, p := range bot.Polls() {
			if p.At.After(killed) {
				if p.Via == c.Gateway(poller).ID {
					t.Errorf("updates polled through the killed replica %s after its death", p.Via)
				}
				t.Logf("the first poll after the kill: %s, %v later", p.Via, p.At.Sub(killed))
				break
			}
		}
		c.Gateway(poller).Restart()
	})
}

// TestTelegramKilledWhileDelivering: the replica sending a reply to
// Telegram is SIGKILLed while the Bot API has the request. If Telegram had
// not accepted the message, the chat gets it exactly once, from a
// survivor, within a few leases; if it had (the answer was lost with the
// replica), the survivor sends it again — the one duplicate at-least-once
// delivery allows, and the only one.
func TestTelegramKilledWhileDelivering(t *testing.T) {
	c := start(t, clusterrig.Options{Telegram: true, Lease: 3 * time.Second})
	bot := c.Bot()
	for _, tc := range []struct {
		name   string
		accept bool
		want   int // copies of the reply in the chat
	}{
		{"not accepted", false, 1},
		{"accepted, answer lost", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			word := "Delivered_" + strings.ReplaceAll(tc.name, " ", "_")
			word = strings.NewReplacer(",", "").Replace(word)
			reply := strings.ReplaceAll(word, "_", " ")
			held := bot.Hold(func(text string) bool { return strings.Contains(text, reply) }, tc.accept)
			bot.Say("/steps say:" + word)
			var via string
			select {
			case via = <-held:
			case <-time.After(20 * time.Second): // real time: bounds the wait for the reply's send
				t.Fatalf("no replica sent the reply:%s", bot)
			}
			sender := slices.IndexFunc(c.Gateways(), func(g *clusterrig.Gateway) bool { return g.ID == via })
			if sender < 0 {
				t.Fatalf("the reply came through %q, no replica's URL", via)
			}
			killed := c.Gateway(sender).Kill()
			bot.WaitSent(c.Lease()+20*time.Second, "the reply delivered by a survivor", func(s string) bool {
				return strings.Contains(s, reply) && bot.Count(reply) >= tc.want
			})
			t.Logf("%s: %d copies of the reply; the last %v after r%d was killed", tc.name, bot.Count(reply),
				time.Since(killed).Round(10*time.Millisecond), sender+1)
			time.Sleep(c.Lease() + time.Second) // real time: showing that no further copy comes
			if n := bot.Count(reply); n != tc.want {
				t.Errorf("%d copies of the reply reached the chat, want %d:%s", n, tc.want, bot)
			}
			c.Gateway(sender).Restart()
		})
	}
}
