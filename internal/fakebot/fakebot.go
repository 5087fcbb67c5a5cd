// Package fakebot is a fake Telegram Bot API on loopback (httptest) for tests
// that run built gateway processes: it long-polls updates queued by the test
// (Say, and Press for a tap on an inline button), records every message the
// gateways send to the chat with its inline keyboard, applies their edits
// (editMessageText, editMessageReplyMarkup: Shown is the chat as the user
// sees it now), records the toasts of answerCallbackQuery, answers a
// second getUpdates that overlaps a running one with 409 Conflict (as
// Telegram does, so several replicas polling at once are seen), and can be
// told to fail sendMessage with HTTP 500. One Bot may serve any number of
// gateways; each may be given its own base URL (URLFor) so that the fake
// knows which one polled and which one sent.
//
// Drafts (Bot API 10.3): sendMessageDraft is answered as Telegram does —
// private chats only, a non-zero integer draft_id, at most 4096 characters
// (empty shows Telegram's "Thinking…") — and counted against the chat's
// rate like any message (Message.Method "sendMessageDraft"; MaxInWindow).
// Drafts returns each draft as the chat shows it, and whether a real
// sendMessage followed it (a draft is only a preview: one left open is a
// reply the user never got). TapStop delivers a tap on a draft's Stop
// button (the stopped_message_generation update). SayIn speaks in Group, a
// supergroup, where drafts are refused.
//
// (cmd/gateway's crash tests carry an older copy of this server; it can move
// onto this package.)
package fakebot

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf16"

	"github.com/turnguard/turnguard/internal/tb"
)

// Token is the bot token the fake accepts; Chat the private chat of the
// test's user.
const (
	Token = "4240001:fakebot-token"
	Chat  = int64(4242)
	// Group is a supergroup the test's user speaks in (SayIn).
	Group = int64(-1004242)
	// Username is the bot's username (getMe), without the @.
	Username = "fake_test_bot"
)

// MaxDraftLen is the longest draft text the fake accepts, in UTF-16 code
// units after entity parsing, as Telegram counts.
const MaxDraftLen = 4096

// Message is a sendMessage, editMessageText or editMessageReplyMarkup call
// the fake answered.
type Message struct {
	Via    string // the name in the base URL it came through (URLFor); "" for URL
	Method string // sendMessage, editMessageText or editMessageReplyMarkup
	ChatID string
	Text   string // editMessageReplyMarkup: the message's text
	OK     bool   // false: answered 500 (SetFail) or 400 (an edit of an unknown or unchanged message)
	At     time.Time
	ID     int    // the message_id sent (answered) or edited; 0 for a send that failed
	Markup string // the reply_markup parameter as it came (JSON); "" when none
}

// Button is an inline keyboard button.
type Button struct {
	Text string `json:"text"`
	Data string `json:"callback_data"`
}

// Shown is a message as the chat shows it now: its text and inline
// keyboard after every edit.
type Shown struct {
	ID      int
	Text    string
	Buttons [][]Button // nil: no keyboard
	Edits   int
}

// Labels returns the texts of the message's buttons, row by row.
func (s Shown) Labels() []string {
	var out []string
	for _, row := range s.Buttons {
		for _, b := range row {
			out = append(out, b.Text)
		}
	}
	return out
}

// Button returns the callback data of the button labelled text, "" when
// there is none.
func (s Shown) Button(text string) string {
	for _, row := range s.Buttons {
		for _, b := range row {
			if b.Text == text {
				return b.Data
			}
		}
	}
	return ""
}

// User is who taps a button (Press).
type User struct {
	ID        int64
	Username  string // without the @
	FirstName string
}

// Answer is an answerCallbackQuery call: the toast a tap got.
type Answer struct {
	QueryID string
	Text    string
	At      time.Time
}

