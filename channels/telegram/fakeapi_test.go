package telegram

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-telegram/bot/models"
)

// fakeAPI is a fake Telegram Bot API server. It parses the multipart
// bodies the client sends, keeps the messages of each chat (with edits),
// validates HTML the way Telegram does (unknown tags, unbalanced tags and
// bare & < > are refused with "can't parse entities"), enforces the 4096
// limit, long-polls getUpdates, and can be scripted to fail.
type fakeAPI struct {
	token    string
	botID    int64
	username string
	start    time.Time

	mu         sync.Mutex
	updates    []models.Update
	nextUpdate int64
	updWake    chan struct{} // closed when an update is added
	nextMsg    map[int64]int
	msgs       map[int64][]*fakeMsg
	calls      []apiCall
	faults     []*fault
	commands   []models.BotCommand
	chatMenus  []chatMenu // setMyCommands with a chat's scope, in order
	webhook    map[string]string
	getUpdates int
	offsets    []int64       // the offset of each getUpdates call, in order
	allowed    string        // allowed_updates of the last getUpdates that gave it
	notify     chan struct{} // signalled (non-blocking) after every call and when a long poll waits; for real-time tests
	drafts     bool          // sendMessageDraft is known (Bot API 10.3); otherwise 404 as from an older server
}

type fakeMsg struct {
	id     int
	text   string // visible text
	edits  int
	markup string // reply_markup as sent (JSON), "" without
}

// apiCall is one request to a chat method, as the fake saw it.
type apiCall struct {
	At        time.Duration // since the fake started
	Method    string
	Chat      int64
	MsgID     int
	Text      string // visible text (HTML decoded)
	Raw       string // text as sent
	ParseMode string
	Action    string
	Fault     string // the scripted failure answered, if any
	Markup    string // reply_markup (JSON) of a sendMessage or an edit
	Callback  string // answerCallbackQuery: the query id
	Draft     string // sendMessageDraft: the draft_id
}

// fault is a scripted failure: the next Times calls of Method (to Chat, or
// any chat when 0) get it.
type fault struct {
	Method     string
	Chat       int64
	Times      int
	Status     int // HTTP status for a non-JSON 5xx page; 0 for a JSON error
	Code       int
	Desc       string
	RetryAfter int
	Skip       int // let this many matching calls through first
}

func newFakeAPI(token string) *fakeAPI {
	return &fakeAPI{
		token: token, botID: 777000111, username: "turnguard_test_bot", start: time.Now(),
		nextUpdate: 1000, updWake: make(chan struct{}), nextMsg: map[int64]int{}, msgs: map[int64][]*fakeMsg{},
		notify: make(chan struct{}, 1),
	}
}

func (f *fakeAPI) fail(ft fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = append(f.faults, &ft)
}

// push queues an update for getUpdates.
func (f *fakeAPI) push(u models.Update) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextUpdate++
	u.ID = f.nextUpdate
	if u.Message != nil && u.Message.ID == 0 {
		u.Message.ID = int(f.nextUpdate)
	}
	f.updates = append(f.updates, u)
	close(f.updWake)
	f.updWake = make(chan struct{})
}

// userText is a private message from user chatID.
func userText(chatID int64, text string) models.Update {
	return models.Update{Message: &models.Message{
		Chat: models.Chat{ID: chatID, Type: models.ChatTypePrivate},
		From: &models.User{ID: chatID, FirstName: "User"}, Text: text, Date: 1,
		Entities: commandEntity(text),
	}}
}

func commandEntity(text string) []models.MessageEntity {
	if !strings.HasPrefix(text, "/") {
		return nil
	}
	end := strings.IndexAny(text, " \n")
	if end < 0 {
		end = len(text)
	}
	return []models.MessageEntity{{Type: models.MessageEntityTypeBotCommand, Offset: 0, Length: textLen(text[:end])}}
}

func (f *fakeAPI) say(chatID int64, text string) { f.push(userText(chatID, text)) }

