package telegram

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf16"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
)

// maxRejectedLogged bounds the set of refused chats remembered for "log
// once"; past it, refused chats are no longer logged one by one.
const maxRejectedLogged = 10000

// dispatch routes an update to its chat's incoming queue. It never blocks
// (it runs on the library's update loop or a webhook request): updates of
// one chat are handled in arrival order by one goroutine at a time, those
// of different chats in parallel.
// A tap on a draft's Stop button (stopped_message_generation, which the
// library does not know) was read from the getUpdates answer by
// peekUpdates and comes here as an update with nothing the library knows.
func (c *Channel) dispatch(u *models.Update) { _ = c.dispatchDone(u, c.takeStop(u.ID), nil) }

// errNotQueued: dispatchDone could not take an update in (the channel is
// closing, or the chat's inbox is full).
var errNotQueued = errors.New("telegram: update not taken in (closing, or the chat's inbox is full)")

// updateInput is what an update says to the channel: the message it is
// about (a message, an edit, or the message under a tapped button), or
// ok false for updates that are not for this bot (channel posts,
// reactions, …). stop, if not nil, is the update's
// stopped_message_generation (stopOf): a tap on a draft's Stop button.
func updateInput(u *models.Update, stop *stoppedGeneration) (in inMsg, ok bool) {
	switch {
	case stop != nil:
		in.msg, in.stop = &models.Message{Chat: stop.Chat}, stop
	case u.Message != nil:
		in.msg = u.Message
	case u.EditedMessage != nil:
		in.msg, in.edited = u.EditedMessage, true
	case u.CallbackQuery != nil && callbackMessage(u.CallbackQuery) != nil:
		in.msg, in.cb = callbackMessage(u.CallbackQuery), u.CallbackQuery // a button under one of our messages
	default:
		return inMsg{}, false
	}
	return in, true
}

// dispatchDone is dispatch that, when done is not nil, reports on done
// (capacity 1) once the update has been handled (nil), or that it will not
// be (ErrClosed). It returns errNotQueued, and reports nothing, when the
// update was not taken in; an update ignored on purpose (not for this bot,
// a chat outside the allow-list) returns nil and reports nil at once. stop
// is the update's stopped_message_generation, nil when it has none.
func (c *Channel) dispatchDone(u *models.Update, stop *stoppedGeneration, done chan error) error {
	ignored := func() error {
		if done != nil {
			done <- nil
		}
		return nil
	}
	in, ok := updateInput(u, stop)
	if !ok {
		return ignored()
	}
	in.done = done
	m := in.msg
	id := m.Chat.ID
	tg := c.cfg.Current().Channels.Telegram
	if len(tg.AllowedChatIDs) > 0 && !slices.Contains(tg.AllowedChatIDs, id) {
		c.rejectChat(id)
		return ignored()
	}
	if m.Chat.Type == models.ChatTypeChannel || (m.From != nil && m.From.IsBot && in.cb == nil) {
		return ignored()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return errNotQueued
	}
	ch := c.chatLocked(id)
	ch.setGroup(m.Chat.Type == models.ChatTypeGroup || m.Chat.Type == models.ChatTypeSupergroup)
	if len(ch.inbox) >= inboxLimit {
		if !ch.dropping {
			ch.dropping = true
			c.log.Warn("telegram: chat sends faster than it is handled; dropping its updates", "chat", id)
		}
		return errNotQueued
	}
	ch.dropping = false
	ch.inbox = append(ch.inbox, in)
	if !ch.inRunning {
		ch.inRunning = true
		c.wg.Add(1)
		go c.runIn(ch)
	}
	return nil
}

// rejectChat logs, once per chat, an update from a chat outside the
// allow-list. The chat gets no answer at all.
func (c *Channel) rejectChat(id int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch n := len(c.rejected); {
	case c.rejected[id]:
	case n < maxRejectedLogged:
		c.rejected[id] = true
		c.log.Warn("telegram: ignoring a chat that is not in channels.telegram.allowedChatIDs", "chat", id)
	case n == maxRejectedLogged:
		c.rejected[0] = true
		c.log.Warn("telegram: many chats outside allowedChatIDs; no longer logging each")
	}
}

