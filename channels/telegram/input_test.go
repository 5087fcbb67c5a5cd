package telegram

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/store"
)

const botName = "turnguard_test_bot"

// groupMsg is a message in the group from user `from`. A "@turnguard_test_bot"
// in the text gets its mention entity, a leading command its command entity.
func groupMsg(from int64, text string) models.Update {
	m := &models.Message{Chat: models.Chat{ID: groupChatID, Type: models.ChatTypeSupergroup, Title: "Team"},
		From: &models.User{ID: from, FirstName: "Member"}, Text: text, Date: 1, Entities: commandEntity(text)}
	if i := strings.Index(text, "@"+botName); i >= 0 && !strings.HasPrefix(text, "/") {
		m.Entities = append(m.Entities, models.MessageEntity{Type: models.MessageEntityTypeMention,
			Offset: textLen(text[:i]), Length: textLen("@" + botName)})
	}
	return models.Update{Message: m}
}

// TestGroupChats: in a group the bot answers only when mentioned, replied
// to, or sent one of its commands; never to other bots.
func TestGroupChats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		botMsg := &models.Message{ID: 1, From: &models.User{ID: h.api.botID, IsBot: true, Username: botName},
			Chat: models.Chat{ID: groupChatID, Type: models.ChatTypeSupergroup}}
		reply := groupMsg(alice, "/steps work:1s say:replied")
		reply.Message.ReplyToMessage = botMsg
		fromBot := groupMsg(alice, "@"+botName+" /steps say:loop")
		fromBot.Message.From = &models.User{ID: 999, IsBot: true}
		sticker := groupMsg(alice, "")
		sticker.Message.Sticker = &models.Sticker{FileID: "x"}
		joined := groupMsg(alice, "")
		joined.Message.NewChatMembers = []models.User{{ID: 5}}

		for _, u := range []models.Update{
			groupMsg(alice, "hello everyone"),    // not for the bot
			groupMsg(alice, "/status@other_bot"), // another bot's command
			sticker, joined, fromBot,             // ignored
			groupMsg(alice, "@"+botName+" /steps work:1s say:one"), // mentioned
			reply, // a reply to the bot
			groupMsg(alice, "/steps@"+botName+" work:1s say:addressed"), // the bot's own command form
			groupMsg(alice, "/status"),                                  // a bare command of this bot
			groupMsg(alice, "/mode"),                                    // the gateway's /mode, bare
			groupMsg(alice, "/steps say:bare_unknown_command"),          // bare, not this bot's command
		} {
			h.api.push(u)
			synctest.Wait()
			h.advance(5 * time.Second)
		}
		h.wantScreen(groupChatID, "one", "replied", "addressed", textIdle, messages.AgentNoModes)
		var calls []string
		for _, c := range h.api.allCalls() {
			if c.Chat == groupChatID {
				calls = append(calls, c.Method)
			}
		}
		want := []string{"sendChatAction", "sendMessage", "sendChatAction", "sendMessage", "sendChatAction", "sendMessage", "sendMessage", "sendMessage"}
		if !slices.Equal(calls, want) {
			t.Errorf("calls to the group %v, want %v (ignored messages get nothing, not even typing)", calls, want)
		}
	})
}

// TestGroupStopOwner: in a group only the member who started a request may
// stop it.
func TestGroupStopOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		h.api.push(groupMsg(alice, "@"+botName+" /steps shell:hang"))
		synctest.Wait()
		h.advance(time.Second)
		h.api.push(groupMsg(bob, "/stop"))
		synctest.Wait()
		h.advance(5 * time.Second)
		h.api.push(groupMsg(alice, "/stop@"+botName))
		synctest.Wait()
		h.advance(5 * time.Second)
		h.wantScreen(groupChatID, textNotOwner, "⏹️ Stopped while shell was running after 6 s.")
	})
}