// Bot is the fake API server.
type Bot struct {
	t   tb.TB
	srv *httptest.Server

	mu        sync.Mutex
	updates   []map[string]any
	nextID    int64
	wake      chan struct{} // closed when an update is queued
	closing   chan struct{} // closed at cleanup: long polls answer at once
	msgs      []Message
	shown     []*Shown // the messages sent, as edited since
	answers   []Answer
	nextQuery int
	fail      bool
	polling   int // getUpdates calls in flight
	conflicts int // getUpdates answered 409 because another was in flight
	polls     []Poll
	hold      *hold // the next send to hold (Hold), nil when none
	drafts    []*Draft
}

// hold is a send the fake keeps waiting (Hold).
type hold struct {
	match  func(text string) bool
	accept bool        // record the message as sent before waiting
	held   chan string // gets the replica (Via) whose send is held
	once   bool        // a send was held
}

// Hold makes the next sendMessage or editMessageText whose text satisfies
// match wait without an answer until its caller goes away (a killed
// replica's connection closes) or the fake closes. accept false: the
// message was not accepted — nothing is recorded, as when Telegram never
// got it; accept true: it is recorded as sent first, as when Telegram
// accepted it and the answer was lost. The returned channel gets the held
// caller's replica name (Message.Via). One send is held; later ones pass.
func (b *Bot) Hold(match func(text string) bool, accept bool) <-chan string {
	h := &hold{match: match, accept: accept, held: make(chan string, 1)}
	b.mu.Lock()
	b.hold = h
	b.mu.Unlock()
	return h.held
}

// New starts the fake; it is closed at the test's cleanup.
func New(t tb.TB) *Bot {
	b := &Bot{t: t, nextID: 100, wake: make(chan struct{}), closing: make(chan struct{})}
	b.srv = httptest.NewServer(b)
	t.Cleanup(func() {
		close(b.closing)
		b.srv.CloseClientConnections() // long polls of killed gateways
		b.srv.Close()
	})
	return b
}

// URL is the API's base URL (channels.telegram.apiURL).
func (b *Bot) URL() string { return b.srv.URL }

// URLFor is a base URL for the gateway named name (a path segment that is
// not "bot…"): calls through it are recorded with Via = name.
func (b *Bot) URLFor(name string) string { return b.srv.URL + "/" + name }

// Poll is a getUpdates call that handed out updates.
type Poll struct {
	Via     string
	Updates []int64 // update ids, in order
	At      time.Time
}

// Polls returns the getUpdates calls that handed out updates, in order.
func (b *Bot) Polls() []Poll {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Poll(nil), b.polls...)
}

// SetFail makes sendMessage answer HTTP 500 (true) or succeed again.
func (b *Bot) SetFail(fail bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail = fail
}

// Say queues a private message from the test's chat and returns its
// update id.
func (b *Bot) Say(text string) int64 { return b.SayIn(Chat, text) }

// SayIn queues a message from the test's user in chat (Chat, or Group:
// there a message is for the bot when it mentions "@"+Username or is a
// command) and returns its update id. Text is ASCII.
func (b *Bot) SayIn(chat int64, text string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nextID++
	msg := map[string]any{"message_id": b.nextID, "date": time.Now().Unix(), "text": text,
		"chat": chatJSON(strconv.FormatInt(chat, 10)),
		"from": map[string]any{"id": Chat, "is_bot": false, "first_name": "User"}}
	var entities []map[string]any
	if strings.HasPrefix(text, "/") {
		n := strings.IndexByte(text+" ", ' ')
		entities = append(entities, map[string]any{"type": "bot_command", "offset": 0, "length": n})
	}
	if i := strings.Index(text, "@"+Username); i >= 0 {
		entities = append(entities, map[string]any{"type": "mention", "offset": i, "length": len(Username) + 1})
	}
	if entities != nil {
		msg["entities"] = entities
	}
	b.pushLocked(map[string]any{"update_id": b.nextID, "message": msg})
	return b.nextID
}

