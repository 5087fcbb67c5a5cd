package telegram

import (
	"context"
	"errors"
	"strings"

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
)

// reasonSuperseded is the stop reason of a turn replaced by a newer message
// (busy mode "interrupt"); event.ReasonSuperseded once the busy modes land.
const reasonSuperseded event.StopReason = "superseded"

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
	case r.IsTimeout(), r == event.ReasonInterrupted, r == event.ReasonShutdown, r == event.ReasonError, r == reasonSuperseded:
		return true
	}
	return false
}

// recentRun is what Retry needs of a run the channel saw.
type recentRun struct {
	chatID int64
	text   string           // the person's message
	reason event.StopReason // how it ended; "" while running
}

// recentRuns remembers the last maxRecentRuns runs. Guarded by Channel.mu.
type recentRuns struct {
	runs  map[string]*recentRun
	order []string // oldest first
}

// note records a run's start (its text) and its ending (its reason).
func (r *recentRuns) note(ev event.Event, chatID int64) {
	switch ev.Kind {
	case event.TurnStarted:
		if r.runs == nil {
			r.runs = map[string]*recentRun{}
		}
		if _, ok := r.runs[ev.RunID]; !ok {
			if len(r.order) >= maxRecentRuns {
				delete(r.runs, r.order[0])
				r.order = r.order[1:]
			}
			r.order = append(r.order, ev.RunID)
		}
		r.runs[ev.RunID] = &recentRun{chatID: chatID, text: ev.Text}
	case event.Finished, event.Aborted:
		if run, ok := r.runs[ev.RunID]; ok {
			run.reason = ev.StopReason
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
	return &models.InlineKeyboardMarkup{InlineKeyboard: [][]models.InlineKeyboardButton{{
		{Text: retryLabel, CallbackData: retryPrefix + it.runID},
	}}}
}

// handleRetry answers a tapped button and, for a Retry of a turn of this
// chat, sends the turn's original message again.
func (c *Channel) handleRetry(ctx context.Context, ch *chat, cb *models.CallbackQuery) {
	runID, ok := strings.CutPrefix(cb.Data, retryPrefix)
	if !ok || runID == "" {
		c.answerCallback(ctx, ch, cb, "")
		return
	}
	text, answer := c.retryText(ctx, ch, runID)
	c.answerCallback(ctx, ch, cb, answer)
	if text == "" {
		return
	}
	m := cb.Message.Message
	// The retried message is the button's message's id in this chat: a
	// second tap (or a redelivered update) is the same turn, not another.
	c.handle(ctx, ch, inMsg{retry: true, msg: &models.Message{ID: m.ID, Chat: m.Chat, From: &cb.From, Date: m.Date, Text: text}})
}

// retryText finds run's original message, if run belongs to ch: in memory,
// else in the store. answer is what the tap is answered with.
func (c *Channel) retryText(ctx context.Context, ch *chat, runID string) (text, answer string) {
	c.mu.Lock()
	run, ok := c.recent.get(runID)
	c.mu.Unlock()
	switch {
	case ok && run.chatID != ch.id:
		return "", textRetryElsewere
	case ok && strings.TrimSpace(run.text) != "":
		return run.text, textRetrying
	case c.runs == nil:
		return "", textRetryTooOld
	}
	t, err := c.runs.Turn(ctx, runID)
	if err == nil && (t.Channel != config.ChannelTelegram || t.ChatRef != ch.ref) {
		return "", textRetryElsewere
	}
	if err == nil {
		text, err = c.runs.UserText(ctx, runID)
	}
	if err != nil || strings.TrimSpace(text) == "" {
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			c.log.Warn("telegram: cannot look up a message to retry", "chat", ch.id, "run", runID, "err", c.red.err(err))
		}
		return "", textRetryTooOld
	}
	return text, textRetrying
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
