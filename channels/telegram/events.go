package telegram

import (
	"strconv"
	"strings"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
)

// emptyReply is sent when a turn finished without any reply text.
const emptyReply = "✅ Done (the assistant sent no text)."

// onEvent is the bus handler. It never blocks: it updates the chat's state
// under the lock and pokes the chat's outgoing worker.
func (c *Channel) onEvent(ev event.Event) {
	if ev.Channel != config.ChannelTelegram || ev.Kind == event.Delta {
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
	ch := c.chatLocked(chatID)
	t := ch.turn(ev.RunID)
	now := time.Now()
	switch ev.Kind {
	case event.TurnStarted:
		t.active, t.typingDue = true, now
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
	case event.Finished, event.Aborted:
		t.end(ev)
		c.enqueueEnding(ch, ev)
	}
	c.kickLocked(ch)
}

// enqueueEnding queues what a user reads when a turn ends: the reply; or
// the partial reply (if any) and the notice (timeout, stop, shutdown,
// error).
func (c *Channel) enqueueEnding(ch *chat, ev event.Event) {
	if ev.Kind == event.Finished && ev.StopReason == event.ReasonStop {
		text := ev.FullText
		if strings.TrimSpace(text) == "" {
			text = emptyReply
		}
		c.enqueueLocked(ch, &outItem{kind: itemFinal, runID: ev.RunID, text: text})
		return
	}
	if strings.TrimSpace(ev.FullText) != "" {
		c.enqueueLocked(ch, &outItem{kind: itemFinal, runID: ev.RunID, text: ev.FullText})
	}
	msg := ev.Message
	if strings.TrimSpace(msg) == "" {
		msg = fallbackNotice(ev.StopReason)
	}
	c.enqueueLocked(ch, &outItem{kind: itemNotice, runID: ev.RunID, text: msg})
}

// fallbackNotice is used if an ending event carries no rendered message.
func fallbackNotice(r event.StopReason) string {
	switch {
	case r.IsTimeout():
		return "⚠️ This request hit a time limit and was stopped."
	case r == event.ReasonShutdown:
		return "⚠️ The gateway is shutting down, so your request was stopped. Please send it again in a minute."
	case r == event.ReasonUser:
		return "⏹️ Stopped."
	}
	return "⚠️ Something went wrong with this request."
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
