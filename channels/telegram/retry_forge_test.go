package telegram

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// aliceGroupTimeout has Alice's group request time out and returns its
// notice and the notice's Retry button.
func aliceGroupTimeout(h *harness) (noticeID int, data string) {
	h.t.Helper()
	h.api.push(groupMsg(alice, "/steps@"+botName+" fetch:1s shell:hang"))
	synctest.Wait()
	h.advance(4 * time.Minute)
	noticeID = h.api.lastMsgID(groupChatID)
	if data = h.api.button(groupChatID, noticeID); data == "" {
		h.t.Fatalf("no Retry button; screen:\n%s", quoteAll(h.screen(groupChatID)))
	}
	return noticeID, data
}

// retryConfig gives a hanging step 100 s before its turn times out.
func retryConfig(c *config.Config) { c.Channels.Telegram.Timeouts.StepTimeoutSeconds = secs(100) }

// TestForgedRetryStartsNothing (issue 19): Retry is a capability, not a
// guessable id. Callback data a member makes up — the run id of a message
// that finished normally (and never showed a Retry button), in the earlier
// "retry:<run id>" form, eight times over; a token never issued — is
// refused with a toast in words and starts no run, in a private chat and
// in a group.
func TestForgedRetryStartsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := setup{adjust: retryConfig, store: openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))}
		h := newHarness(t, s)
		var st started
		defer h.eng.Bus().Subscribe("", st.handle)()
		h.say(alice, "/steps say:Hello")
		h.api.push(groupMsg(alice, "/steps@"+botName+" say:Hi"))
		synctest.Wait()
		h.advance(5 * time.Second)
		runs := st.list()
		if len(runs) != 2 {
			t.Fatalf("turns started = %q, want 2", runs)
		}
		private, _, _ := strings.Cut(runs[0], " ")
		group, _, _ := strings.Cut(runs[1], " ")
		if strings.HasSuffix(runs[1], "say:Hello") {
			private, group = group, private
		}
		for _, tc := range []struct {
			name      string
			chat, who int64
			data      string
			want      string
		}{
			{"own finished run, by its sender", alice, alice, "retry:" + private, textRetryExpired},
			{"finished group run, by a member", groupChatID, bob, "retry:" + group, textRetryExpired},
			{"finished group run, by its sender", groupChatID, alice, "retry:" + group, textRetryExpired},
			{"a token never issued", groupChatID, bob, retryPrefix + "AAAAAAAAAAAAAAAAAAAAAA", textRetryExpired},
			{"an empty token", alice, alice, retryPrefix, textRetryExpired},
		} {
			before := len(callbackAnswers(h))
			for range 8 {
				h.api.tap(tc.chat, tc.who, h.api.lastMsgID(tc.chat), tc.data)
				synctest.Wait()
			}
			h.advance(5 * time.Second)
			if got := st.list(); len(got) != 2 {
				t.Fatalf("%s: forged taps started turns: %q", tc.name, got[2:])
			}
			answers := callbackAnswers(h)[before:]
			if len(answers) != 8 || slices.ContainsFunc(answers, func(a string) bool { return a != tc.want }) {
				t.Errorf("%s: forged taps answered %q, want %q each", tc.name, answers, tc.want)
			}
		}
	})
}

// TestRetryRefusedToAnotherUserAfterRestart (issue 19): after a restart
// the channel no longer remembers who sent a group request; its Retry
// button is still its sender's alone (the token keeps the sender). Bob's
// tap, and the button's data tapped in Bob's own chat, are refused and
// start nothing; Alice's tap runs her request, as hers.
func TestRetryRefusedToAnotherUserAfterRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "turnguard.db")
		st1 := openStore(t, path)
		h1 := newHarness(t, setup{adjust: retryConfig, store: st1})
		noticeID, data := aliceGroupTimeout(h1)
		h1.stop()
		st1.st.Close()

		h := newHarness(t, setup{adjust: retryConfig, store: openStore(t, path)})
		var st started
		defer h.eng.Bus().Subscribe("", st.handle)()
		h.api.tap(groupChatID, bob, noticeID, data)
		synctest.Wait()
		h.api.tap(bob, bob, noticeID, data)
		synctest.Wait()
		h.advance(5 * time.Second)
		if got := st.list(); len(got) != 0 {
			t.Fatalf("another user's taps started %q", got)
		}
		if answers, want := callbackAnswers(h), []string{textRetryNotOwner, textRetryElsewere}; !slices.Equal(answers, want) {
			t.Fatalf("Bob's taps answered %q, want %q", answers, want)
		}
		h.api.tap(groupChatID, alice, noticeID, data)
		synctest.Wait()
		if got := st.list(); len(got) != 1 || !strings.HasSuffix(got[0], " /steps fetch:1s shell:hang") {
			t.Fatalf("Alice's tap started %q, want her request again", got)
		}
		h.api.push(groupMsg(bob, "/stop"))
		synctest.Wait()
		h.advance(5 * time.Second)
		if got := h.last(groupChatID); got != textNotOwner {
			t.Errorf("Bob's /stop of Alice's retried request answered %q, want %q (it runs as hers)", got, textNotOwner)
		}
	})
}

// TestInterruptedGroupRetryKeepsItsSender (issue 19): the "interrupted"
// notice of a group request cut off by a restart is sent by the next
// process, which never saw the request: its Retry button is bound to the
// sender the store kept with the turn — Bob's tap is refused, Alice's runs
// it. A group turn recorded without a sender (before senders were kept)
// gets no button at all: nobody could be allowed to press it.
func TestInterruptedGroupRetryKeepsItsSender(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		st := openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))
		const notice = "⚠️ The gateway restarted while working on your request. Please send it again."
		chatRef := strconv.FormatInt(groupChatID, 10)
		for run, sender := range map[string]string{"tg--100500-7": senderRef(alice), "tg--100500-8": ""} {
			st.st.Handle(event.Event{Kind: event.TurnStarted, RunID: run, SessionKey: SessionKey(groupChatID), Channel: "telegram",
				ChatRef: chatRef, Sender: sender, Text: "/steps say:Recovered", Time: time.Now()})
			if err := st.st.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := st.st.Enqueue(ctx, store.OutboxMessage{Channel: "telegram", ChatRef: chatRef, RunID: run,
				Kind: store.OutboxNotice, Text: notice}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.st.MarkInterrupted(ctx, run, notice); err != nil {
				t.Fatal(err)
			}
		}
		h := newHarness(t, setup{store: st})
		var started started
		defer h.eng.Bus().Subscribe("", started.handle)()
		h.advance(5 * time.Second) // a group's messages go 3 s apart
		h.wantScreen(groupChatID, notice, notice)
		var withButton []int
		var data string
		for _, id := range []int{h.api.lastMsgID(groupChatID) - 1, h.api.lastMsgID(groupChatID)} {
			if b := h.api.button(groupChatID, id); b != "" {
				withButton, data = append(withButton, id), b
			}
		}
		if len(withButton) != 1 {
			t.Fatalf("%d of the two notices have a Retry button, want one (the turn with a sender)", len(withButton))
		}
		h.api.tap(groupChatID, bob, withButton[0], data)
		synctest.Wait()
		h.api.tap(groupChatID, alice, withButton[0], data)
		synctest.Wait()
		h.advance(5 * time.Second)
		if answers, want := callbackAnswers(h), []string{textRetryNotOwner, textRetrying}; !slices.Equal(answers, want) {
			t.Fatalf("taps answered %q, want %q", answers, want)
		}
		if got := started.list(); len(got) != 1 {
			t.Fatalf("turns started = %q, want Alice's retry only", got)
		}
	})
}
