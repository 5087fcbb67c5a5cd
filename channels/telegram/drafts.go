package telegram

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/go-telegram/bot"
	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/channels/delivery"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
)

// Drafts (channels.telegram.streaming: draft). In a private chat a running
// turn is shown in a Telegram draft (Bot API 10.3 sendMessageDraft, with
// can_stop): empty at first — Telegram's "Thinking…" placeholder — then the
// reply so far, with the step lines (showSteps) and the "⏳ Still working"
// notice below it as its live status. A draft update takes the chat's
// pacing slot like a message, and only the latest text goes. A draft is a
// preview of about 30 seconds, so one that did not change is sent again
// every draftRefresh while the turn runs; when the turn ends the reply and
// any notice go as real messages (the outbox, as in every mode), and the
// draft is not updated again. Groups, a chat where Telegram refused a
// draft, and every chat of a Bot API server that has no sendMessageDraft
// (404) get edited messages instead (edit mode).
//
// A tap on the draft's Stop button comes back as a
// stopped_message_generation update, which the bot library cannot decode:
// it is read from the raw update (stopOf) — the webhook's body, the
// cluster's stored update, or, when the library polls, the getUpdates
// answer it is given (peekUpdates) — and handled in the chat's order as a
// /stop, provided the draft is the running turn's (handleStopTap).

const (
	// draftRefresh: a draft that did not change is sent again this often
	// while its turn runs (Telegram shows a draft for about 30 s).
	draftRefresh = 20 * time.Second
	// maxDraftStatus bounds the status part of a draft (step lines and
	// notice), in runes; the newest part is kept.
	maxDraftStatus = 1000
	// maxPeekedStops bounds the Stop taps read from getUpdates answers and
	// not yet dispatched (an answer holds at most 100 updates).
	maxPeekedStops = 200
)

// stoppedGeneration is the stopped_message_generation update: the user
// tapped Stop on a draft sent with can_stop.
type stoppedGeneration struct {
	Chat     models.Chat `json:"chat"`
	ThreadID int         `json:"message_thread_id,omitempty"`
	DraftID  draftID     `json:"draft_id"`
}

// draftID is a draft_id as an update carries it: an integer (a quoted one
// is read too).
type draftID int64

func (d *draftID) UnmarshalJSON(b []byte) error {
	n, err := strconv.ParseInt(strings.Trim(string(b), `"`), 10, 64)
	if err != nil {
		return fmt.Errorf("draft_id %s: %w", b, err)
	}
	*d = draftID(n)
	return nil
}

var stopField = []byte(`"stopped_message_generation"`)

// stopOf returns the stopped_message_generation of a raw update, nil when
// it has none (or one without a chat).
func stopOf(raw []byte) *stoppedGeneration {
	if !bytes.Contains(raw, stopField) {
		return nil
	}
	var u struct {
		Stop *stoppedGeneration `json:"stopped_message_generation"`
	}
	if json.Unmarshal(raw, &u) != nil || u.Stop == nil || u.Stop.Chat.ID == 0 {
		return nil
	}
	return u.Stop
}

// peekUpdates reads the Stop taps of a getUpdates answer the library is
// about to decode (doer.peek) and keeps them by update id until dispatch
// gets their updates, in order, from the library.
func (c *Channel) peekUpdates(body []byte) {
	if !bytes.Contains(body, stopField) {
		return
	}
	var ans struct {
		Result []json.RawMessage `json:"result"`
	}
	if json.Unmarshal(body, &ans) != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, raw := range ans.Result {
		s := stopOf(raw)
		if s == nil {
			continue
		}
		var id struct {
			ID int64 `json:"update_id"`
		}
		if json.Unmarshal(raw, &id) != nil {
			continue
		}
		if c.stops == nil {
			c.stops = map[int64]*stoppedGeneration{}
		}
		if len(c.stops) >= maxPeekedStops {
			clear(c.stops) // updates the library never handed on (a failed poll): stale
		}
		c.stops[id.ID] = s
	}
}

// takeStop returns (and forgets) the Stop tap peeked in update id, nil
// when it is not one.
func (c *Channel) takeStop(id int64) *stoppedGeneration {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stops[id]
	delete(c.stops, id)
	return s
}

// draftIDOf is the draft id of run runID: non-zero, and the same on every
// replica and after a restart, so a Stop tap names its turn wherever it is
// handled.
func draftIDOf(runID string) int64 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(runID))
	if id := int64(h.Sum32() & 0x7fffffff); id != 0 {
		return id
	}
	return 1
}

// handleStopTap acts on a tap on a draft's Stop button: when the draft is
// the session's running turn's, exactly as /stop (stop reason user, the
// queue dropped, the same words); a tap on the draft of a turn that has
// ended — it raced the turn's reply — stops nothing, so the next turn is
// not stopped by it (the stop names its turn: gateway.StopRequest.RunID).
// Drafts are shown in private chats only, where the chat is the turn's
// owner: the tap is the owner's.
func (c *Channel) handleStopTap(ctx context.Context, ch *chat, s *stoppedGeneration) {
	c.mu.Lock()
	for _, t := range ch.turns {
		if t.draft != nil && t.draft.id == int64(s.DraftID) && t.active {
			t.draft.stopped = true // Telegram took the draft away: it is not sent again
		}
	}
	c.mu.Unlock()
	st, err := c.eng.StatusOf(ctx, ch.key) // the running turn may be another replica's
	if err != nil {
		c.log.Warn("telegram: a Stop tap could not be matched with the running turn", "chat", ch.id, "err", c.red.err(err))
		c.reply(ch, conv.TextCannotStop)
		return
	}
	if !st.Running || draftIDOf(st.Turn.RunID) != int64(s.DraftID) {
		c.log.Info("telegram: a Stop tap on the draft of a turn that has ended; nothing to stop", "chat", ch.id, "draft", int64(s.DraftID))
		return
	}
	res, err := c.eng.StopWith(ctx, gateway.StopRequest{SessionKey: ch.key, RunID: st.Turn.RunID})
	switch {
	case err != nil:
		c.log.Error("telegram: a Stop tap could not stop the turn", "chat", ch.id, "run", st.Turn.RunID, "err", c.red.err(err))
	case !res.Aborted && !res.Stopping && res.Dropped == 0:
		c.log.Info("telegram: a Stop tap came as its turn ended; nothing to stop", "chat", ch.id, "run", st.Turn.RunID)
		return
	default:
		c.queueDropped(ch)
	}
	if text := conv.StopText(res, err); text != "" {
		c.reply(ch, text)
	}
}