// chatJSON is the Chat object of chat id (Group is a supergroup, any other
// negative id a group, a positive one a private chat).
func chatJSON(id string) map[string]any {
	n, _ := strconv.ParseInt(id, 10, 64)
	switch {
	case n == Group:
		return map[string]any{"id": n, "type": "supergroup", "title": "Fake group"}
	case n < 0:
		return map[string]any{"id": n, "type": "group", "title": "Fake group"}
	}
	return map[string]any{"id": n, "type": "private", "first_name": "User"}
}

// pushLocked queues an update and wakes the long polls. Called with b.mu
// held.
func (b *Bot) pushLocked(u map[string]any) {
	b.updates = append(b.updates, u)
	close(b.wake)
	b.wake = make(chan struct{})
}

// Press queues a tap by from on the inline button with callback data data
// under message messageID of the test's chat (a callback_query update, as
// Telegram sends it) and returns the callback query's id, which the toast
// (Answers, WaitAnswer) is recorded under.
func (b *Bot) Press(from User, messageID int, data string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nextID++
	b.nextQuery++
	id := "cbq-" + strconv.Itoa(b.nextQuery)
	user := map[string]any{"id": from.ID, "is_bot": false, "first_name": from.FirstName}
	if from.FirstName == "" {
		user["first_name"] = "User"
	}
	if from.Username != "" {
		user["username"] = from.Username
	}
	msg := map[string]any{"message_id": messageID, "date": time.Now().Unix(),
		"chat": map[string]any{"id": Chat, "type": "private"},
		"from": map[string]any{"id": 4240001, "is_bot": true, "first_name": "Fake", "username": "fake_test_bot"}}
	for _, m := range b.shown {
		if m.ID == messageID {
			msg["text"] = m.Text
		}
	}
	b.pushLocked(map[string]any{"update_id": b.nextID, "callback_query": map[string]any{
		"id": id, "from": user, "message": msg, "chat_instance": "fakebot-" + strconv.FormatInt(Chat, 10), "data": data}})
	return id
}

// Answers returns the answerCallbackQuery calls, in order.
func (b *Bot) Answers() []Answer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Answer(nil), b.answers...)
}

// WaitAnswer waits until the tap queryID (Press) was answered and returns
// the answer; it fails the test after within.
func (b *Bot) WaitAnswer(within time.Duration, queryID string) Answer {
	b.t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, a := range b.Answers() {
			if a.QueryID == queryID {
				return a
			}
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("fakebot: the tap %s was not answered within %v; answers %+v", queryID, within, b.Answers())
		}
		time.Sleep(10 * time.Millisecond) // real time: waiting for another process
	}
}

// Shown returns the messages sent to the chat as it shows them now (edits
// applied), in the order they were sent.
func (b *Bot) Shown() []Shown {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Shown, len(b.shown))
	for i, m := range b.shown {
		out[i] = *m
	}
	return out
}

// WaitShown waits until a message the chat shows satisfies match and
// returns it; it fails the test after within.
func (b *Bot) WaitShown(within time.Duration, what string, match func(Shown) bool) Shown {
	b.t.Helper()
	return waitFor(b, within, b.Shown, match, func() {
		b.t.Fatalf("fakebot: the chat shows no message %s after %v:%s", what, within, b)
	})
}

// waitFor polls items until one satisfies match and returns it; after
// within it calls fail (which fails the test).
func waitFor[T any](b *Bot, within time.Duration, items func() []T, match func(T) bool, fail func()) T {
	b.t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, x := range items() {
			if match(x) {
				return x
			}
		}
		if time.Now().After(deadline) {
			fail()
			var zero T
			return zero
		}
		time.Sleep(10 * time.Millisecond) // real time: waiting for another process
	}
}

// Messages returns the calls that sent or edited a message, in order.
func (b *Bot) Messages() []Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Message(nil), b.msgs...)
}

// Sent returns the texts of the sendMessage calls answered 200.
func (b *Bot) Sent() []string {
	var out []string
	for _, m := range b.Messages() {
		if m.Method == "sendMessage" && m.OK {
			out = append(out, m.Text)
		}
	}
	return out
}

