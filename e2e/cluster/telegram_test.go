package cluster_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/testwait"
)

// TestTelegramAcrossReplicas: one fake Bot API shared by the three
// replicas. A turn started from Telegram whose replica is SIGKILLed ends in
// the chat with exactly one interrupted message; /stop sent from Telegram
// stops a turn whichever replica runs it.
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
}