// streamingLocked is how a turn starting now in ch is shown
// (config.TelegramStream*). Called with c.mu held.
func (c *Channel) streamingLocked(ch *chat) string {
	switch m := c.cfg.Current().Channels.Telegram.Streaming; {
	case m == config.TelegramStreamOff:
		return m
	case m == config.TelegramStreamDraft && !ch.group && !ch.noDrafts && !c.noDrafts.Load():
		return m
	}
	return config.TelegramStreamEdit
}

// draftView is a turn's draft (draft mode).
type draftView struct {
	id       int64
	reply    string // the reply so far
	status   string // the "still working" notice, "" when none
	shownSt  string // the status shown: the step lines and the notice (refreshDraft)
	rev      uint64 // counts the changes of reply and shownSt
	sentRev  uint64 // the rev the draft shows
	shown    bool   // sent once at least
	sentAt   time.Time
	stopped  bool // the user tapped Stop: Telegram removed it
	failures int
	retryAt  time.Time
}

// due reports when the draft is next to be sent; ok false: never (it was
// stopped).
func (d *draftView) due() (at time.Time, ok bool) {
	switch {
	case d.stopped:
		return time.Time{}, false
	case !d.shown || d.rev != d.sentRev:
		return d.retryAt, true
	}
	return d.sentAt.Add(draftRefresh), true
}

// refreshDraft notes that the draft changed (its reply, steps or notice)
// and updates its status: the step lines and the notice, the newest
// maxDraftStatus runes. Cheap: the text is composed when it is sent
// (draftText), at most once per pacing slot however often it changes.
func (t *turnView) refreshDraft() {
	d := t.draft
	var status []string
	if len(t.lines) > 0 {
		status = append(status, t.stepsText())
	}
	if d.status != "" {
		status = append(status, d.status)
	}
	d.shownSt = tail(strings.Join(status, "\n"), maxDraftStatus)
	d.rev++
}

// draftText is a draft's text (HTML): the end of the reply so far,
// rendered as a reply is and within Telegram's 4096 characters with the
// status, then the status. "" shows Telegram's "Thinking…".
func draftText(reply, status string) string {
	var parts []string
	if strings.TrimSpace(reply) != "" {
		chunks := splitReplyWithin(strings.ToValidUTF8(reply, "\uFFFD"), MaxMessageLen-fenceReserve-textLen(status)-8)
		last := toHTML(chunks[len(chunks)-1])
		if len(chunks) > 1 {
			last = "…\n" + last
		}
		parts = append(parts, last)
	}
	if status != "" {
		parts = append(parts, escapeHTML(status))
	}
	return strings.Join(parts, "\n\n")
}

// tail is the last n runes of s, starting with "…" when cut.
func tail(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return "…" + string(r[len(r)-n+1:])
}

// updateDraft sends a turn's draft with its latest text. The chat's
// pacing slot was taken by nextLocked. A draft Telegram refuses for good
// (a chat where drafts are not allowed) turns the chat to edit mode, this
// turn included.
func (c *Channel) updateDraft(ctx context.Context, ch *chat, t *turnView) {
	c.mu.Lock()
	d := t.draft
	if d == nil {
		c.mu.Unlock()
		return
	}
	reply, status, rev, id := d.reply, d.shownSt, d.rev, d.id
	c.mu.Unlock()
	text := draftText(reply, status) // outside the lock: a long reply takes a while

	err := c.liveCall(ctx, ch, func(ctx context.Context) error { return c.api.draft(ctx, ch.id, id, text, true, true) })

	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	switch {
	case err == nil:
		d.sentRev, d.shown, d.sentAt, d.failures = rev, true, now, 0
		return
	case errors.Is(err, delivery.ErrSaturated):
		d.retryAt = now.Add(viewRetry)
		return
	}
	class, retryAfter := classify(ctx, err)
	switch class {
	case delivery.Canceled:
		return
	case delivery.RateLimit:
		c.blockLocked(ch, retryAfter)
	}
	d.failures++
	d.retryAt = now.Add(viewRetry)
	if class == delivery.Permanent || d.failures >= maxViewFailures {
		switch {
		case errors.Is(err, bot.ErrorNotFound):
			c.noDrafts.Store(true) // the Bot API server has no sendMessageDraft (before 10.3)
		case class == delivery.Permanent:
			ch.noDrafts = true
		}
		c.log.Warn("telegram: drafts failed; showing the turn with edited messages instead", "chat", ch.id, "run", t.runID, "err", c.red.err(err))
		t.dropDraft()
	}
}

// dropDraft turns a draft-mode turn to edit mode: what it shows from now
// on goes in edited messages.
func (t *turnView) dropDraft() {
	d := t.draft
	t.draft = nil
	if t.active && len(t.lines) > 0 {
		t.refreshSteps()
	}
	if t.active && d.status != "" {
		t.notice = t.newView()
		t.notice.want = d.status
	}
}