// tap is user from tapping the inline button with data under message msgID
// of chat chatID (a supergroup when chatID < 0); it returns the callback
// query's id.
func (f *fakeAPI) tap(chatID, from int64, msgID int, data string) string {
	f.mu.Lock()
	id := fmt.Sprintf("cbq-%d", f.nextUpdate+1)
	f.mu.Unlock()
	typ := models.ChatTypePrivate
	if chatID < 0 {
		typ = models.ChatTypeSupergroup
	}
	f.push(models.Update{CallbackQuery: &models.CallbackQuery{
		ID: id, From: models.User{ID: from, FirstName: "User"}, Data: data, ChatInstance: "ci",
		Message: models.MaybeInaccessibleMessage{Type: models.MaybeInaccessibleMessageTypeMessage, Message: &models.Message{
			ID: msgID, Date: 1, Chat: models.Chat{ID: chatID, Type: typ},
			From: &models.User{ID: f.botID, IsBot: true, FirstName: "Turnguard Test"},
		}},
	}})
	return id
}

// button is the callback data of the first inline button under message
// msgID of chatID, "" without.
func (f *fakeAPI) button(chatID int64, msgID int) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.msgs[chatID] {
		if m.id != msgID || m.markup == "" {
			continue
		}
		var mk models.InlineKeyboardMarkup
		if err := json.Unmarshal([]byte(m.markup), &mk); err != nil || len(mk.InlineKeyboard) == 0 || len(mk.InlineKeyboard[0]) == 0 {
			return "bad markup: " + m.markup
		}
		return mk.InlineKeyboard[0][0].CallbackData
	}
	return ""
}

// screen is what the user sees in the chat: the bot's messages, oldest
// first, with their current (edited) text.
func (f *fakeAPI) screen(chatID int64) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, m := range f.msgs[chatID] {
		out = append(out, m.text)
	}
	return out
}

