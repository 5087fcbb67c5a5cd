package telegram

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/go-telegram/bot"
	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/channels/delivery"
	"github.com/turnguard/turnguard/store"
)

// The outgoing worker of a chat. One runs per chat while the chat has
// something to send or a turn to show; it exits when idle. It sends, in
// order of priority:
//
//  1. queued items — replies and terminal messages, oldest first, never
//     dropped (retried, then recorded as failed);
//  2. views — the step lines and the "still working" notice. Only the
//     latest wanted text is sent, at most once per chat interval, so a burst
//     of changes becomes one edit; an edit that cannot get a slot of the
//     shared limiter soon is skipped and retried later with the then-latest
//     text;
//  3. the typing action, every typingEvery while a turn runs (and at once
//     after a message, which clears it on the user's screen).

type actKind uint8

const (
	actWait actKind = iota
	actItem
	actView
	actTyping
	actDraft
	actExit
)

type action struct {
	kind actKind
	wait time.Duration // actWait: how long (0 = until poked)
	item *outItem
	turn *turnView
	view *view
}

func (c *Channel) runOut(ch *chat) {
	defer c.wg.Done()
	ctx := c.baseCtx
	for {
		c.mu.Lock()
		act := c.nextLocked(ch, time.Now())
		if act.kind == actExit {
			ch.outRunning = false
			c.releaseLocked(ch)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		switch act.kind {
		case actWait:
			c.waitWake(ctx, ch, act.wait)
		case actItem:
			c.deliver(ctx, ch, act.item)
		case actView:
			c.updateView(ctx, ch, act.turn, act.view)
		case actTyping:
			c.sendTyping(ctx, ch, act.turn)
		case actDraft:
			c.updateDraft(ctx, ch, act.turn)
		}
	}
}

func (c *Channel) waitWake(ctx context.Context, ch *chat, d time.Duration) {
	var timer <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ch.wake:
	case <-timer:
	case <-ctx.Done():
	}
}

// nextLocked decides the worker's next step. Called with c.mu held.
func (c *Channel) nextLocked(ch *chat, now time.Time) action {
	if c.baseCtx.Err() != nil {
		return action{kind: actExit} // Close gave up waiting: what is queued is shelved
	}
	if b := ch.pace.Blocked(); now.Before(b) {
		return action{kind: actWait, wait: b.Sub(now)}
	}
	ready := ch.pace.ReadyAt()
	paced := !now.Before(ready)
	// A turn's live view gets its closing edit before the turn's reply or
	// notice goes: the chat reads in order.
	if len(ch.queue) > 0 && ch.queue[0].awaiting {
		// A durable ending waits for its outbox row (claim pokes the
		// worker), holding its place: nothing else goes to the chat first.
		it := ch.queue[0]
		if !c.closing && now.Before(it.deadline) {
			return action{kind: actWait, wait: it.deadline.Sub(now)}
		}
		it.awaiting, it.fromMemory = false, true // not written in time: sent from memory (deliver)
		delete(c.awaiting, it.key())
		c.log.Warn("telegram: the store has not recorded a turn's ending in time; sending it from memory", "chat", ch.id, "run", it.runID)
	}
	if len(ch.queue) > 0 && (c.closing || !ch.viewPending(ch.queue[0].runID)) {
		if !paced {
			return action{kind: actWait, wait: ready.Sub(now)}
		}
		it := ch.queue[0]
		ch.queue[0] = nil
		ch.queue = ch.queue[1:]
		return action{kind: actItem, item: it}
	}

	var soon time.Time
	consider := func(t time.Time) {
		if soon.IsZero() || t.Before(soon) {
			soon = t
		}
	}
	if !c.closing {
		for _, t := range ch.turns {
			if d := t.draft; d != nil && t.active {
				switch at, ok := d.due(); {
				case !ok:
				case now.Before(at):
					consider(at)
				case !paced:
					consider(ready)
				default:
					ch.pace.Take(now)
					return action{kind: actDraft, turn: t}
				}
			}
			for _, v := range t.views {
				switch {
				case !v.dirty(t.active):
				case now.Before(v.retryAt):
					consider(v.retryAt)
				case !paced:
					consider(ready)
				default:
					ch.pace.Take(now)
					return action{kind: actView, turn: t, view: v}
				}
			}
		}
		if t := ch.activeTurn(); t != nil && !t.paused && t.asking == 0 && (t.draft == nil || t.draft.stopped) {
			if !now.Before(t.typingDue) {
				t.typingDue = now.Add(typingEvery)
				return action{kind: actTyping, turn: t}
			}
			consider(t.typingDue)
		}
	}
	// Forget ended turns with nothing left to edit.
	kept := ch.turns[:0]
	for _, t := range ch.turns {
		if t.active || (!c.closing && t.pending()) {
			kept = append(kept, t)
		}
	}
	clear(ch.turns[len(kept):])
	ch.turns = kept

	switch {
	case !soon.IsZero():
		return action{kind: actWait, wait: soon.Sub(now)}
	case ch.activeTurn() != nil && !c.closing:
		return action{kind: actWait} // paused: until something changes
	case !paced:
		return action{kind: actWait, wait: ready.Sub(now)} // keep the pacing until it no longer matters
	}
	return action{kind: actExit}
}

