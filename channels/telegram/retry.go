package telegram

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// Retry: the notice of a turn that was interrupted (a restart, a
// shutdown), hit a time limit, was superseded or failed carries a one-tap
// "🔁 Retry" inline button (callback data "retry:<run id>"). Tapping it in
// the chat the turn belonged to sends that turn's original message again,
// as a new turn, exactly as if the person had typed it again (commands,
// busy handling and all). The tap is always answered (answerCallbackQuery),
// so the button stops spinning.

const (
	retryPrefix = "retry:"
	retryLabel  = "🔁 Retry"
	// maxCallbackData is Telegram's limit on callback_data, in bytes.
	maxCallbackData = 64
	// maxRecentRuns bounds the runs remembered for Retry; older ones are
	// looked up in the store (Options.Runs).
	maxRecentRuns = 1000

	textRetrying      = "🔁 Sending it again…"
	textRetryTooOld   = "⚠️ I no longer have that request — please send it again."
	textRetryElsewere = "⚠️ That button belongs to another chat."
	textRetryRunning  = "🔁 That request is already running again."
	textRetryNotOwner = "Only the person who sent that request can retry it."
)

// Runs looks up a past turn: its recorded state and the message its user
// sent. *store.SQLite implements it.
type Runs interface {
	Turn(ctx context.Context, runID string) (store.Turn, error)
	UserText(ctx context.Context, runID string) (string, error)
}

// retryable reports whether a turn that ended for r offers Retry: it did
// not end as the person wanted (a limit, a restart, a shutdown, a newer
// message, a failure) — not a reply and not their own /stop.
func retryable(r event.StopReason) bool {
	switch {
	case r.IsTimeout(), r == event.ReasonInterrupted, r == event.ReasonShutdown, r == event.ReasonError, r == event.ReasonSuperseded:
		return true
	}
	return false
}

// recentRun is what Retry needs of a run the channel saw.
type recentRun struct {
	chatID  int64
	sender  int64            // the Telegram user who sent the message (0: unknown)
	text    string           // the person's message
	reason  event.StopReason // how it ended; "" while running (or queued)
	started bool
	ended   bool
}

// recentRuns remembers the running and the retryable ones of the last
// maxRecentRuns runs, and the last run each Retry button started.
// Guarded by Channel.mu.
type recentRuns struct {
	runs  map[string]*recentRun
	order []string // oldest first

	retries    map[string]string // Retry button (chat/message) → the run its last tap started
	retryOrder []string          // oldest first
	taps       uint64            // Retry taps that started a run, ever: each gets its own run id
}

// add returns runID's entry, creating it (the oldest is forgotten when
// maxRecentRuns are kept).
func (r *recentRuns) add(runID string, chatID int64) *recentRun {
	if r.runs == nil {
		r.runs = map[string]*recentRun{}
	}
	if run, ok := r.runs[runID]; ok {
		return run
	}
	if len(r.order) >= maxRecentRuns {
		delete(r.runs, r.order[0])
		r.order = r.order[1:]
	}
	r.order = append(r.order, runID)
	run := &recentRun{chatID: chatID}
	r.runs[runID] = run
	return run
}

// sent records who sent the message of run runID, before it starts.
func (r *recentRuns) sent(runID string, chatID, sender int64) {
	r.add(runID, chatID).sender = sender
}

// forget drops runID (a Retry that did not start a turn).
func (r *recentRuns) forget(runID string) {
	if run, ok := r.runs[runID]; ok && !run.ended {
		delete(r.runs, runID)
	}
}

// dropQueued forgets the runs of chat chatID that never started: a /stop
// or /new dropped the session's queue (no event says so), so a Retry whose
// message was queued may be tapped again.
func (r *recentRuns) dropQueued(chatID int64) {
	for id, run := range r.runs {
		if run.chatID == chatID && !run.started {
			delete(r.runs, id)
		}
	}
}

// retryRunning reports whether the last run started by the Retry button
// key is queued or running.
func (r *recentRuns) retryRunning(key string) bool {
	runID, ok := r.retries[key]
	if !ok {
		return false
	}
	run, ok := r.runs[runID]
	return ok && !run.ended
}

// newRetry returns a fresh run id for a tap of the Retry button key under
// message msgID of chat chatID, and remembers it as the button's last.
func (r *recentRuns) newRetry(key string, chatID int64, msgID int) string {
	r.taps++
	// The time keeps it unique across restarts, the count within one.
	runID := fmt.Sprintf("tg-%d-%d-r%s.%s", chatID, msgID, strconv.FormatInt(time.Now().UnixNano(), 36), strconv.FormatUint(r.taps, 36))
	if r.retries == nil {
		r.retries = map[string]string{}
	}
	if _, ok := r.retries[key]; !ok {
		if len(r.retryOrder) >= maxRecentRuns {
			delete(r.retries, r.retryOrder[0])
			r.retryOrder = r.retryOrder[1:]
		}
		r.retryOrder = append(r.retryOrder, key)
	}
	r.retries[key] = runID
	return runID
}

// note records a run's start (its text) and its ending (its reason).
func (r *recentRuns) note(ev event.Event, chatID int64) {
	switch ev.Kind {
	case event.TurnStarted:
		run := r.add(ev.RunID, chatID)
		run.chatID, run.text, run.reason, run.started, run.ended = chatID, ev.Text, "", true, false
	case event.Finished, event.Aborted:
		run, ok := r.runs[ev.RunID]
		switch {
		case !ok:
		case retryable(ev.StopReason):
			run.reason, run.ended = ev.StopReason, true
		default:
			delete(r.runs, ev.RunID) // no Retry to offer: forget its text (its order entry ages out)
		}
	}
}

