package telegram

import (
	"net/http"
	"net/http/httptest"
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

// TestDraftStopTapByWebhook: in webhook mode a Stop tap comes in the
// webhook's body (stopped_message_generation, which the client library
// does not decode) and stops the draft's turn as /stop does.
func TestDraftStopTapByWebhook(t *testing.T) {
	const secret = "s3cret_webhook-token"
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{prepare: knowsDrafts, adjust: func(c *config.Config) {
			tg := &c.Channels.Telegram
			tg.Mode, tg.WebhookSecret, tg.Streaming = config.TelegramWebhook, secret, config.TelegramStreamDraft
		}})
		post := func(body string) {
			req := httptest.NewRequest(http.MethodPost, "/telegram/webhook", strings.NewReader(body))
			req.Header.Set(SecretHeader, secret)
			rec := httptest.NewRecorder()
			h.ch.WebhookHandler().ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				t.Fatalf("webhook answered %d", rec.Code)
			}
			synctest.Wait()
		}
		post(`{"update_id":5,"message":{"message_id":9,"date":1,"chat":{"id":1001,"type":"private"},"from":{"id":1001,"first_name":"A"},"text":"/steps say:Half shell:hang"}}`)
		h.advance(2 * time.Second)
		drafts := h.api.callsTo("sendMessageDraft", alice)
		if len(drafts) == 0 {
			t.Fatalf("no draft:\n%s", strings.Join(callLines(h.api.allCalls()), "\n"))
		}
		post(`{"update_id":6,"stopped_message_generation":{"chat":{"id":1001,"type":"private","first_name":"A"},"draft_id":` + drafts[0].Draft + `}}`)
		h.advance(2 * time.Second)
		h.wantScreen(alice, "Half", "⏹️ Stopped while shell was running after 2 s.")
	})
}

// TestStopTapUpdateKey: in a cluster a Stop tap is stored in its chat's
// partition like a message (updateKey), and a stored one is read back.
func TestStopTapUpdateKey(t *testing.T) {
	cases := []struct {
		name string
		raw  string
		chat int64
		ok   bool
	}{
		{"stop tap", `{"update_id":7,"stopped_message_generation":{"chat":{"id":1001,"type":"private"},"draft_id":42}}`, 1001, true},
		{"stop tap without a chat", `{"update_id":8,"stopped_message_generation":{"draft_id":42}}`, 0, false},
		{"stop tap, draft_id quoted", `{"update_id":10,"stopped_message_generation":{"chat":{"id":1001,"type":"private"},"draft_id":"42"}}`, 1001, true},
		{"message", `{"update_id":9,"message":{"message_id":1,"date":1,"chat":{"id":1002,"type":"private"},"text":"hi"}}`, 1002, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, chat, ok, err := updateKey([]byte(tc.raw))
			if err != nil || chat != tc.chat || ok != tc.ok {
				t.Errorf("updateKey = chat %d, ok %v, err %v; want chat %d, ok %v", chat, ok, err, tc.chat, tc.ok)
			}
			if s := stopOf([]byte(tc.raw)); (s != nil && s.DraftID == 42) != (tc.ok && tc.name != "message") {
				t.Errorf("stopOf = %+v", s)
			}
		})
	}
}

// TestDraftText: a draft's text is valid Telegram HTML within 4096
// characters whatever the reply and status: the reply's end (a code block
// cut open is closed), then the status; empty is "Thinking…".
func TestDraftText(t *testing.T) {
	long := strings.Repeat("word ", 3000)
	fenced := "```go\n" + strings.Repeat("x := 1 // <ok> & more\n", 400) + "```\nafter"
	status := strings.Repeat("🔧 shell…\n", 200)
	cases := []struct {
		name, reply, status string
		want                string // the visible text, "" to check only validity and length
	}{
		{"thinking", "", "", ""},
		{"reply and status", "**Hi** <you>", "⏳ Still working — shell has been running for 30 s…", "Hi <you>\n\n⏳ Still working — shell has been running for 30 s…"},
		{"status alone", "", "✅ web_search · 2 s", "✅ web_search · 2 s"},
		{"long reply", long, "", ""},
		{"long reply and long status", long, tail(status, maxDraftStatus), ""},
		{"code block cut", fenced, "⏳ Still working", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			text := draftText(tc.reply, tc.status)
			if text == "" {
				if tc.reply != "" || tc.status != "" {
					t.Fatal("empty draft for a reply or status")
				}
				return
			}
			visible, err := checkText(text, "HTML")
			if err != nil {
				t.Fatalf("Telegram would refuse the draft: %v\n%s", err, text)
			}
			if tc.want != "" && visible != tc.want {
				t.Errorf("draft shows %q, want %q", visible, tc.want)
			}
			if len(tc.reply) > MaxMessageLen && !strings.HasPrefix(visible, "…\n") {
				t.Errorf("a long reply's draft does not show it was cut: %.40q", visible)
			}
			if tc.status != "" && !strings.HasSuffix(strings.TrimSpace(visible), strings.TrimSpace(tc.status)) {
				t.Errorf("the status is not at the end: %.80q", visible[max(0, len(visible)-80):])
			}
		})
	}
}

// TestHelpSaysHowATurnIsShown: /help describes what a turn shows in each
// streaming mode.
func TestHelpSaysHowATurnIsShown(t *testing.T) {
	cases := []struct{ streaming, want string }{
		{config.TelegramStreamDraft, "While it works you see its answer being written and a “⏳ Still working” note if one step takes long; Telegram's Stop button stops it as /stop does."},
		{config.TelegramStreamEdit, "While it works you see “typing…”, and a “⏳ Still working” note if one step takes long."},
		{config.TelegramStreamOff, "While it works you see “typing…”."},
	}
	for _, tc := range cases {
		t.Run(tc.streaming, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, setup{adjust: func(c *config.Config) { c.Channels.Telegram.Streaming = tc.streaming }})
				h.say(alice, "/help")
				if !strings.Contains(h.last(alice), tc.want) {
					t.Errorf("/help says:\n%s\nwant it to say %q", h.last(alice), tc.want)
				}
			})
		})
	}
}