// deliver sends a queued item and records the outcome.
func (c *Channel) deliver(ctx context.Context, ch *chat, it *outItem) {
	switch it.kind {
	case itemQuestion:
		c.sendQuestion(ctx, ch, it)
		return
	case itemQuestionEdit:
		c.editQuestion(ctx, ch, it)
		return
	case itemDropButtons:
		c.dropButtons(ctx, ch, it)
		return
	case itemEditReply:
		c.editReply(ctx, ch, it)
		return
	}
	if it.kind == itemReply && it.cancelData != "" && len(it.text) <= MaxMessageLen {
		c.deliverQueued(ctx, ch, it)
		return
	}
	if it.durable() && c.outbox != nil && it.outboxID == 0 {
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		id, err := c.outbox.Enqueue(octx, it.outboxMessage(ch))
		cancel()
		switch {
		case errors.Is(err, store.ErrDuplicate) && it.fromMemory && c.stillPending(ctx, ch, it, id):
			// The store wrote the row after the wait ran out; claim left
			// it to this item (its key was inflight): deliver it here.
			it.outboxID = id
		case errors.Is(err, store.ErrDuplicate):
			// Already in the outbox: whoever put it there delivers it.
			c.log.Debug("telegram: message already in the outbox", "chat", ch.id, "run", it.runID)
			c.itemDone(it, nil)
			return
		case err != nil:
			c.log.Warn("telegram: outbox enqueue failed; sending anyway", "chat", ch.id, "run", it.runID, "err", c.red.err(err))
		default:
			it.outboxID = id
		}
	}
	mayGo := func() bool { return c.mayDeliver(ctx, ch, it) }
	markup := c.retryMarkup(ctx, ch, it)
	if m := cancelMarkup(it); m != nil {
		markup = m
	}
	err := c.sendText(ctx, ch, it.text, it.html(), markup, it.partsSent, mayGo, func(n int) { c.partSent(ch, it, n) })
	if errors.Is(err, errNotOurs) {
		c.itemDone(it, nil) // the row is another replica's now, or later
		return
	}
	if err == nil && c.durable && it.durable() && it.outboxID == 0 {
		c.mu.Lock()
		c.sentMem.add(it.key()) // the store's late row is marked delivered by claim
		c.mu.Unlock()
	}
	// Recorded before its inflight key goes (itemDone, under claimMu: see
	// claim), but not under claimMu: recording a delivery may take long
	// (record), and claims and Close must not wait for it.
	c.record(ctx, ch, it, err)
	c.claimMu.RLock()
	defer c.claimMu.RUnlock()
	c.itemDone(it, err)
}

