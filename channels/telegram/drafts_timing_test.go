package telegram

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
)

// draftMode sets channels.telegram.streaming: draft.
func draftMode(c *config.Config) { c.Channels.Telegram.Streaming = config.TelegramStreamDraft }

// knowsDrafts makes the fake API a Bot API 10.3 server.
func knowsDrafts(f *fakeAPI, _ *memTransport) { f.drafts = true }

// TestDraftTimeline: in draft mode a turn's draft opens empty (Telegram's
// "Thinking…") at once, is sent again every 20 s while it does not change
// (a draft lasts about 30 s), shows the "still working" notice as its
// status, loses it when the step ends, and is never sent after the reply;
// no typing action is sent while it shows, and no message but the reply.
func TestDraftTimeline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{adjust: draftMode, prepare: knowsDrafts})
		h.say(alice, "/steps shell:65s tidy:5s say:Done")
		h.advance(2 * time.Minute)
		calls := callLines(h.api.allCalls(), "sendMessageDraft", "sendMessage", "editMessageText", "sendChatAction")
		const notice = "⏳ Still working — shell has been running for 30 s…"
		wantLines(t, "calls until the shell step ended", calls[:min(len(calls), 5)], []string{
			"0s sendMessageDraft",
			"20s sendMessageDraft",
			"30s sendMessageDraft " + notice,
			"50s sendMessageDraft " + notice,
			"1m5s sendMessageDraft",
		})
		if last := calls[len(calls)-1]; !strings.HasSuffix(last, "s sendMessage #1 Done") {
			t.Errorf("the last call is %q, want the reply:\n%s", last, strings.Join(calls, "\n"))
		}
		for _, c := range h.api.callsTo("sendMessageDraft", alice) {
			if c.Draft != h.api.callsTo("sendMessageDraft", alice)[0].Draft || c.ParseMode != "HTML" {
				t.Errorf("draft call %+v: want one draft_id for the turn, HTML", c)
			}
		}
		h.wantScreen(alice, "Done")
	})
}

// TestDraftsPaced: text streaming word by word becomes at most one draft
// update per second — the chat's pacing, shared with its messages — each
// with the latest text.
func TestDraftsPaced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{adjust: draftMode, prepare: knowsDrafts})
		h.say(alice, "/steps llm:3500ms say:Done")
		h.advance(10 * time.Second)
		calls := h.api.allCalls()
		var prev time.Duration = -time.Hour
		drafts := 0
		for _, c := range calls {
			if c.Method != "sendMessageDraft" && c.Method != "sendMessage" {
				continue
			}
			drafts++
			if c.At-prev < privateInterval {
				t.Errorf("%s %v after the previous call to the chat, want at least %v:\n%s", c.Method, c.At-prev, privateInterval,
					strings.Join(callLines(calls, "sendMessageDraft", "sendMessage"), "\n"))
			}
			prev = c.At
		}
		if drafts < 4 {
			t.Errorf("%d calls, want the draft updated while the text streamed:\n%s", drafts, strings.Join(callLines(calls), "\n"))
		}
		if s := h.screen(alice); len(s) != 1 || !strings.HasSuffix(s[0], "Done") {
			t.Errorf("chat shows %q, want the reply alone", s)
		}
	})
}

// TestDraftRefusedFallsBackToEdit: a Bot API server without drafts (404)
// turns the channel to edit mode, the running turn included: its "still
// working" notice comes as a message, typing is shown, and the next turn
// does not try a draft again.
func TestDraftRefusedFallsBackToEdit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{adjust: draftMode})
		h.say(alice, "/steps shell:40s say:Done")
		h.advance(time.Minute)
		h.say(alice, "/steps shell:40s say:Again")
		h.advance(time.Minute)
		if n := len(h.api.callsTo("sendMessageDraft", alice)); n != 1 {
			t.Errorf("%d draft calls, want 1 (refused, not tried again)", n)
		}
		if n := len(h.api.callsTo("sendChatAction", alice)); n < 10 {
			t.Errorf("%d typing actions, want typing while the turns ran", n)
		}
		h.wantScreen(alice, "✅ shell finished after 40 s.", "Done", "✅ shell finished after 40 s.", "Again")
		if !strings.Contains(h.logs.String(), "drafts failed; showing the turn with edited messages instead") {
			t.Errorf("the fallback was not logged:\n%s", h.logs.String())
		}
	})
}

// TestStreamingOffShowsOnlyTyping: streaming off sends no draft, no step
// lines and no "still working" notice — typing, then the reply.
func TestStreamingOffShowsOnlyTyping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{prepare: knowsDrafts, adjust: func(c *config.Config) {
			c.Channels.Telegram.Streaming, c.Channels.Telegram.ShowSteps = config.TelegramStreamOff, true
		}})
		h.say(alice, "/steps shell:40s say:Done")
		h.advance(time.Minute)
		if n := len(h.api.callsTo("sendMessageDraft", 0)) + len(h.api.callsTo("editMessageText", 0)); n != 0 {
			t.Errorf("%d drafts or edits, want none", n)
		}
		if n := len(h.api.callsTo("sendChatAction", alice)); n < 10 {
			t.Errorf("%d typing actions, want typing while the turn ran", n)
		}
		h.wantScreen(alice, "Done")
	})
}
