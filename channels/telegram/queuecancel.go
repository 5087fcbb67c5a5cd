package telegram

import (
	"context"
	"errors"
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
// answer is edited into "🗑️ Cancelled …", which removes the button. A tap
// after the message started (or was dropped) changes nothing but the
// button, which is removed, and says so. A running turn is never stopped
// by it (that is /stop's).

const cancelPrefix = "qc:"

// cancelData is the callback data of the Cancel button of queued run
// runID; "" when it would not fit Telegram's 64 bytes.
func cancelData(runID string) string {
	if runID == "" || len(cancelPrefix)+len(runID) > 64 {
		return ""
	}
	return cancelPrefix + runID
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