// stillPending reports whether outbox message id is neither delivered nor
// failed (an error reads as pending: a repeat beats a loss).
func (c *Channel) stillPending(ctx context.Context, ch *chat, it *outItem, id int64) bool {
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	pending, err := c.outbox.IsPending(octx, id)
	if err != nil {
		c.log.Warn("telegram: cannot read an outbox message's state; sending it", "chat", ch.id, "run", it.runID, "err", c.red.err(err))
		return true
	}
	return pending
}

// partSent records that the first n parts of a split item reached the
// chat, so a resend goes on from the next one.
func (c *Channel) partSent(ch *chat, it *outItem, n int) {
	it.partsSent = n
	if it.outboxID == 0 {
		return
	}
	octx, cancel := context.WithTimeout(context.WithoutCancel(c.baseCtx), 5*time.Second)
	defer cancel()
	if err := c.outbox.MarkPartsSent(octx, it.outboxID, n); err != nil {
		c.log.Warn("telegram: outbox update failed", "chat", ch.id, "run", it.runID, "err", c.red.err(err))
	}
}

// errNotOurs stops the sending of an outbox row this replica may no
// longer send (mayDeliver): what is left of it is not sent here.
var errNotOurs = errors.New("telegram: the outbox message is not this replica's to send")

// itemDone accounts for a finished item.
func (c *Channel) itemDone(it *outItem, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queued--
	if it.durable() {
		delete(c.inflight, it.key())
	}
	if c.queued == 0 && c.drained != nil {
		close(c.drained)
		c.drained = nil
	}
	if it.done != nil {
		it.done <- c.red.err(err)
	}
}

// record writes the outcome of a delivery to the outbox (delivery.Record)
// and the log.
func (c *Channel) record(ctx context.Context, ch *chat, it *outItem, err error) {
	rerr := c.red.err(err)
	class, _ := classify(ctx, err)
	switch {
	case class == delivery.OK:
	case class == delivery.Canceled && it.outboxID != 0:
		c.log.Warn("telegram: message not delivered before shutdown; it will be sent at the next start", "chat", ch.id, "run", it.runID)
	case class == delivery.Canceled:
		c.log.Warn("telegram: message dropped at shutdown", "chat", ch.id, "run", it.runID)
	default:
		c.log.Error("telegram: message not delivered", "chat", ch.id, "run", it.runID, "kind", it.kind.String(), "err", rerr)
	}
	if it.outboxID == 0 {
		return
	}
	// A failure that may pass leaves it pending: resent by the next sweep.
	// A delivery is recorded until the outbox takes it or Close begins
	// (markCtx); if it never does, the claims mark the row instead of
	// sending it again (delivered).
	rctx := ctx
	if class == delivery.OK {
		rctx = c.markCtx
	}
	if _, merr := delivery.Record(rctx, c.outbox, it.outboxID, asDelivery(rerr)); merr != nil {
		c.log.Warn("telegram: outbox update failed", "chat", ch.id, "run", it.runID, "err", c.red.err(merr))
		if class == delivery.OK {
			c.mu.Lock()
			c.delivered.add(strconv.FormatInt(it.outboxID, 10))
			c.mu.Unlock()
		}
	}
}

func (k itemKind) String() string {
	switch k {
	case itemFinal:
		return "final"
	case itemNotice:
		return "notice"
	case itemQuestion:
		return "question"
	case itemQuestionEdit, itemDropButtons, itemEditReply:
		return "question edit"
	}
	return "reply"
}