// TestBadInput: updates without text, edits, service messages and huge
// messages get a short answer or none, and never wedge the chat.
func TestBadInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{adjust: func(c *config.Config) { c.Channels.Telegram.MaxInputChars = 100 }})
		sticker := userText(alice, "")
		sticker.Message.Sticker = &models.Sticker{FileID: "x"}
		photo := userText(alice, "")
		photo.Message.Photo = []models.PhotoSize{{FileID: "p"}}
		pinned := userText(alice, "")
		pinned.Message.PinnedMessage = &models.MaybeInaccessibleMessage{Message: &models.Message{ID: 3, Date: 1,
			Chat: models.Chat{ID: alice, Type: models.ChatTypePrivate}, Text: "pinned"}}
		edited := models.Update{EditedMessage: userText(alice, "/steps say:edited").Message}
		reaction := models.Update{MessageReaction: &models.MessageReactionUpdated{}}
		for _, u := range []models.Update{sticker, photo, pinned, edited, reaction, userText(alice, strings.Repeat("x", 5000)),
			userText(alice, "   "), userText(alice, "/steps say:still_here")} {
			h.api.push(u)
		}
		synctest.Wait()
		h.advance(10 * time.Second)
		h.wantScreen(alice, textNotText, textNotText, textEdited, tooLongText(5000, 100), textEmpty, "still here")
	})
}

// TestInboxOverflow: a chat that floods faster than it is handled loses
// the excess (logged), and still works afterwards.
func TestInboxOverflow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{noRun: true})
		// Without Run nothing drains the queue: fill it directly.
		h.ch.me.Store(&identity{id: h.api.botID, username: botName})
		h.ch.mu.Lock()
		ch := h.ch.chatLocked(alice)
		ch.inRunning = true // pretend the worker is busy
		h.ch.mu.Unlock()
		for i := range inboxLimit + 10 {
			h.ch.dispatch(ptr(userText(alice, fmt.Sprintf("/status %d", i))))
		}
		h.ch.mu.Lock()
		queued := len(ch.inbox)
		ch.inbox, ch.inRunning = ch.inbox[:1], false
		h.ch.mu.Unlock()
		if queued != inboxLimit {
			t.Errorf("%d updates queued, want %d", queued, inboxLimit)
		}
		if n := strings.Count(h.logs.String(), "dropping its updates"); n != 1 {
			t.Errorf("the drop was logged %d times, want once", n)
		}
		h.ch.dispatch(ptr(userText(alice, "/stop")))
		synctest.Wait()
		h.advance(3 * time.Second)
		h.wantScreen(alice, textIdle, textNothingToStop)
	})
}

func ptr[T any](v T) *T { return &v }

// TestAllowList: chats outside a non-empty allow-list get nothing at all —
// not even typing — and are logged once.
func TestAllowList(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{adjust: func(c *config.Config) { c.Channels.Telegram.AllowedChatIDs = []int64{alice} }})
		for _, text := range []string{"/steps say:hi", "/help", "/status"} {
			h.say(bob, text)
		}
		h.say(alice, "/steps say:welcome")
		h.advance(5 * time.Second)
		for _, c := range h.api.allCalls() {
			if c.Chat == bob {
				t.Errorf("a call to the refused chat: %s", callLine(c))
			}
		}
		h.wantScreen(alice, "welcome")
		if n := strings.Count(h.logs.String(), "not in channels.telegram.allowedChatIDs\" channel=telegram chat=1002"); n != 1 {
			t.Errorf("the refused chat was logged %d times, want once:\n%s", n, h.logs.String())
		}
	})
}

// TestStartupWarning: an empty allow-list with a runner that costs money
// is warned about at start-up.
func TestStartupWarning(t *testing.T) {
	cases := []struct {
		name    string
		runner  string
		allowed []int64
		warn    bool
	}{
		{"demo, open to all", config.RunnerDemo, nil, false},
		{"exec, open to all", config.RunnerExec, nil, true},
		{"exec, restricted", config.RunnerExec, []int64{alice}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, setup{noRun: true, adjust: func(c *config.Config) {
					c.Channels.Telegram.Runner = tc.runner
					c.Agents.Exec.Command = "/bin/true"
					c.Channels.Telegram.AllowedChatIDs = tc.allowed
				}})
				got := strings.Contains(h.logs.String(), "allowedChatIDs is empty")
				if got != tc.warn {
					t.Errorf("warned = %v, want %v:\n%s", got, tc.warn, h.logs.String())
				}
			})
		})
	}
}