// callsTo returns the calls of method to chatID (all chats when 0).
func (f *fakeAPI) callsTo(method string, chatID int64) []apiCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []apiCall
	for _, c := range f.calls {
		if c.Method == method && (chatID == 0 || c.Chat == chatID) {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeAPI) allCalls() []apiCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// signal tells a real-time waiter that something changed.
func (f *fakeAPI) signal() {
	select {
	case f.notify <- struct{}{}:
	default:
	}
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer f.signal()
	rest, ok := strings.CutPrefix(r.URL.Path, "/bot")
	tok, method, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || r.Method != http.MethodPost {
		writeErr(w, 404, "Not Found", 0)
		return
	}
	if tok != f.token {
		writeErr(w, 401, "Unauthorized", 0)
		return
	}
	form, err := parseForm(r)
	if err != nil {
		writeErr(w, 400, "Bad Request: "+err.Error(), 0)
		return
	}
	chat, _ := strconv.ParseInt(form["chat_id"], 10, 64)
	if ft := f.takeFault(method, chat); ft != nil {
		f.record(apiCall{Method: method, Chat: chat, Raw: form["text"], ParseMode: form["parse_mode"], Fault: ft.Desc})
		if ft.Status >= 500 {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(ft.Status)
			fmt.Fprintf(w, "<html><body>%d %s</body></html>", ft.Status, http.StatusText(ft.Status))
			return
		}
		writeErr(w, ft.Code, ft.Desc, ft.RetryAfter)
		return
	}
	switch method {
	case "getMe", "setMyCommands", "setWebhook", "deleteWebhook":
		f.record(apiCall{Method: method})
	}
	switch method {
	case "getMe":
		writeOK(w, models.User{ID: f.botID, IsBot: true, FirstName: "Turnguard Test", Username: f.username})
	case "getUpdates":
		f.serveUpdates(w, r, form)
	case "setMyCommands":
		var cmds []models.BotCommand
		if err := json.Unmarshal([]byte(form["commands"]), &cmds); err != nil {
			writeErr(w, 400, "Bad Request: can't parse commands", 0)
			return
		}
		f.mu.Lock()
		if form["scope"] != "" {
			var sc struct {
				Type   string `json:"type"`
				ChatID int64  `json:"chat_id"`
			}
			if err := json.Unmarshal([]byte(form["scope"]), &sc); err != nil || sc.Type != "chat" || sc.ChatID == 0 {
				f.mu.Unlock()
				writeErr(w, 400, "Bad Request: can't parse scope", 0)
				return
			}
			f.chatMenus = append(f.chatMenus, chatMenu{sc.ChatID, cmds})
		} else {
			f.commands = cmds
		}
		f.mu.Unlock()
		writeOK(w, true)
	case "setWebhook", "deleteWebhook":
		f.mu.Lock()
		if method == "setWebhook" {
			f.webhook = form
		} else {
			f.webhook = nil
		}
		f.mu.Unlock()
		writeOK(w, true)
	case "answerCallbackQuery":
		if form["callback_query_id"] == "" {
			writeErr(w, 400, "Bad Request: query is too old and response timeout expired or query ID is invalid", 0)
			return
		}
		f.record(apiCall{Method: method, Callback: form["callback_query_id"], Text: form["text"]})
		writeOK(w, true)
	case "sendChatAction":
		f.record(apiCall{Method: method, Chat: chat, Action: form["action"]})
		writeOK(w, true)
	case "sendMessage":
		visible, err := checkText(form["text"], form["parse_mode"])
		if err == nil {
			err = checkMarkup(form["reply_markup"])
		}
		if err != nil {
			f.record(apiCall{Method: method, Chat: chat, Raw: form["text"], ParseMode: form["parse_mode"], Fault: err.Error()})
			writeErr(w, 400, err.Error(), 0)
			return
		}
		f.mu.Lock()
		f.nextMsg[chat]++
		id := f.nextMsg[chat]
		f.msgs[chat] = append(f.msgs[chat], &fakeMsg{id: id, text: visible, markup: form["reply_markup"]})
		f.mu.Unlock()
		f.record(apiCall{Method: method, Chat: chat, MsgID: id, Text: visible, Raw: form["text"], ParseMode: form["parse_mode"],
			Markup: form["reply_markup"]})
		writeOK(w, models.Message{ID: id, Date: 1, Chat: models.Chat{ID: chat, Type: models.ChatTypePrivate}, Text: visible})
	case "sendMessageDraft":
		// Private chats only, a non-zero draft_id; "" is "Thinking…".
		f.mu.Lock()
		known := f.drafts
		f.mu.Unlock()
		c := apiCall{Method: method, Chat: chat, Raw: form["text"], ParseMode: form["parse_mode"], Draft: form["draft_id"]}
		visible, err := "", error(nil)
		if form["text"] != "" {
			visible, err = checkText(form["text"], form["parse_mode"])
		}
		switch {
		case !known:
			err = errors.New("Not Found: method sendMessageDraft")
		case err != nil:
		case chat <= 0:
			err = errors.New("Bad Request: TEXTDRAFT_PEER_INVALID")
		case form["draft_id"] == "" || form["draft_id"] == "0":
			err = errors.New("Bad Request: draft_id must be non-zero")
		}
		if err != nil {
			c.Fault = err.Error()
			f.record(c)
			code := 400
			if !known {
				code = 404
			}
			writeErr(w, code, err.Error(), 0)
			return
		}
		c.Text = visible
		f.record(c)
		writeOK(w, true)
	case "editMessageText":
		// As Telegram: an edit without reply_markup removes the inline
		// keyboard.
		id, _ := strconv.Atoi(form["message_id"])
		visible, err := checkText(form["text"], form["parse_mode"])
		if err == nil {
			err = checkMarkup(form["reply_markup"])
		}
		if err == nil {
			err = f.edit(chat, id, visible, form["reply_markup"])
		}
		if err != nil {
			f.record(apiCall{Method: method, Chat: chat, MsgID: id, Raw: form["text"], Fault: err.Error()})
			writeErr(w, 400, err.Error(), 0)
			return
		}
		f.record(apiCall{Method: method, Chat: chat, MsgID: id, Text: visible, Raw: form["text"], ParseMode: form["parse_mode"],
			Markup: form["reply_markup"]})
		writeOK(w, models.Message{ID: id, Date: 1, Chat: models.Chat{ID: chat, Type: models.ChatTypePrivate}, Text: visible})
	case "editMessageReplyMarkup":
		id, _ := strconv.Atoi(form["message_id"])
		text, err := f.editMarkup(chat, id, form["reply_markup"])
		if err != nil {
			f.record(apiCall{Method: method, Chat: chat, MsgID: id, Fault: err.Error()})
			writeErr(w, 400, err.Error(), 0)
			return
		}
		f.record(apiCall{Method: method, Chat: chat, MsgID: id, Markup: form["reply_markup"]})
		writeOK(w, models.Message{ID: id, Date: 1, Chat: models.Chat{ID: chat, Type: models.ChatTypePrivate}, Text: text})
	default:
		writeErr(w, 404, "Not Found: method "+method, 0)
	}
}

func (f *fakeAPI) edit(chat int64, id int, text, markup string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.msgs[chat] {
		if m.id == id {
			if m.text == text && m.markup == markup {
				return errors.New("Bad Request: message is not modified: specified new message content and reply markup are exactly the same")
			}
			m.text, m.markup = text, markup
			m.edits++
			return nil
		}
	}
	return errors.New("Bad Request: message to edit not found")
}

// editMarkup replaces a message's inline keyboard ("" removes it) and
// returns its text.
func (f *fakeAPI) editMarkup(chat int64, id int, markup string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.msgs[chat] {
		if m.id == id {
			if m.markup == markup {
				return "", errors.New("Bad Request: message is not modified: specified new message content and reply markup are exactly the same")
			}
			m.markup = markup
			m.edits++
			return m.text, nil
		}
	}
	return "", errors.New("Bad Request: message to edit not found")
}

func (f *fakeAPI) record(c apiCall) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c.At = time.Since(f.start)
	f.calls = append(f.calls, c)
}

