package telegram

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-telegram/bot/models"
)

// TestGroupRetryOnlyBySender: in a group, Bob taps the Retry button under
// Alice's timed-out request. He is told only she can retry it, and her
// request stays hers (her /stop is not refused as someone else's).
func TestGroupRetryOnlyBySender(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{adjust: retryConfig})
		noticeID, data := aliceGroupTimeout(h)
		h.api.push(models.Update{CallbackQuery: &models.CallbackQuery{
			ID: "cbq-bob", From: models.User{ID: bob, FirstName: "Bob"}, Data: data, ChatInstance: "ci",
			Message: models.MaybeInaccessibleMessage{Type: models.MaybeInaccessibleMessageTypeMessage, Message: &models.Message{
				ID: noticeID, Date: 1, Chat: models.Chat{ID: groupChatID, Type: models.ChatTypeSupergroup},
				From: &models.User{ID: h.api.botID, IsBot: true, FirstName: "Turnguard Test"},
			}},
		}})
		synctest.Wait()
		var answers []string
		for _, c := range h.api.callsTo("answerCallbackQuery", 0) {
			answers = append(answers, c.Text)
		}
		if len(answers) != 1 || answers[0] != textRetryNotOwner {
			t.Fatalf("Bob's tap answered %q, want %q", answers, textRetryNotOwner)
		}
		h.advance(5 * time.Second)
		h.api.push(groupMsg(alice, "/stop"))
		synctest.Wait()
		h.advance(5 * time.Second)
		scr := h.screen(groupChatID)
		if last := scr[len(scr)-1]; strings.Contains(last, "Only the person who sent") {
			t.Fatalf("Alice cannot stop her own retried request (Bob's tap made it his):\n%s", quoteAll(scr))
		}
	})
}