// TestStartupCalls: polling mode registers the commands and removes any
// webhook before polling.
func TestStartupCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		var methods []string
		for _, c := range h.api.allCalls() {
			methods = append(methods, c.Method)
		}
		if want := []string{"getMe", "setMyCommands", "deleteWebhook"}; !slices.Equal(methods, want) {
			t.Errorf("start-up calls %v, want %v", methods, want)
		}
		var names []string
		for _, c := range h.api.commands {
			names = append(names, c.Command)
		}
		if want := []string{"stop", "status", "new", "queue", "help"}; !slices.Equal(names, want) {
			t.Errorf("commands %v, want %v", names, want)
		}
	})
}

// TestStartupRetries: getMe is retried while Telegram fails; a refused
// token stops Run with an error that does not contain it.
func TestStartupRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{noRun: true, prepare: func(f *fakeAPI, _ *memTransport) {
			f.fail(fault{Method: "getMe", Times: 3, Status: 502, Desc: "502"})
		}})
		h.run()
		h.advance(10 * time.Second)
		h.say(alice, "/steps say:up")
		h.advance(time.Second)
		h.wantScreen(alice, "up")
	})
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{noRun: true, prepare: func(f *fakeAPI, _ *memTransport) {
			f.fail(fault{Method: "getMe", Times: 1, Code: 401, Desc: "Unauthorized"})
		}})
		err := h.ch.Run(context.Background())
		if err == nil || !strings.Contains(err.Error(), "refused the token") || strings.Contains(err.Error(), testToken) {
			t.Errorf("Run = %v, want a token error without the token", err)
		}
	})
}

// TestTokenNotLogged: errors that quote the request URL (which holds the
// token) are logged redacted.
func TestTokenNotLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tr *memTransport
		h := newHarness(t, setup{noRun: true, prepare: func(_ *fakeAPI, m *memTransport) { tr = m }})
		failures := 0
		tr.setFail(func(r *http.Request) error {
			if strings.HasSuffix(r.URL.Path, "/getUpdates") && failures < 3 {
				failures++
				return fmt.Errorf("read %s: connection reset by peer (token %s)", r.URL, testToken)
			}
			return nil
		})
		h.run()
		h.advance(5 * time.Second)
		h.say(alice, "/steps say:fine")
		h.advance(time.Second)
		h.wantScreen(alice, "fine")
		logs := h.logs.String()
		if !strings.Contains(logs, "polling failed") || !strings.Contains(logs, redacted) {
			t.Errorf("the polling failures were not logged redacted:\n%s", logs)
		}
		// h.stop (cleanup) fails the test if the token is in the logs.
	})
}

// TestOutboxAtStartup: pending outbox messages — such as the "interrupted"
// notice the gateway queues for turns cut off by a crash — are delivered at
// start-up; hopeless ones are marked failed.
func TestOutboxAtStartup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ob := newFakeOutbox()
		interrupted := "⚠️ Your request was interrupted by a server problem — last action was shell. Please send it again."
		for _, m := range []store.OutboxMessage{
			{Channel: "telegram", ChatRef: "1001", RunID: "r1", Kind: store.OutboxNotice, Text: interrupted},
			{Channel: "telegram", ChatRef: "1002", RunID: "r2", Kind: store.OutboxFinal, Text: "old"},
			{Channel: "telegram", ChatRef: "not-a-chat", RunID: "r3", Kind: store.OutboxNotice, Text: "x"},
			{Channel: "ws", ChatRef: "1001", RunID: "r4", Kind: store.OutboxNotice, Text: "not ours"},
		} {
			if _, err := ob.Enqueue(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		}
		ob.rows[2].m.Attempts = maxOutboxTries
		h := newHarness(t, setup{outbox: ob})
		h.advance(time.Second)
		h.wantScreen(alice, interrupted)
		h.wantScreen(bob)
		if got, want := ob.states(), []string{"notice:delivered", "final:failed", "notice:failed", "notice:pending"}; !slices.Equal(got, want) {
			t.Errorf("outbox %v, want %v", got, want)
		}
	})
}

