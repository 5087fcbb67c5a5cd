package fakebot

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/testwait"
)

func call(t *testing.T, b *Bot, method string, form url.Values) (int, map[string]any) {
	t.Helper()
	res, err := http.PostForm(b.URL()+"/bot"+Token+"/"+method, form)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var v map[string]any
	_ = json.NewDecoder(res.Body).Decode(&v)
	return res.StatusCode, v
}

// TestBot: a queued message is long-polled once and then confirmed away by
// the offset; a second poll while one waits gets 409 as from Telegram; sent
// messages are recorded, refused ones too when told to fail.
func TestBot(t *testing.T) {
	b := New(t)
	if code, _ := call(t, b, "getMe", nil); code != 200 {
		t.Fatalf("getMe: %d", code)
	}
	id := b.Say("/stop now")
	code, v := call(t, b, "getUpdates", url.Values{"offset": {"0"}, "timeout": {"0"}})
	res, _ := v["result"].([]any)
	if code != 200 || len(res) != 1 || !strings.Contains(mustJSON(res[0]), `"bot_command"`) {
		t.Fatalf("getUpdates: %d %v", code, v)
	}
	// Confirmed by the next offset: gone.
	_, v = call(t, b, "getUpdates", url.Values{"offset": {jsonNum(id + 1)}, "timeout": {"0"}})
	if res, _ := v["result"].([]any); len(res) != 0 {
		t.Fatalf("a confirmed update came again: %v", v)
	}

	// A long poll waits; a second one meanwhile is refused with 409.
	polled := make(chan int, 1)
	go func() {
		c, _ := call(t, b, "getUpdates", url.Values{"offset": {jsonNum(id + 1)}, "timeout": {"5"}})
		polled <- c
	}()
	testwait.Until(t, 5*time.Second, "the long poll waits", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.polling == 1
	})
	if code, _ := call(t, b, "getUpdates", url.Values{"timeout": {"0"}}); code != 409 || b.Conflicts() != 1 {
		t.Fatalf("a poll that overlapped another: %d, want 409", code)
	}
	b.Say("wake up")
	if c := <-polled; c != 200 {
		t.Fatalf("the long poll: %d", c)
	}

	if polls := b.Polls(); len(polls) != 2 || polls[0].Via != "" || polls[0].Updates[0] != id {
		t.Fatalf("polls %+v", polls)
	}

	// Through a named base URL: recorded with its name.
	res2, err := http.PostForm(b.URLFor("r2")+"/bot"+Token+"/sendMessage", url.Values{"chat_id": {"4242"}, "text": {"hello"}})
	if err != nil {
		t.Fatal(err)
	}
	res2.Body.Close()
	if m := b.Messages(); len(m) != 1 || m[0].Via != "r2" {
		t.Fatalf("messages %+v, want one via r2", m)
	}
	b.SetFail(true)
	if code, _ := call(t, b, "sendMessage", url.Values{"chat_id": {"4242"}, "text": {"refused"}}); code != 500 {
		t.Fatalf("sendMessage while failing: %d", code)
	}
	if sent := b.Sent(); len(sent) != 1 || sent[0] != "hello" || b.Count("hello") != 1 {
		t.Fatalf("sent %q", sent)
	}
	if got := b.WaitSent(time.Second, "hello", func(s string) bool { return s == "hello" }); got != "hello" {
		t.Fatalf("WaitSent: %q", got)
	}
}