// sendText sends text as one or more messages: a reply rendered as HTML
// (split with code blocks repaired), anything else as plain text.
// markup, if not nil, goes with the last message. The first skip parts
// are not sent (they reached the chat before); may is asked immediately
// before each part is sent (mayDeliver): false stops the sending with
// errNotOurs; sent, if not nil, is told after each part but the last how
// many have reached the chat.
func (c *Channel) sendText(ctx context.Context, ch *chat, text string, html bool, markup models.ReplyMarkup, skip int, may func() bool, sent func(n int)) error {
	text = strings.ToValidUTF8(text, "\uFFFD") // Telegram refuses invalid UTF-8
	var chunks []string
	if html {
		chunks = splitReply(text)
	} else {
		chunks = splitText(text, MaxMessageLen)
	}
	for i, chunk := range chunks {
		if i < skip && i < len(chunks)-1 {
			continue
		}
		var m models.ReplyMarkup
		if i == len(chunks)-1 {
			m = markup
		}
		if !may() {
			return errNotOurs
		}
		if _, err := c.sendChunk(ctx, ch, chunk, html, m); err != nil {
			return err
		}
		if sent != nil && i < len(chunks)-1 {
			sent(i + 1)
		}
	}
	return nil
}

// sendChunk sends one message per the shared delivery policy (chatPolicy):
// waiting for the chat's pacing and the shared limiter, waiting out 429s
// (at most maxRateLimits of them) and retrying 5xx and network errors
// (maxAttempts tries, backing off). If Telegram refuses the HTML, it is
// sent again as plain text. It returns the id of the message sent.
func (c *Channel) sendChunk(ctx context.Context, ch *chat, chunk string, html bool, markup models.ReplyMarkup) (int, error) {
	body := chunk
	if html {
		body = toHTML(chunk)
	}
	var id int
	send := func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		var err error
		id, err = c.api.send(cctx, ch.id, body, html, markup)
		return asDelivery(err)
	}
	onRetry := c.onRetry(ch)
	err := chatPolicy.Do(ctx, chatPace{c, ch}, send, onRetry)
	if err != nil && html && errors.Is(err, bot.ErrorBadRequest) && ctx.Err() == nil {
		c.log.Info("telegram: formatted text refused; sending it as plain text", "chat", ch.id, "err", c.red.err(err))
		body, html = chunk, false
		err = chatPolicy.Do(ctx, chatPace{c, ch}, send, onRetry)
	}
	if err == nil {
		c.sentMessage(ch)
	}
	return id, err
}

// onRetry logs a retried call to a chat (chatPolicy).
func (c *Channel) onRetry(ch *chat) func(delivery.Retry) {
	return func(r delivery.Retry) {
		if r.Class == delivery.RateLimit {
			c.log.Info("telegram: rate limited; waiting", "chat", ch.id, "retryAfter", r.Wait)
		} else {
			c.log.Warn("telegram: send failed; retrying", "chat", ch.id, "in", r.Wait, "err", c.red.err(r.Err))
		}
	}
}

// chatPolicy is how one message to a chat is tried.
var chatPolicy = delivery.Policy{MaxAttempts: maxAttempts, MaxRateLimits: maxRateLimits,
	FirstBackoff: firstBackoff, MaxBackoff: maxBackoff}

// chatPace paces a message to a chat: its spacing and 429 block, then the
// shared limiter (delivery.Pace).
type chatPace struct {
	c  *Channel
	ch *chat
}

func (p chatPace) Wait(ctx context.Context) error {
	if err := p.c.waitChat(ctx, p.ch); err != nil {
		return err
	}
	if err := p.c.global.Wait(ctx, delivery.Forever); err != nil {
		return err
	}
	p.c.holdChat(p.ch)
	return nil
}

func (p chatPace) Block(d time.Duration) { p.c.block(p.ch, d) }

// waitChat waits until the chat may receive a message (its pacing and any
// 429 block) and takes the slot.
func (c *Channel) waitChat(ctx context.Context, ch *chat) error {
	for {
		c.mu.Lock()
		now := time.Now()
		at := ch.pace.ReadyAt()
		if !now.Before(at) {
			ch.pace.Take(now)
			c.mu.Unlock()
			return nil
		}
		c.mu.Unlock()
		if err := delivery.Sleep(ctx, at.Sub(now)); err != nil {
			return err
		}
	}
}