// TestOutboxDuplicate: a terminal message the outbox already holds is
// delivered by whoever queued it first, not twice.
func TestOutboxDuplicate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		h.say(alice, "/steps say:once")
		h.advance(2 * time.Second)
		h.ch.onEvent(finishedEvent(h, alice)) // the same run's ending published again
		h.advance(2 * time.Second)
		h.wantScreen(alice, "once")
	})
}

// TestOutboxUnavailable: if the outbox refuses, the reply is still sent.
func TestOutboxUnavailable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ob := newFakeOutbox()
		ob.errOut = errors.New("disk full")
		h := newHarness(t, setup{outbox: ob})
		h.say(alice, "/steps say:anyway")
		h.advance(time.Second)
		h.wantScreen(alice, "anyway")
		if !strings.Contains(h.logs.String(), "outbox enqueue failed; sending anyway") {
			t.Error("the outbox failure was not logged")
		}
	})
}

// TestSendText: operator alerts reach any chat, split when long; after
// Close, SendText refuses.
func TestSendText(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		long := strings.Repeat("alert line\n", 500)
		if err := h.ch.SendText(context.Background(), 4242, "🚨 "+long); err != nil {
			t.Fatalf("SendText: %v", err)
		}
		if got := h.screen(4242); len(got) != 2 || !strings.HasPrefix(got[0], "🚨 alert line") {
			t.Errorf("alert shown as %d messages", len(got))
		}
		if err := h.ch.SendText(context.Background(), 4242, " "); err == nil {
			t.Error("SendText of blank text succeeded")
		}
		h.stop()
		if err := h.ch.SendText(context.Background(), 4242, "late"); !errors.Is(err, ErrClosed) {
			t.Errorf("SendText after Close = %v, want ErrClosed", err)
		}
	})
}

// TestHTMLFallback: if Telegram refuses the formatted reply, it is sent
// again as plain text.
func TestHTMLFallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{prepare: func(f *fakeAPI, _ *memTransport) {
			f.fail(fault{Method: "sendMessage", Chat: alice, Times: 1, Code: 400, Desc: "Bad Request: can't parse entities: unsupported start tag"})
		}})
		h.say(alice, "/steps say:**bold**_&_<x>")
		h.advance(3 * time.Second)
		h.wantScreen(alice, "**bold** & <x>")
		calls := h.api.callsTo("sendMessage", alice)
		if len(calls) != 2 || calls[0].ParseMode != "HTML" || calls[1].ParseMode != "" {
			t.Errorf("calls %v, want an HTML attempt then plain text", callLines(calls))
		}
	})
}

