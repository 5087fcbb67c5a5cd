package telegram

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
)

// Cancel buttons (issue 23): the "📥 Queued" answer to a message that waits
// behind the running turn carries a Cancel button (callback data
// "qc:<run id>", the message's own run id). A tap cancels that message
// through Engine.CancelQueued for the session of the chat the tap came
// from — so a button of another chat cancels nothing — on behalf of the
// person who tapped (in a group only the message's sender may). A
// cancelled message leaves the queue and the store and never runs; its
// answer is edited into "🗑️ Cancelled …", which removes the button. The
// button is removed too when its message starts (TurnStarted, its run id
// or joined into it), and after a /stop, /new or busy.overflow drop-old
// when it no longer waits. A tap after that (a button the gateway lost
// track of) changes nothing but the button, which is removed, and says so.
// A running turn is never stopped by it (that is /stop's).

const cancelPrefix = "qc:"

// cancelData is the callback data of the Cancel button of queued run
// runID; "" when it would not fit Telegram's 64 bytes.
func cancelData(runID string) string {
	if runID == "" || len(cancelPrefix)+len(runID) > 64 {
		return ""
	}
	return cancelPrefix + runID
}

// maxCancelButtons bounds the Cancel buttons a chat keeps track of (the
// oldest is forgotten: a tap on it still says it no longer waits).
const maxCancelButtons = 128

// cancelButton is a Cancel button shown under message msgID for runID.
type cancelButton struct {
	runID string
	msgID int
}

// trackCancelLocked remembers the Cancel button of runID under msgID.
// Called with c.mu held.
func (ch *chat) trackCancelLocked(runID string, msgID int) {
	if len(ch.cancels) >= maxCancelButtons {
		ch.cancels = slices.Delete(ch.cancels, 0, 1)
	}
	ch.cancels = append(ch.cancels, cancelButton{runID: runID, msgID: msgID})
}

// untrackCancelLocked forgets the Cancel buttons for which gone is true and
// returns their messages. Called with c.mu held.
func (ch *chat) untrackCancelLocked(gone func(runID string) bool) []int {
	var msgs []int
	ch.cancels = slices.DeleteFunc(ch.cancels, func(b cancelButton) bool {
		if gone(b.runID) {
			msgs = append(msgs, b.msgID)
			return true
		}
		return false
	})
	return msgs
}

// dropCancelsLocked queues the removal of the Cancel buttons for which
// gone is true. Called with c.mu held.
func (c *Channel) dropCancelsLocked(ch *chat, gone func(runID string) bool) {
	for _, id := range ch.untrackCancelLocked(gone) {
		c.enqueueLocked(ch, &outItem{kind: itemDropButtons, msgID: id})
	}
}

// sweepCancels removes the Cancel buttons of ch's messages that no longer
// wait in the engine's queue (after a /stop, a /new, a drop-old).
func (c *Channel) sweepCancels(ch *chat) {
	waiting := map[string]bool{}
	for _, m := range c.eng.Status(ch.key).Queue {
		waiting[m.RunID] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropCancelsLocked(ch, func(id string) bool { return !waiting[id] })
}

// deliverQueued sends a queued answer with its Cancel button (without it
// when its message has started meanwhile) and keeps track of the button.
func (c *Channel) deliverQueued(ctx context.Context, ch *chat, it *outItem) {
	runID := strings.TrimPrefix(it.cancelData, cancelPrefix)
	c.mu.Lock()
	run, ok := c.recent.get(runID)
	c.mu.Unlock()
	markup := cancelMarkup(it)
	if ok && run.started {
		markup = nil
	}
	id, err := c.sendChunk(ctx, ch, strings.ToValidUTF8(it.text, "\uFFFD"), false, markup)
	if err == nil && markup != nil {
		c.mu.Lock()
		ch.trackCancelLocked(runID, id)
		c.mu.Unlock()
	}
	c.record(ctx, ch, it, err) // a failure is logged, as for any answer
	c.itemDone(it, err)
}

// replyQueued answers a queued message with text and its Cancel button.
func (c *Channel) replyQueued(ch *chat, text, runID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.enqueueLocked(ch, &outItem{kind: itemReply, text: text, cancelData: cancelData(runID)})
}

// cancelMarkup is the keyboard of a queued answer's Cancel button; nil
// for any other item.
func cancelMarkup(it *outItem) models.ReplyMarkup {
	if it.kind != itemReply || it.cancelData == "" {
		return nil
	}
	return &inlineKeyboard{InlineKeyboard: [][]inlineButton{{{Text: messages.QueueCancelLabel, CallbackData: it.cancelData}}}}
}

// handleCancel answers a tap on a Cancel button.
func (c *Channel) handleCancel(ctx context.Context, ch *chat, cb *models.CallbackQuery) {
	runID := strings.TrimPrefix(cb.Data, cancelPrefix)
	requester := ""
	m := callbackMessage(cb)
	if m != nil && m.Chat.Type != "" && m.Chat.Type != models.ChatTypePrivate {
		requester = senderRef(cb.From.ID) // a group's queued messages are their senders'
	}
	res, err := c.eng.CancelQueued(ctx, ch.key, runID, requester, false)
	switch {
	case errors.Is(err, gateway.ErrNotOwner):
		c.answerCallback(ctx, ch, cb, messages.QueueCancelNotOwner)
		return
	case errors.Is(err, gateway.ErrWrongSession):
		c.answerCallback(ctx, ch, cb, messages.RetryElsewhere)
		return
	case err != nil:
		c.log.Warn("telegram: cancelling a queued message failed", "chat", ch.id, "run", runID, "err", c.red.err(err))
		c.answerCallback(ctx, ch, cb, messages.QueueCancelFailed)
		return
	}
	text := messages.QueueNotWaiting
	if res.Dequeued {
		text = messages.QueueCancelled(res.Text)
	}
	c.answerCallback(ctx, ch, cb, text)
	if m == nil {
		return
	}
	c.mu.Lock()
	ch.untrackCancelLocked(func(id string) bool { return id == runID })
	if res.Dequeued {
		c.enqueueLocked(ch, &outItem{kind: itemEditReply, msgID: m.ID, text: text})
	} else {
		c.enqueueLocked(ch, &outItem{kind: itemDropButtons, msgID: m.ID})
	}
	c.mu.Unlock()
}

// editReply edits a queued answer (message msgID) into it.text, which
// removes its Cancel button.
func (c *Channel) editReply(ctx context.Context, ch *chat, it *outItem) {
	err := chatPolicy.Do(ctx, chatPace{c, ch}, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		return asDelivery(c.api.edit(cctx, ch.id, it.msgID, it.text))
	}, c.onRetry(ch))
	if err != nil && !notModified(err) && !editGone(err) && ctx.Err() == nil {
		c.log.Warn("telegram: could not edit a cancelled message's answer", "chat", ch.id, "message", it.msgID, "err", c.red.err(err))
	}
	c.itemDone(it, nil)
}
