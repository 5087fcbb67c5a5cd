package telegram

import (
	"slices"
	"strconv"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
)

// onEvent is the bus handler. It never blocks: it updates the chat's state
// under the lock and pokes the chat's outgoing worker.
func (c *Channel) onEvent(ev event.Event) {
	if ev.Channel != config.ChannelTelegram {
		return
	}
	if ev.Kind == event.Delta {
		c.onDelta(ev)
		return
	}
	chatID, err := strconv.ParseInt(ev.ChatRef, 10, 64)
	if err != nil {
		c.log.Error("telegram: event without a chat id", "run", ev.RunID, "chatRef", ev.ChatRef)
		return
	}
	showSteps := c.cfg.Current().Channels.Telegram.ShowSteps
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		if ev.Kind.Terminal() {
			c.log.Error("telegram: turn ended after the channel closed; its message is not sent", "chat", chatID, "run", ev.RunID, "reason", ev.StopReason)
		}
		return
	}
	if ev.Kind == event.ForceFinalized {
		// The user already got the stop notice; nothing more to show.
		c.log.Warn("telegram: a stopped turn's runner did not end; its session was freed", "chat", chatID, "run", ev.RunID, "reason", ev.StopReason)
		return
	}
	c.recent.note(ev, chatID)
	if c.claims != nil {
		c.ours.add(ev.RunID) // a turn of this replica: its ending's row is taken at once
	}
	ch := c.chatLocked(chatID)
	t := ch.turn(ev.RunID)
	now := time.Now()
	switch ev.Kind {
	case event.TurnStarted:
		t.active, t.typingDue = true, now
		// Its messages no longer wait: their Cancel buttons go.
		c.dropCancelsLocked(ch, func(id string) bool { return id == ev.RunID || slices.Contains(ev.Joined, id) })
		switch c.streamingLocked(ch) {
		case config.TelegramStreamDraft:
			t.draft = &draftView{id: draftIDOf(ev.RunID)}
			t.refreshDraft()
		case config.TelegramStreamOff:
			t.quiet = true
		}
	case event.StepStarted:
		if showSteps && ev.Step.Kind != event.StepLLM {
			t.stepStarted(ev.Step)
		}
	case event.StepCompleted:
		if showSteps && ev.Step.Kind != event.StepLLM {
			t.stepCompleted(ev.Step, ev.Time)
		}
	case event.Paused:
		t.paused = true
	case event.Resumed:
		t.paused, t.typingDue = false, now
	case event.Progress:
		t.progress(ev)
	case event.Recovered:
		t.closeNotice(true, ev.Time)
	case event.BudgetWarning:
		// Once per turn (the scheduler's word), before the stop: a message
		// of its own, not an edit, so the person is notified.
		if ev.Message != "" {
			c.enqueueLocked(ch, &outItem{kind: itemReply, runID: ev.RunID, text: ev.Message})
		}
	case event.ApprovalRequested:
		if ev.Approval != nil {
			c.askLocked(ch, t, ev)
		}
	case event.ApprovalResolved:
		if ev.Approval != nil {
			c.settleLocked(ch, ev.Approval, true)
		}
	case event.Finished, event.Aborted:
		t.end(ev)
		c.endQuestionsLocked(ch, ev.RunID) // their edits go before the ending
		c.enqueueEnding(ch, ev)
		c.syncMenuLocked(ch)
	}
	c.kickLocked(ch)
}

// onDelta shows the reply so far in the running turn's draft (draft
// mode; the other modes show the reply when the turn ends).
func (c *Channel) onDelta(ev event.Event) {
	chatID, err := strconv.ParseInt(ev.ChatRef, 10, 64)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.chats[chatID]
	if ch == nil || c.closed {
		return
	}
	for _, t := range ch.turns {
		if t.runID == ev.RunID && t.active && t.draft != nil {
			t.draft.reply = ev.FullText
			t.refreshDraft()
			c.kickLocked(ch)
			return
		}
	}
}

// enqueueEnding queues what a user reads when a turn ends (messages.Ending):
// the reply; or the partial reply (if any) and the notice (timeout, stop,
// shutdown, error). With durable endings the store has written them to the
// outbox with the turn's end, and they are claimed from there instead.
//
// With durable endings the store writes them to the outbox with the turn's
// end: what is queued here are placeholders (awaiting) that keep the
// chat's order — a later answer or turn does not overtake them — and are
// sent once claim fills in their rows.
func (c *Channel) enqueueEnding(ch *chat, ev event.Event) {
	final, notice := messages.Ending(string(ev.StopReason), ev.FullText, ev.Message)
	for _, it := range []*outItem{{kind: itemFinal, text: final}, {kind: itemNotice, text: notice}} {
		if it.text == "" {
			continue
		}
		it.runID = ev.RunID
		if c.durable && c.claimedEarly.remove(it.key()) {
			continue // claim already queued (or delivered) its outbox row
		}
		if c.durable {
			it.awaiting, it.deadline = true, time.Now().Add(claimWait)
			c.awaiting[it.key()] = it
		}
		c.enqueueLocked(ch, it)
	}
}

// chatLocked returns the chat, creating it. Called with c.mu held.
func (c *Channel) chatLocked(id int64) *chat {
	ch, ok := c.chats[id]
	if !ok {
		ch = newChat(id)
		c.chats[id] = ch
	}
	return ch
}

// enqueueLocked appends an outgoing item. Called with c.mu held.
func (c *Channel) enqueueLocked(ch *chat, it *outItem) {
	ch.queue = append(ch.queue, it)
	c.queued++
	if it.durable() {
		c.inflight[it.key()] = true
	}
	c.kickLocked(ch)
}

// enqueueClaimedLocked queues an outbox row claim took that no placeholder
// waits for: it was recorded before any ending still awaiting its row (the
// store writes in order; a row from before a restart, or one being resent,
// is older still), so it goes before the first such placeholder. Called
// with c.mu held.
func (c *Channel) enqueueClaimedLocked(ch *chat, it *outItem) {
	c.enqueueLocked(ch, it)
	for i, q := range ch.queue {
		if q.awaiting {
			copy(ch.queue[i+1:], ch.queue[i:len(ch.queue)-1])
			ch.queue[i] = it
			return
		}
	}
}

// kickLocked makes sure the chat's outgoing worker runs if it has work.
// Called with c.mu held.
func (c *Channel) kickLocked(ch *chat) {
	if ch.outRunning {
		ch.poke()
		return
	}
	if c.closed || !ch.hasOutWork() {
		return
	}
	ch.outRunning = true
	c.wg.Add(1)
	go c.runOut(ch)
}

// releaseLocked forgets an idle chat. Called with c.mu held.
func (c *Channel) releaseLocked(ch *chat) {
	if ch.idle() && c.chats[ch.id] == ch {
		delete(c.chats, ch.id)
	}
}