// runIn handles a chat's incoming queue in order, then exits.
func (c *Channel) runIn(ch *chat) {
	defer c.wg.Done()
	for {
		c.mu.Lock()
		if len(ch.inbox) == 0 || c.closed {
			for _, in := range ch.inbox {
				if in.done != nil {
					in.done <- ErrClosed
				}
			}
			ch.inbox = nil
			ch.inRunning = false
			c.releaseLocked(ch)
			c.mu.Unlock()
			return
		}
		in := ch.inbox[0]
		ch.inbox[0] = inMsg{}
		ch.inbox = ch.inbox[1:]
		c.mu.Unlock()
		c.handle(c.baseCtx, ch, in)
		if in.done != nil {
			in.done <- nil
		}
	}
}

// reply queues a plain-text answer.
func (c *Channel) reply(ch *chat, text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.enqueueLocked(ch, &outItem{kind: itemReply, text: text})
}

// handle acts on one incoming message.
func (c *Channel) handle(ctx context.Context, ch *chat, in inMsg) {
	if in.stop != nil {
		c.handleStopTap(ctx, ch, in.stop)
		return
	}
	if in.cb != nil {
		switch {
		case strings.HasPrefix(in.cb.Data, approvalPrefix):
			c.handleApproval(ctx, ch, in.cb)
		case strings.HasPrefix(in.cb.Data, cancelPrefix):
			c.handleCancel(ctx, ch, in.cb)
		default:
			c.handleRetry(ctx, ch, in.cb)
		}
		return
	}
	m := in.msg
	me := c.me.Load()
	if me == nil {
		me = &identity{}
	}
	tg := c.cfg.Current().Channels.Telegram
	private := m.Chat.Type == models.ChatTypePrivate || m.Chat.Type == ""
	if in.edited {
		if private {
			c.reply(ch, textEdited)
		}
		return
	}
	text := m.Text
	if text == "" {
		if private && !isService(m) {
			c.reply(ch, textNotText)
		}
		return
	}
	if !private && !in.retry { // a Retry is addressed by its button
		var ok bool
		if text, ok = addressed(m, *me); !ok {
			return
		}
	}
	owner := ""
	if !private && m.From != nil {
		owner = senderRef(m.From.ID) // kept with the turn: its Retry button is bound to it
	}
	runID := in.runID
	if runID == "" {
		runID = fmt.Sprintf("%s%d-%d", config.TelegramRunIDPrefix, ch.id, m.ID) // a redelivered update is the same run
	}
	if m.From != nil {
		c.mu.Lock()
		c.recent.sent(runID, ch.id, m.From.ID) // before the turn starts: its sender, for Retry
		c.mu.Unlock()
	}
	cfg := c.cfg.Current()
	ans := conv.Handle(ctx, c.eng, cfg, conv.Inbound{
		SessionKey: ch.key, Channel: config.ChannelTelegram, ChatRef: ch.ref, Sender: owner, Text: text,
		ID: runID, Bot: me.username, MaxChars: tg.MaxInputChars, Progress: helpProgress(cfg),
	})
	switch {
	case in.retry && (ans.Err != nil || ans.Command != conv.None):
		c.mu.Lock()
		c.recent.forget(runID) // it did not start: a later tap may try again
		c.mu.Unlock()
		c.releaseRetry(ch, heldToken{in.token, runID})
	case (ans.Command == conv.Stop || ans.Command == conv.New) && ans.Err == nil:
		c.queueDropped(ch)
	}
	var unavail *gateway.UnavailableError
	switch {
	case ans.Ignored:
		return
	case ans.Err == nil:
		if ans.Command == conv.None && ans.Ack.Status != gateway.StatusStarted {
			c.log.Debug("telegram: message not started at once", "chat", ch.id, "message", m.ID, "status", ans.Ack.Status)
		}
	case errors.As(ans.Err, &unavail):
		c.log.Warn("telegram: new turn refused: the gateway cannot take turns now", "chat", ch.id, "err", c.red.err(ans.Err))
	case ans.Failed:
		c.log.Error("telegram: could not carry out a message", "chat", ch.id, "command", ans.Command, "err", c.red.err(ans.Err))
	}
	if (ans.Err == nil && (ans.Command == conv.Stop || ans.Command == conv.New)) || len(ans.Ack.Dropped) > 0 {
		c.sweepCancels(ch) // what was dropped no longer waits: its Cancel button goes
	}
	switch {
	case ans.Text != "" && ans.Err == nil && ans.Command == conv.None && ans.Ack.Status == gateway.StatusQueued:
		c.replyQueued(ch, ans.Text, runID) // its own run id: a collected message's Ack names its turn's
	case ans.Text != "":
		c.reply(ch, ans.Text)
	}
}