// TestButtons: a message's inline keyboard is kept; Press queues a
// callback_query under it; answerCallbackQuery is recorded as the tap's
// toast; editMessageText replaces the text and, without reply_markup, drops
// the keyboard; editMessageReplyMarkup the keyboard only; an unknown
// message and an edit that changes nothing are 400 as from Telegram.
func TestButtons(t *testing.T) {
	b := New(t)
	kb := `{"inline_keyboard":[[{"text":"Allow once","callback_data":"ap:x:0"},{"text":"Reject","callback_data":"ap:x:1"}]]}`
	code, v := call(t, b, "sendMessage", url.Values{"chat_id": {"4242"}, "text": {"Question?"}, "reply_markup": {kb}})
	if code != 200 {
		t.Fatalf("sendMessage: %d %v", code, v)
	}
	id := int(v["result"].(map[string]any)["message_id"].(float64))
	s := b.WaitShown(time.Second, "with buttons", func(s Shown) bool { return s.Buttons != nil })
	if s.ID != id || s.Text != "Question?" || mustJSON(s.Labels()) != `["Allow once","Reject"]` || s.Button("Reject") != "ap:x:1" {
		t.Fatalf("shown %+v", s)
	}
	if m := b.Messages(); len(m) != 1 || m[0].ID != id || m[0].Markup != kb {
		t.Fatalf("messages %+v", m)
	}

	q := b.Press(User{ID: Chat, Username: "alice"}, id, s.Button("Allow once"))
	_, v = call(t, b, "getUpdates", url.Values{"timeout": {"0"}})
	res, _ := v["result"].([]any)
	if len(res) != 1 {
		t.Fatalf("getUpdates after Press: %v", v)
	}
	cb, _ := res[0].(map[string]any)["callback_query"].(map[string]any)
	if cb == nil || cb["id"] != q || cb["data"] != "ap:x:0" || !strings.Contains(mustJSON(cb["from"]), `"username":"alice"`) ||
		cb["message"].(map[string]any)["message_id"].(float64) != float64(id) {
		t.Fatalf("callback_query %v", res[0])
	}
	if code, _ := call(t, b, "answerCallbackQuery", url.Values{"callback_query_id": {q}, "text": {"Allowed"}}); code != 200 {
		t.Fatalf("answerCallbackQuery: %d", code)
	}
	if a := b.WaitAnswer(time.Second, q); a.Text != "Allowed" {
		t.Fatalf("answer %+v", a)
	}

	// editMessageReplyMarkup with another keyboard, then editMessageText
	// without one.
	one := `{"inline_keyboard":[[{"text":"Retry","callback_data":"rt:1"}]]}`
	if code, _ := call(t, b, "editMessageReplyMarkup", url.Values{"chat_id": {"4242"}, "message_id": {jsonNum(int64(id))}, "reply_markup": {one}}); code != 200 {
		t.Fatalf("editMessageReplyMarkup: %d", code)
	}
	if s := b.Shown()[0]; s.Text != "Question?" || mustJSON(s.Labels()) != `["Retry"]` || s.Edits != 1 {
		t.Fatalf("after editMessageReplyMarkup: %+v", s)
	}
	if code, _ := call(t, b, "editMessageText", url.Values{"chat_id": {"4242"}, "message_id": {jsonNum(int64(id))}, "text": {"Answered"}}); code != 200 {
		t.Fatalf("editMessageText: %d", code)
	}
	if s := b.Shown(); len(s) != 1 || s[0].Text != "Answered" || s[0].Buttons != nil || s[0].Edits != 2 {
		t.Fatalf("after editMessageText: %+v", s)
	}
	if code, v := call(t, b, "editMessageText", url.Values{"chat_id": {"4242"}, "message_id": {jsonNum(int64(id))}, "text": {"Answered"}}); code != 400 ||
		!strings.Contains(mustJSON(v), "message is not modified") {
		t.Fatalf("an edit that changes nothing: %d %v", code, v)
	}
	if code, v := call(t, b, "editMessageText", url.Values{"chat_id": {"4242"}, "message_id": {"999"}, "text": {"x"}}); code != 400 ||
		!strings.Contains(mustJSON(v), "message to edit not found") {
		t.Fatalf("an edit of an unknown message: %d %v", code, v)
	}
	if sent := b.Sent(); len(sent) != 1 || sent[0] != "Question?" {
		t.Fatalf("Sent %q: edits are not sends", sent)
	}
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

func jsonNum(n int64) string { return mustJSON(n) }

// TestDrafts: sendMessageDraft is refused outside private chats, with a
// zero or non-integer draft_id and past 4096 characters; an empty draft is
// accepted (Telegram's "Thinking…"); updates of one draft_id are one draft,
// shown with its HTML parsed, and stay visible as not followed until a
// real sendMessage reaches the chat; TapStop delivers
// stopped_message_generation; every draft counts against the chat's rate.
func TestDrafts(t *testing.T) {
	b := New(t)
	for _, tc := range []struct {
		name string
		form url.Values
		want string
	}{
		{"group", url.Values{"chat_id": {jsonNum(Group)}, "draft_id": {"7"}, "text": {"x"}}, "TEXTDRAFT_PEER_INVALID"},
		{"zero id", url.Values{"chat_id": {"4242"}, "draft_id": {"0"}, "text": {"x"}}, "non-zero"},
		{"string id", url.Values{"chat_id": {"4242"}, "draft_id": {"abc"}, "text": {"x"}}, "non-zero"},
		{"too long", url.Values{"chat_id": {"4242"}, "draft_id": {"7"}, "text": {strings.Repeat("é", MaxDraftLen+1)}}, "too long"},
	} {
		if code, v := call(t, b, "sendMessageDraft", tc.form); code != 400 || !strings.Contains(mustJSON(v), tc.want) {
			t.Errorf("%s: %d %v, want 400 %q", tc.name, code, v, tc.want)
		}
	}
	if d := b.Drafts(); len(d) != 0 {
		t.Fatalf("refused drafts are shown: %+v", d)
	}
	for _, form := range []url.Values{
		{"chat_id": {"4242"}, "draft_id": {"7"}, "text": {""}, "can_stop": {"true"}},
		{"chat_id": {"4242"}, "draft_id": {"7"}, "text": {"<b>Hello</b> &amp; more"}, "parse_mode": {"HTML"}, "can_stop": {"true"}},
	} {
		if code, v := call(t, b, "sendMessageDraft", form); code != 200 || v["result"] != true {
			t.Fatalf("sendMessageDraft %v: %d %v", form, code, v)
		}
	}
	d := b.Drafts()
	if len(d) != 1 || d[0].DraftID != 7 || d[0].Text != "Hello & more" || d[0].Updates != 2 || !d[0].CanStop || d[0].Followed ||
		mustJSON(d[0].Texts) != `["","Hello \u0026 more"]` {
		t.Fatalf("drafts %+v", d)
	}
	b.TapStop(7)
	_, v := call(t, b, "getUpdates", url.Values{"timeout": {"0"}})
	res, _ := v["result"].([]any)
	if len(res) != 1 || !strings.Contains(mustJSON(res[0]), `"stopped_message_generation":{"chat":{"first_name":"User","id":4242,"type":"private"},"draft_id":7}`) {
		t.Fatalf("the Stop tap's update: %v", v)
	}
	if code, _ := call(t, b, "sendMessage", url.Values{"chat_id": {"4242"}, "text": {"Hello & more, in full"}}); code != 200 {
		t.Fatalf("sendMessage: %d", code)
	}
	if d := b.WaitDraft(time.Second, "followed", func(d Draft) bool { return d.Followed }); !d.Stopped {
		t.Fatalf("draft %+v: not marked stopped", d)
	}
	if n := b.MaxInWindow(Chat, time.Second); n != 6 {
		t.Fatalf("MaxInWindow = %d, want 6: the 3 refused and 2 accepted drafts and the message", n)
	}
}