// Conflicts is how many getUpdates calls were answered 409 because another
// was in flight (several replicas polling at once).
func (b *Bot) Conflicts() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.conflicts
}

// Count is how many delivered messages contain s.
func (b *Bot) Count(s string) int {
	n := 0
	for _, t := range b.Sent() {
		if strings.Contains(t, s) {
			n++
		}
	}
	return n
}

// WaitSent waits until a delivered message satisfies match and returns it;
// it fails the test after within.
func (b *Bot) WaitSent(within time.Duration, what string, match func(text string) bool) string {
	b.t.Helper()
	return waitFor(b, within, b.Sent, match, func() {
		b.t.Fatalf("fakebot: no message %s reached the chat within %v; delivered %q", what, within, b.Sent())
	})
}

// ServeHTTP is the Bot API.
func (b *Bot) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path, via := r.URL.Path, ""
	if first, after, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/"); ok && !strings.HasPrefix(first, "bot") {
		path, via = "/"+after, first
	}
	rest, _ := strings.CutPrefix(path, "/bot")
	tok, method, _ := strings.Cut(rest, "/")
	if tok != Token {
		answer(w, http.StatusUnauthorized, nil, "Unauthorized")
		return
	}
	// A call without parameters (getMe) comes with an empty multipart body,
	// which does not parse; its form is then simply empty.
	_ = r.ParseMultipartForm(1 << 20)
	// Read to EOF: only then does the server notice a client that went away
	// (a killed gateway's long poll) and cancel the request's context.
	_, _ = io.Copy(io.Discard, r.Body)
	switch method {
	case "getMe":
		answer(w, 200, map[string]any{"id": 4240001, "is_bot": true, "first_name": "Fake", "username": Username}, "")
	case "setMyCommands", "deleteWebhook", "setWebhook", "sendChatAction", "deleteMessage":
		answer(w, 200, true, "")
	case "answerCallbackQuery":
		if r.FormValue("callback_query_id") == "" {
			answer(w, http.StatusBadRequest, nil, "Bad Request: query is too old and response timeout expired or query ID is invalid")
			return
		}
		b.mu.Lock()
		b.answers = append(b.answers, Answer{QueryID: r.FormValue("callback_query_id"), Text: r.FormValue("text"), At: time.Now()})
		b.mu.Unlock()
		answer(w, 200, true, "")
	case "editMessageText", "editMessageReplyMarkup":
		b.serveEdit(w, r, via, method)
	case "getUpdates":
		b.serveUpdates(w, r, via)
	case "sendMessageDraft":
		b.serveDraft(w, r, via)
	case "sendMessage":
		m := Message{Via: via, Method: method, ChatID: r.FormValue("chat_id"), Text: r.FormValue("text"), At: time.Now(),
			Markup: r.FormValue("reply_markup")}
		if desc := badMarkup(m.Markup); desc != "" {
			answer(w, http.StatusBadRequest, nil, desc)
			return
		}
		b.mu.Lock()
		if h := b.holdLocked(m.Text); h != nil {
			if h.accept {
				m.OK = true
				b.msgs = append(b.msgs, m)
				m.ID = len(b.msgs)
				b.msgs[m.ID-1].ID = m.ID
				b.shown = append(b.shown, &Shown{ID: m.ID, Text: m.Text, Buttons: keyboard(m.Markup)})
				b.followLocked(m.ChatID)
			}
			b.mu.Unlock()
			b.wait(r, h, via)
			return
		}
		m.OK = !b.fail
		b.msgs = append(b.msgs, m)
		id := len(b.msgs)
		if m.OK {
			b.msgs[id-1].ID = id
			b.shown = append(b.shown, &Shown{ID: id, Text: m.Text, Buttons: keyboard(m.Markup)})
			b.followLocked(m.ChatID)
		}
		b.mu.Unlock()
		if !m.OK {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, "<html>500 Internal Server Error</html>")
			return
		}
		answer(w, 200, map[string]any{"message_id": id, "date": time.Now().Unix(), "text": m.Text,
			"chat": chatJSON(m.ChatID)}, "")
	default:
		answer(w, http.StatusNotFound, nil, "Not Found: method "+method)
	}
}