// holdChat restarts the chat's spacing from now: a message is going.
func (c *Channel) holdChat(ch *chat) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch.pace.Hold(time.Now())
}

// block holds every message to the chat for d (a 429's retry_after).
func (c *Channel) block(ch *chat, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.blockLocked(ch, d)
}

func (c *Channel) blockLocked(ch *chat, d time.Duration) {
	ch.pace.Block(time.Now(), d)
}

// sentMessage notes that a new message reached the chat: Telegram clears
// the typing indicator then, so it is sent again at once.
func (c *Channel) sentMessage(ch *chat) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := ch.activeTurn(); t != nil {
		t.typingDue = time.Now()
	}
}

// liveCall makes a call that shows a running turn (a view, a draft): it
// waits for the shared limiter at most progressMaxWait (else
// delivery.ErrSaturated: the caller tries later with the then-latest
// text), restarts the chat's spacing and calls fn within callTimeout. The
// chat's pacing slot was taken by nextLocked.
func (c *Channel) liveCall(ctx context.Context, ch *chat, fn func(context.Context) error) error {
	if err := c.global.Wait(ctx, progressMaxWait); err != nil {
		return err
	}
	c.holdChat(ch)
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return fn(cctx)
}

// updateView sends or edits a view with its latest wanted text. The chat's
// pacing slot was taken by nextLocked.
func (c *Channel) updateView(ctx context.Context, ch *chat, t *turnView, v *view) {
	c.mu.Lock()
	text, id := v.want, v.msgID
	c.mu.Unlock()

	err := c.liveCall(ctx, ch, func(ctx context.Context) error {
		if id != 0 {
			return c.api.edit(ctx, ch.id, id, text)
		}
		newID, err := c.api.send(ctx, ch.id, text, false, nil)
		if err == nil {
			c.mu.Lock()
			v.msgID = newID
			c.mu.Unlock()
		}
		return err
	})

	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	switch {
	case err == nil:
		v.sent, v.failures = text, 0
		if id == 0 && t.active {
			t.typingDue = now
		}
	case notModified(err):
		v.sent = text
	case editGone(err):
		v.msgID, v.sent = 0, "" // sent anew while the turn runs, else dropped
	case errors.Is(err, delivery.ErrSaturated):
		v.retryAt = now.Add(viewRetry) // under pressure: skip; the latest text goes later
	default:
		class, retryAfter := classify(ctx, err)
		if class == delivery.Canceled {
			return
		}
		if class == delivery.RateLimit {
			c.blockLocked(ch, retryAfter)
		}
		v.failures++
		v.retryAt = now.Add(viewRetry)
		if class == delivery.Permanent || v.failures >= maxViewFailures {
			v.gone = true
			c.log.Warn("telegram: giving up on a progress message", "chat", ch.id, "run", t.runID, "err", c.red.err(err))
		}
	}
}

// sendTyping sends the typing action. It is skipped when the shared
// limiter is busy, and retried a second later after an error.
func (c *Channel) sendTyping(ctx context.Context, ch *chat, t *turnView) {
	err := c.global.Wait(ctx, typingMaxWait)
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		err = c.api.typing(cctx, ch.id)
		cancel()
	}
	if err == nil {
		return
	}
	class, retryAfter := classify(ctx, err)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case class == delivery.Canceled:
	case class == delivery.RateLimit:
		c.blockLocked(ch, retryAfter)
	case t.active && !errors.Is(err, delivery.ErrSaturated):
		t.typingDue = time.Now().Add(time.Second)
		c.log.Debug("telegram: typing action failed", "chat", ch.id, "err", c.red.err(err))
	case t.active:
		t.typingDue = time.Now().Add(typingMaxWait)
	}
}