// TestWebhook drives the webhook handler: only POSTs with the right secret
// and a well-formed update are accepted, and only once the channel is up.
func TestWebhook(t *testing.T) {
	const secret = "s3cret_webhook-token"
	webhook := func(c *config.Config) {
		tg := &c.Channels.Telegram
		tg.Mode, tg.WebhookSecret, tg.WebhookURL = config.TelegramWebhook, secret, "https://bot.example.com/telegram/webhook"
	}
	post := func(h *harness, method, secretHeader, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, "/telegram/webhook", strings.NewReader(body))
		if secretHeader != "" {
			req.Header.Set(SecretHeader, secretHeader)
		}
		rec := httptest.NewRecorder()
		h.ch.WebhookHandler().ServeHTTP(rec, req)
		synctest.Wait()
		return rec
	}
	update := `{"update_id":5,"message":{"message_id":9,"date":1,"chat":{"id":1001,"type":"private"},"from":{"id":1001,"first_name":"A"},"text":"/steps say:via_webhook"}}`

	t.Run("requests", func(t *testing.T) {
		cases := []struct {
			name, method, secret, body string
			status                     int
		}{
			{"GET", http.MethodGet, secret, update, http.StatusMethodNotAllowed},
			{"no secret", http.MethodPost, "", update, http.StatusUnauthorized},
			{"wrong secret", http.MethodPost, "guess", update, http.StatusUnauthorized},
			{"not JSON", http.MethodPost, secret, "{not json", http.StatusBadRequest},
			{"too large", http.MethodPost, secret, `{"update_id":1,"x":"` + strings.Repeat("a", webhookBodyLimit) + `"}`, http.StatusRequestEntityTooLarge},
			{"ignored update", http.MethodPost, secret, `{"update_id":6,"channel_post":{"message_id":1,"date":1,"chat":{"id":-5,"type":"channel"}}}`, http.StatusOK},
			{"accepted", http.MethodPost, secret, update, http.StatusOK},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					h := newHarness(t, setup{adjust: webhook})
					if rec := post(h, tc.method, tc.secret, tc.body); rec.Code != tc.status {
						t.Errorf("status %d, want %d", rec.Code, tc.status)
					}
					h.advance(time.Second)
					if tc.name == "accepted" {
						h.wantScreen(alice, "via webhook")
					} else {
						h.wantScreen(alice)
					}
				})
			})
		}
	})

	t.Run("start-up registers the webhook, no polling", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := newHarness(t, setup{adjust: webhook})
			h.advance(time.Minute)
			wh := h.api.webhook
			if wh["url"] != "https://bot.example.com/telegram/webhook" || wh["secret_token"] != secret ||
				wh["allowed_updates"] != `["message","edited_message","callback_query","stopped_message_generation"]` {
				t.Errorf("setWebhook got %v", wh)
			}
			if h.api.getUpdates != 0 {
				t.Errorf("getUpdates called %d times in webhook mode", h.api.getUpdates)
			}
		})
	})

	t.Run("not ready before start-up and after close", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := newHarness(t, setup{adjust: webhook, noRun: true})
			rec := post(h, http.MethodPost, secret, update)
			if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
				t.Errorf("before Run: status %d, Retry-After %q; want 503 with Retry-After", rec.Code, rec.Header().Get("Retry-After"))
			}
			h.run()
			if rec := post(h, http.MethodPost, secret, update); rec.Code != http.StatusOK {
				t.Errorf("after start-up: status %d", rec.Code)
			}
			h.cancelRun()
			synctest.Wait()
			if rec := post(h, http.MethodPost, secret, update); rec.Code != http.StatusServiceUnavailable {
				t.Errorf("after Run returned: status %d", rec.Code)
			}
		})
	})

	t.Run("polling mode has no webhook", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := newHarness(t, setup{})
			if rec := post(h, http.MethodPost, "", update); rec.Code != http.StatusNotFound {
				t.Errorf("status %d, want 404", rec.Code)
			}
		})
	})
}

// TestWebhookRedelivery: Telegram redelivering an update (our 200 got
// lost) does not start the request twice.
func TestWebhookRedelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{adjust: func(c *config.Config) {
			tg := &c.Channels.Telegram
			tg.Mode, tg.WebhookSecret = config.TelegramWebhook, "abc-webhook-secret"
		}})
		u := userText(alice, "/steps shell:2s say:once")
		u.Message.ID = 77
		for range 3 {
			h.ch.dispatch(&u)
			synctest.Wait()
		}
		h.advance(5 * time.Second)
		h.wantScreen(alice, "once")
	})
}

// TestNotAcceptingTurns: while the gateway cannot take turns (its store
// cannot write), a message gets a plain "try again shortly" and no internal
// cause; once it can, the next message runs.
func TestNotAcceptingTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var refuse atomic.Bool
		refuse.Store(true)
		h := newHarness(t, setup{admit: func() error {
			if refuse.Load() {
				return errors.New("store cannot write since 2000-01-01T00:00:00Z: the disk is full")
			}
			return nil
		}})
		h.api.push(userText(alice, "/steps say:first"))
		synctest.Wait()
		h.advance(5 * time.Second)
		refuse.Store(false)
		h.api.push(userText(alice, "/steps say:second"))
		synctest.Wait()
		h.advance(10 * time.Second)
		h.wantScreen(alice, (&gateway.UnavailableError{}).UserText(), "second")
	})
}