// holdLocked returns the hold (Hold) a send or edit of text is to wait
// on, nil when it goes on. Called with b.mu held.
func (b *Bot) holdLocked(text string) *hold {
	h := b.hold
	if h == nil || h.once || !h.match(text) {
		return nil
	}
	h.once = true
	return h
}

// wait keeps a held call (Hold) without an answer until its caller goes
// away or the fake closes.
func (b *Bot) wait(r *http.Request, h *hold, via string) {
	h.held <- via
	select {
	case <-r.Context().Done(): // the caller went away
	case <-b.closing:
	}
}

// serveEdit edits a message sent before, as Telegram does: editMessageText
// replaces the text and the inline keyboard (none without reply_markup);
// editMessageReplyMarkup the keyboard only. An unknown message_id is "message
// to edit not found", an edit that changes nothing "message is not
// modified" (400 both).
func (b *Bot) serveEdit(w http.ResponseWriter, r *http.Request, via, method string) {
	id, _ := strconv.Atoi(r.FormValue("message_id"))
	m := Message{Via: via, Method: method, ChatID: r.FormValue("chat_id"), Text: r.FormValue("text"), At: time.Now(),
		ID: id, Markup: r.FormValue("reply_markup")}
	if desc := badMarkup(m.Markup); desc != "" {
		answer(w, http.StatusBadRequest, nil, desc)
		return
	}
	b.mu.Lock()
	var h *hold
	if method == "editMessageText" {
		h = b.holdLocked(m.Text)
	}
	if h != nil && !h.accept {
		b.mu.Unlock()
		b.wait(r, h, via)
		return
	}
	var target *Shown
	for _, s := range b.shown {
		if s.ID == id {
			target = s
		}
	}
	desc := ""
	switch {
	case target == nil:
		desc = "Bad Request: message to edit not found"
	case method == "editMessageReplyMarkup":
		m.Text = target.Text
	}
	if target != nil {
		buttons := keyboard(m.Markup)
		if m.Text == target.Text && mustMarshal(buttons) == mustMarshal(target.Buttons) {
			desc = "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message"
		} else {
			target.Text, target.Buttons = m.Text, buttons
			target.Edits++
		}
	}
	m.OK = desc == ""
	b.msgs = append(b.msgs, m)
	b.mu.Unlock()
	if h != nil {
		b.wait(r, h, via)
		return
	}
	if desc != "" {
		answer(w, http.StatusBadRequest, nil, desc)
		return
	}
	answer(w, 200, map[string]any{"message_id": id, "date": time.Now().Unix(), "edit_date": time.Now().Unix(), "text": m.Text,
		"chat": chatJSON(m.ChatID)}, "")
}

// badMarkup is the Bot API's refusal of an inline keyboard, "" for a good
// one: a button whose copy_text has no text (what the client library's own
// button type sends) is BUTTON_COPY_TEXT_INVALID.
func badMarkup(markup string) string {
	if markup == "" {
		return ""
	}
	var v struct {
		InlineKeyboard [][]map[string]json.RawMessage `json:"inline_keyboard"`
	}
	if json.Unmarshal([]byte(markup), &v) != nil {
		return "Bad Request: can't parse reply keyboard markup JSON object"
	}
	for _, row := range v.InlineKeyboard {
		for _, b := range row {
			if ct, ok := b["copy_text"]; ok {
				var c struct{ Text string }
				if json.Unmarshal(ct, &c) != nil || c.Text == "" {
					return "Bad Request: BUTTON_COPY_TEXT_INVALID"
				}
			}
		}
	}
	return ""
}

// keyboard reads the inline keyboard of a reply_markup parameter; nil when
// there is none.
func keyboard(markup string) [][]Button {
	var v struct {
		InlineKeyboard [][]Button `json:"inline_keyboard"`
	}
	if markup == "" || json.Unmarshal([]byte(markup), &v) != nil || len(v.InlineKeyboard) == 0 {
		return nil
	}
	return v.InlineKeyboard
}