func (f *fakeAPI) takeFault(method string, chat int64) *fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ft := range f.faults {
		if ft.Method == method && (ft.Chat == 0 || ft.Chat == chat) && ft.Times > 0 {
			if ft.Skip > 0 {
				ft.Skip--
				continue
			}
			ft.Times--
			return ft
		}
	}
	return nil
}

func (f *fakeAPI) serveUpdates(w http.ResponseWriter, r *http.Request, form map[string]string) {
	offset, _ := strconv.ParseInt(form["offset"], 10, 64)
	wait, _ := strconv.Atoi(form["timeout"])
	f.mu.Lock()
	f.offsets = append(f.offsets, offset)
	if a := form["allowed_updates"]; a != "" {
		f.allowed = a
	}
	f.mu.Unlock()
	deadline := time.NewTimer(time.Duration(wait) * time.Second)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		f.getUpdates++
		// Telegram forgets the updates below the offset: they are confirmed.
		f.updates = slices.DeleteFunc(f.updates, func(u models.Update) bool { return u.ID < offset })
		if len(f.updates) > 0 || wait == 0 {
			out := slices.Clone(f.updates)
			f.mu.Unlock()
			if out == nil {
				out = []models.Update{}
			}
			writeOK(w, out)
			return
		}
		wake := f.updWake
		f.mu.Unlock()
		f.signal() // a long poll is waiting
		select {
		case <-wake:
		case <-deadline.C:
			wait = 0
		case <-r.Context().Done():
			return
		}
	}
}

// parseForm reads the multipart body the client sends.
func parseForm(r *http.Request) (map[string]string, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	if len(body) == 0 {
		return out, nil
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" {
		return nil, fmt.Errorf("content type %q is not multipart/form-data", r.Header.Get("Content-Type"))
	}
	form, err := multipart.NewReader(bytes.NewReader(body), params["boundary"]).ReadForm(1 << 20)
	if err != nil {
		return nil, fmt.Errorf("multipart: %w", err)
	}
	for k, v := range form.Value {
		out[k] = v[0]
	}
	return out, nil
}

func writeOK(w http.ResponseWriter, result any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "result": result})
}

func writeErr(w http.ResponseWriter, code int, desc string, retryAfter int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	body := map[string]any{"ok": false, "error_code": code, "description": desc}
	if retryAfter > 0 {
		body["parameters"] = map[string]any{"retry_after": retryAfter}
	}
	_ = json.NewEncoder(w).Encode(body)
}

// checkText validates a message text as Telegram does and returns the
// visible text.
func checkText(text, parseMode string) (string, error) {
	visible := text
	if parseMode == "HTML" {
		var err error
		if visible, err = parseHTML(text); err != nil {
			return "", err
		}
	} else if parseMode != "" {
		return "", fmt.Errorf("Bad Request: unsupported parse_mode %q", parseMode)
	}
	switch n := textLen(visible); {
	case strings.TrimSpace(visible) == "":
		return "", errors.New("Bad Request: message text is empty")
	case n > MaxMessageLen:
		return "", fmt.Errorf("Bad Request: message is too long (%d)", n)
	}
	return visible, nil
}