// queueDropped notes that a stop dropped the chat's queue: the Retry
// buttons held by queued retries are given back.
func (c *Channel) queueDropped(ch *chat) {
	c.mu.Lock()
	held := c.recent.dropQueued(ch.id) // the queue is gone: its retries are no longer running
	c.mu.Unlock()
	for _, h := range held {
		c.releaseRetry(ch, h)
	}
}

// isService reports whether m is a service message (members joining, a
// title change, a pin, …) rather than something a person sent.
func isService(m *models.Message) bool {
	return len(m.NewChatMembers) > 0 || m.LeftChatMember != nil || m.NewChatTitle != "" ||
		len(m.NewChatPhoto) > 0 || m.DeleteChatPhoto || m.GroupChatCreated || m.SupergroupChatCreated ||
		m.PinnedMessage != nil || m.MigrateToChatID != 0 || m.MigrateFromChatID != 0
}

// ourCommands are the commands that, sent bare in a group, are taken as
// addressed to this bot.
var ourCommands = []string{"stop", "status", "new", "help", "start", "mode", "queue"}

// addressed reports whether a group message is meant for the bot — it
// mentions the bot, replies to one of the bot's messages, or is one of the
// bot's commands (bare or /cmd@bot) — and returns its text without the
// mention.
func addressed(m *models.Message, me identity) (string, bool) {
	text := m.Text
	ok := m.ReplyToMessage != nil && m.ReplyToMessage.From != nil && me.id != 0 && m.ReplyToMessage.From.ID == me.id
	type span struct{ from, to int }
	var cut []span
	for _, e := range m.Entities {
		from, to, valid := byteRange(text, e.Offset, e.Length)
		if !valid {
			continue
		}
		s := text[from:to]
		switch e.Type {
		case models.MessageEntityTypeMention:
			if me.username != "" && strings.EqualFold(s, "@"+me.username) {
				ok = true
				cut = append(cut, span{from, to})
			}
		case models.MessageEntityTypeTextMention:
			if e.User != nil && me.id != 0 && e.User.ID == me.id {
				ok = true
			}
		case models.MessageEntityTypeBotCommand:
			if from != 0 {
				continue
			}
			name, at, hasAt := strings.Cut(strings.TrimPrefix(s, "/"), "@")
			if hasAt && me.username != "" && strings.EqualFold(at, me.username) {
				ok = true
			} else if !hasAt && slices.Contains(ourCommands, strings.ToLower(name)) {
				ok = true
			}
		}
	}
	if !ok {
		return "", false
	}
	for i := len(cut) - 1; i >= 0; i-- {
		text = text[:cut[i].from] + text[cut[i].to:]
	}
	return strings.TrimSpace(text), true
}

// byteRange converts an entity's UTF-16 offset and length to byte offsets
// in s.
func byteRange(s string, off, length int) (from, to int, ok bool) {
	if off < 0 || length <= 0 {
		return 0, 0, false
	}
	from, to = -1, -1
	u := 0
	for i, r := range s {
		if u == off {
			from = i
		}
		if u == off+length {
			to = i
			break
		}
		u += utf16.RuneLen(r)
	}
	if to < 0 && u == off+length {
		to = len(s)
	}
	return from, to, from >= 0 && to > from
}
