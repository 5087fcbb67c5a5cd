// Drafts (Bot API 10.3 sendMessageDraft): the rules Telegram enforces
// (private chats only, a non-zero integer draft_id, 4096 characters,
// counted against the chat's rate), whether a real message followed each
// draft, and a tap on a draft's Stop button (stopped_message_generation).

package fakebot

import (
	"net/http"
	"strconv"
	"time"
)

// Draft is a message draft (sendMessageDraft) as the chat shows it.
type Draft struct {
	ChatID     string
	DraftID    int64
	Text       string // the latest text, entities parsed ("" = Telegram's "Thinking…")
	ParseMode  string
	CanStop    bool // the latest update showed the Stop button
	KeepOnStop bool
	Updates    int       // sendMessageDraft calls answered 200 for it
	Texts      []string  // every text it showed, in order
	First, At  time.Time // the first and the latest update
	// Followed: a real sendMessage reached the chat after the draft's
	// latest update (the preview was followed by a message).
	Followed bool
	// Stopped: TapStop was delivered for it.
	Stopped bool
}

// serveDraft answers sendMessageDraft as Telegram does: only in a private
// chat, with a non-zero integer draft_id and at most MaxDraftLen
// characters (empty: "Thinking…"); each call counts against the chat's
// rate (it is recorded with the messages).
func (b *Bot) serveDraft(w http.ResponseWriter, r *http.Request, via string) {
	chat := r.FormValue("chat_id")
	m := Message{Via: via, Method: "sendMessageDraft", ChatID: chat, Text: visibleText(r.FormValue("text"), r.FormValue("parse_mode")), At: time.Now()}
	n, _ := strconv.ParseInt(chat, 10, 64)
	draftID, err := strconv.ParseInt(r.FormValue("draft_id"), 10, 64)
	desc := ""
	switch {
	case n <= 0:
		desc = "Bad Request: TEXTDRAFT_PEER_INVALID" // drafts are for private chats only
	case err != nil || draftID == 0:
		desc = "Bad Request: draft_id must be a non-zero integer"
	case utf16Len(m.Text) > MaxDraftLen:
		desc = "Bad Request: text is too long"
	}
	b.mu.Lock()
	m.OK = desc == ""
	b.msgs = append(b.msgs, m)
	if m.OK {
		var d *Draft
		for _, x := range b.drafts {
			if x.ChatID == chat && x.DraftID == draftID {
				d = x
			}
		}
		if d == nil {
			d = &Draft{ChatID: chat, DraftID: draftID, First: m.At}
			b.drafts = append(b.drafts, d)
		}
		d.Text, d.ParseMode, d.At, d.Followed = m.Text, r.FormValue("parse_mode"), m.At, false
		d.CanStop, d.KeepOnStop = r.FormValue("can_stop") == "true", r.FormValue("keep_on_stop") == "true"
		d.Texts = append(d.Texts, m.Text)
		d.Updates++
	}
	b.mu.Unlock()
	if desc != "" {
		answer(w, http.StatusBadRequest, nil, desc)
		return
	}
	answer(w, 200, true, "")
}

// followLocked records that a real message reached chat: its drafts were
// followed by one. Called with b.mu held.
func (b *Bot) followLocked(chat string) {
	for _, d := range b.drafts {
		if d.ChatID == chat {
			d.Followed = true
		}
	}
}

// Drafts returns the drafts shown so far, oldest first, as the chat shows
// them now.
func (b *Bot) Drafts() []Draft {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Draft, len(b.drafts))
	for i, d := range b.drafts {
		out[i] = *d
		out[i].Texts = append([]string(nil), d.Texts...)
	}
	return out
}

// WaitDraft waits until a draft satisfies match and returns it; it fails
// the test after within.
func (b *Bot) WaitDraft(within time.Duration, what string, match func(Draft) bool) Draft {
	b.t.Helper()
	return waitFor(b, within, b.Drafts, match, func() {
		b.t.Fatalf("fakebot: the chat shows no draft %s after %v; drafts %+v:%s", what, within, b.Drafts(), b)
	})
}

// TapStop queues a tap on the Stop button of draft draftID in the test's
// chat (the stopped_message_generation update, as Telegram sends it) and
// returns its update id.
func (b *Bot) TapStop(draftID int64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	chat := strconv.FormatInt(Chat, 10)
	for _, d := range b.drafts {
		if d.ChatID == chat && d.DraftID == draftID {
			d.Stopped = true
		}
	}
	b.nextID++
	b.pushLocked(map[string]any{"update_id": b.nextID, "stopped_message_generation": map[string]any{
		"chat": chatJSON(chat), "draft_id": draftID}})
	return b.nextID
}