var htmlTags = map[string]bool{"b": true, "strong": true, "i": true, "em": true, "u": true, "ins": true,
	"s": true, "strike": true, "del": true, "code": true, "pre": true, "a": true, "tg-spoiler": true,
	"span": true, "blockquote": true}

// parseHTML checks Telegram HTML and returns the visible text.
func parseHTML(s string) (string, error) {
	bad := func(why string) error { return errors.New("Bad Request: can't parse entities: " + why) }
	var out strings.Builder
	var stack []string
	for i := 0; i < len(s); {
		switch s[i] {
		case '<':
			j := strings.IndexByte(s[i:], '>')
			if j < 0 {
				return "", bad("unclosed start tag")
			}
			tag := s[i+1 : i+j]
			i += j + 1
			if name, ok := strings.CutPrefix(tag, "/"); ok {
				if len(stack) == 0 || stack[len(stack)-1] != name {
					return "", bad("unmatched end tag " + name)
				}
				stack = stack[:len(stack)-1]
				continue
			}
			name, _, _ := strings.Cut(tag, " ")
			if !htmlTags[name] {
				return "", bad("unsupported start tag \"" + name + "\"")
			}
			stack = append(stack, name)
		case '&':
			j := strings.IndexByte(s[i:], ';')
			if j < 0 {
				return "", bad("bare &")
			}
			switch ent := s[i+1 : i+j]; ent {
			case "amp":
				out.WriteByte('&')
			case "lt":
				out.WriteByte('<')
			case "gt":
				out.WriteByte('>')
			case "quot":
				out.WriteByte('"')
			default:
				return "", bad("unsupported entity &" + ent + ";")
			}
			i += j + 1
		case '>':
			return "", bad("bare >")
		default:
			out.WriteByte(s[i])
			i++
		}
	}
	if len(stack) > 0 {
		return "", bad("unclosed tag " + stack[len(stack)-1])
	}
	return out.String(), nil
}

// memTransport calls the fake server's handler in-process, so that a
// synctest bubble sees every wait as durably blocking. fail, if set, can
// make a request fail like a broken network.
type memTransport struct {
	h     http.Handler
	mu    sync.Mutex
	fail  func(*http.Request) error
	sends int // sendMessage requests made through this transport
}

// sendCount is the number of sendMessage requests made through m.
func (m *memTransport) sendCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sends
}

func (m *memTransport) setFail(f func(*http.Request) error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fail = f
}

func (m *memTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	m.mu.Lock()
	fail := m.fail
	if strings.HasSuffix(req.URL.Path, "/sendMessage") {
		m.sends++
	}
	m.mu.Unlock()
	drain := func() {
		if req.Body != nil {
			_, _ = io.Copy(io.Discard, req.Body)
			_ = req.Body.Close()
		}
	}
	if fail != nil {
		if err := fail(req); err != nil {
			drain()
			return nil, err
		}
	}
	rec := httptest.NewRecorder()
	m.h.ServeHTTP(rec, req)
	drain()
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}

// checkMarkup refuses an inline keyboard as the Bot API would: a button
// with a copy_text whose text is empty (what the client library's own
// button type sends) is BUTTON_COPY_TEXT_INVALID.
func checkMarkup(markup string) error {
	if markup == "" {
		return nil
	}
	var mk struct {
		InlineKeyboard [][]map[string]json.RawMessage `json:"inline_keyboard"`
	}
	if err := json.Unmarshal([]byte(markup), &mk); err != nil {
		return fmt.Errorf("Bad Request: can't parse reply keyboard markup JSON object")
	}
	for _, row := range mk.InlineKeyboard {
		for _, b := range row {
			if ct, ok := b["copy_text"]; ok {
				var c struct{ Text string }
				if json.Unmarshal(ct, &c) != nil || c.Text == "" {
					return fmt.Errorf("Bad Request: BUTTON_COPY_TEXT_INVALID")
				}
			}
		}
	}
	return nil
}
