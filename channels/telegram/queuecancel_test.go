package telegram

import (
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/messages"
)

// TestCancelButtonOnlyInItsChat (issue 23): a queued message's Cancel
// button (qc:<run id>, a predictable id) cancels it only from its own chat
// and, in a group, only for its sender: Bob replaying Alice's data in his
// own chat, or tapping it under her message in the group, cancels nothing
// and is told why; Alice's tap cancels it, and her answer is edited into
// the cancelled words without the button.
func TestCancelButtonOnlyInItsChat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{adjust: retryConfig})
		h.api.push(groupMsg(alice, "/steps@"+botName+" shell:hang"))
		synctest.Wait()
		h.api.push(groupMsg(alice, "/steps@"+botName+" say:Alices_queued"))
		synctest.Wait()
		h.advance(5 * time.Second)
		ackID := h.api.lastMsgID(groupChatID)
		data := h.api.button(groupChatID, ackID)
		if scr := h.screen(groupChatID); !strings.HasPrefix(scr[len(scr)-1], "📥 Queued") || !strings.HasPrefix(data, cancelPrefix) {
			t.Fatalf("the queued answer %q has button data %q, want a Cancel button", scr[len(scr)-1], data)
		}
		if got := h.api.keys(groupChatID, ackID); len(got) != 1 || !strings.HasPrefix(got[0][0], messages.QueueCancelLabel+"=") {
			t.Fatalf("keyboard %q, want one %s button", got, messages.QueueCancelLabel)
		}
		waiting := func() int { return len(h.eng.Status(SessionKey(groupChatID)).Queue) }

		h.say(bob, "hello") // Bob's own chat, where he replays the data
		h.advance(time.Second)
		h.api.press(bob, models.User{ID: bob, FirstName: "Bob"}, h.api.lastMsgID(bob), data)
		h.advance(time.Second)
		h.api.press(groupChatID, models.User{ID: bob, FirstName: "Bob"}, ackID, data)
		h.advance(time.Second)
		if n := waiting(); n != 1 {
			t.Fatalf("after Bob's taps %d messages wait, want Alice's 1", n)
		}
		h.api.press(groupChatID, aliceUser, ackID, data)
		h.advance(5 * time.Second)
		cancelled := messages.QueueCancelled("/steps say:Alices_queued")
		want := []string{messages.RetryElsewhere, messages.QueueCancelNotOwner, cancelled}
		if got := h.api.toasts(); !slices.Equal(got, want) {
			t.Fatalf("taps answered %q, want %q", got, want)
		}
		if n := waiting(); n != 0 {
			t.Fatalf("after Alice's tap %d messages wait, want none", n)
		}
		if k := h.api.keys(groupChatID, ackID); k != nil {
			t.Errorf("the cancelled answer still has buttons %q", k)
		}
		if scr := h.screen(groupChatID); !slices.Contains(scr, cancelled) {
			t.Errorf("the answer was not edited into %q:\n%s", cancelled, quoteAll(scr))
		}
	})
}

// TestCancelButtonGoesWhenNoLongerWaiting (issue 23): the Cancel button
// under a queued answer is removed when its message starts, and when /stop
// drops the queue; a message that ran is never offered for cancelling.
func TestCancelButtonGoesWhenNoLongerWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		// queue sends running, then queued, and returns the queued answer's
		// message, which must carry a Cancel button.
		queue := func(running, queued string) int {
			t.Helper()
			h.say(alice, running)
			h.say(alice, queued)
			h.advance(time.Second)
			id := h.api.lastMsgID(alice)
			if d := h.api.button(alice, id); !strings.HasPrefix(d, cancelPrefix) {
				t.Fatalf("the queued answer has button data %q, want Cancel", d)
			}
			return id
		}
		started := queue("/steps work:10s say:First", "/steps say:Second")
		h.advance(15 * time.Second)
		if scr := h.screen(alice); !slices.Contains(scr, "Second") {
			t.Fatalf("the queued message did not run:\n%s", quoteAll(scr))
		}
		if k := h.api.keys(alice, started); k != nil {
			t.Errorf("the answer of a message that ran still has %q", k)
		}

		dropped := queue("/steps shell:hang", "/steps say:Dropped")
		h.say(alice, "/stop")
		h.advance(5 * time.Second)
		if k := h.api.keys(alice, dropped); k != nil {
			t.Errorf("the answer of a message /stop dropped still has %q", k)
		}
	})
}