func mustMarshal(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func (b *Bot) serveUpdates(w http.ResponseWriter, r *http.Request, via string) {
	b.mu.Lock()
	if b.polling > 0 {
		b.conflicts++
		b.mu.Unlock()
		answer(w, http.StatusConflict, nil, "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running")
		return
	}
	b.polling++
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.polling--
		b.mu.Unlock()
	}()
	offset, _ := strconv.ParseInt(r.FormValue("offset"), 10, 64)
	wait, _ := strconv.Atoi(r.FormValue("timeout"))
	timer := time.NewTimer(time.Duration(wait) * time.Second)
	defer timer.Stop()
	for {
		b.mu.Lock()
		var out []map[string]any
		kept := b.updates[:0]
		for _, u := range b.updates {
			if u["update_id"].(int64) >= offset {
				kept = append(kept, u)
				out = append(out, u)
			}
		}
		b.updates = kept
		if len(out) > 0 {
			p := Poll{Via: via, At: time.Now()}
			for _, u := range out {
				p.Updates = append(p.Updates, u["update_id"].(int64))
			}
			b.polls = append(b.polls, p)
		}
		wake := b.wake
		b.mu.Unlock()
		if len(out) > 0 || wait == 0 {
			if out == nil {
				out = []map[string]any{}
			}
			answer(w, 200, out, "")
			return
		}
		select {
		case <-wake:
		case <-timer.C:
			wait = 0
		case <-b.closing:
			wait = 0
		case <-r.Context().Done():
			return
		}
	}
}

func answer(w http.ResponseWriter, status int, result any, desc string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if status == 200 {
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "result": result})
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error_code": status, "description": desc})
}

// String summarises the chat for failure messages.
func (b *Bot) String() string {
	var s strings.Builder
	for _, m := range b.Messages() {
		fmt.Fprintf(&s, "\n  %s #%d via %q ok=%v %q", m.Method, m.ID, m.Via, m.OK, m.Text)
		if m.Markup != "" {
			fmt.Fprintf(&s, " markup %s", m.Markup)
		}
	}
	return s.String()
}

// MaxInWindow is the largest number of calls that sent, edited or drafted
// a message in chat (answered or not) within any span of window: what
// Telegram's per-chat rate limit counts.
func (b *Bot) MaxInWindow(chat int64, window time.Duration) int {
	id := strconv.FormatInt(chat, 10)
	var at []time.Time
	for _, m := range b.Messages() {
		if m.ChatID == id {
			at = append(at, m.At)
		}
	}
	most := 0
	for i := range at {
		n := 0
		for j := i; j < len(at) && at[j].Sub(at[i]) < window; j++ {
			n++
		}
		most = max(most, n)
	}
	return most
}

// visibleText is text as the chat shows it: with parse_mode HTML, the tags
// dropped and the entities &lt; &gt; &amp; &quot; decoded.
func visibleText(text, parseMode string) string {
	if parseMode != "HTML" {
		return text
	}
	var out strings.Builder
	for i := 0; i < len(text); {
		switch {
		case text[i] == '<':
			j := strings.IndexByte(text[i:], '>')
			if j < 0 {
				out.WriteString(text[i:])
				return out.String()
			}
			i += j + 1
		case text[i] == '&':
			done := false
			for ent, r := range map[string]string{"&lt;": "<", "&gt;": ">", "&amp;": "&", "&quot;": `"`} {
				if strings.HasPrefix(text[i:], ent) {
					out.WriteString(r)
					i += len(ent)
					done = true
					break
				}
			}
			if !done {
				out.WriteByte('&')
				i++
			}
		default:
			out.WriteByte(text[i])
			i++
		}
	}
	return out.String()
}

// utf16Len is the length of s in UTF-16 code units (Telegram's unit).
func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		n += utf16.RuneLen(r)
	}
	return n
}