func (r *recentRuns) get(runID string) (recentRun, bool) {
	if run, ok := r.runs[runID]; ok {
		return *run, true
	}
	return recentRun{}, false
}

// retryMarkup is the Retry button for a notice item of a retryable turn,
// or nil.
func (c *Channel) retryMarkup(ctx context.Context, ch *chat, it *outItem) models.ReplyMarkup {
	if it.kind != itemNotice || it.runID == "" || len(retryPrefix)+len(it.runID) > maxCallbackData {
		return nil
	}
	c.mu.Lock()
	run, ok := c.recent.get(it.runID)
	c.mu.Unlock()
	reason := run.reason
	if !ok && c.runs != nil {
		t, err := c.runs.Turn(ctx, it.runID)
		if err != nil {
			if !errors.Is(err, store.ErrNotFound) {
				c.log.Warn("telegram: cannot look up a turn for its Retry button", "chat", ch.id, "run", it.runID, "err", c.red.err(err))
			}
			return nil
		}
		reason = t.StopReason
	}
	if !retryable(reason) {
		return nil
	}
	return &inlineKeyboard{InlineKeyboard: [][]inlineButton{{
		{Text: retryLabel, CallbackData: retryPrefix + it.runID},
	}}}
}

// callbackMessage is the message a tapped button is under, or nil for a
// button not under a chat message (inline mode). Telegram sends only the
// chat and the id of a message too old for it to show in full.
func callbackMessage(cb *models.CallbackQuery) *models.Message {
	switch m := cb.Message; {
	case m.Message != nil:
		return m.Message
	case m.InaccessibleMessage != nil:
		return &models.Message{ID: m.InaccessibleMessage.MessageID, Chat: m.InaccessibleMessage.Chat}
	}
	return nil
}

// handleRetry answers a tapped button and, for a Retry of a turn of this
// chat, sends the turn's original message again.
func (c *Channel) handleRetry(ctx context.Context, ch *chat, cb *models.CallbackQuery) {
	runID, ok := strings.CutPrefix(cb.Data, retryPrefix)
	if !ok || runID == "" {
		c.answerCallback(ctx, ch, cb, "")
		return
	}
	text, sender, answer := c.retryText(ctx, ch, runID)
	m := callbackMessage(cb)
	if text == "" || m == nil {
		c.answerCallback(ctx, ch, cb, answer)
		return
	}
	group := m.Chat.Type != "" && m.Chat.Type != models.ChatTypePrivate
	if group && sender != 0 && sender != cb.From.ID {
		// Telegram has no operators: only the sender's own tap runs it
		// again, as theirs (they can stop it).
		c.answerCallback(ctx, ch, cb, textRetryNotOwner)
		return
	}
	// Each tap is a turn of its own (its own run id, so its ending is
	// recorded and delivered even after the first one's); a tap while the
	// button's last retry is still queued or running starts nothing.
	key := strconv.FormatInt(ch.id, 10) + "/" + strconv.Itoa(m.ID)
	c.mu.Lock()
	running := c.recent.retryRunning(key)
	var newID string
	if !running {
		newID = c.recent.newRetry(key, ch.id, m.ID)
	}
	c.mu.Unlock()
	if running {
		c.answerCallback(ctx, ch, cb, textRetryRunning)
		return
	}
	c.answerCallback(ctx, ch, cb, answer)
	from := cb.From
	if group && sender != 0 {
		from = models.User{ID: sender}
	}
	c.handle(ctx, ch, inMsg{retry: true, runID: newID, msg: &models.Message{ID: m.ID, Chat: m.Chat, From: &from, Date: m.Date, Text: text}})
}

// retryText finds run's original message, if run belongs to ch: in memory,
// else in the store. answer is what the tap is answered with.
// sender is the Telegram user who sent it, 0 if unknown (the store does not
// keep it).
func (c *Channel) retryText(ctx context.Context, ch *chat, runID string) (text string, sender int64, answer string) {
	c.mu.Lock()
	run, ok := c.recent.get(runID)
	c.mu.Unlock()
	switch {
	case ok && run.chatID != ch.id:
		return "", 0, textRetryElsewere
	case ok && strings.TrimSpace(run.text) != "":
		return run.text, run.sender, textRetrying
	case c.runs == nil:
		return "", 0, textRetryTooOld
	}
	t, err := c.runs.Turn(ctx, runID)
	if err == nil && (t.Channel != config.ChannelTelegram || t.ChatRef != ch.ref) {
		return "", 0, textRetryElsewere
	}
	if err == nil {
		text, err = c.runs.UserText(ctx, runID)
	}
	if err != nil || strings.TrimSpace(text) == "" {
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			c.log.Warn("telegram: cannot look up a message to retry", "chat", ch.id, "run", runID, "err", c.red.err(err))
		}
		return "", 0, textRetryTooOld
	}
	return text, 0, textRetrying
}

// answerCallback answers a tapped button (the button stops spinning; text,
// if any, shows briefly).
func (c *Channel) answerCallback(ctx context.Context, ch *chat, cb *models.CallbackQuery, text string) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := c.api.answerCallback(cctx, cb.ID, text); err != nil {
		c.log.Warn("telegram: answering a button tap failed", "chat", ch.id, "err", c.red.err(err))
	}
}
