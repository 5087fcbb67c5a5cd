// The channel's side of the outbox: claiming its pending terminal messages
// into the chats' queues (Claim, claimLoop, claim; the periodic resend
// sweep, resendLoop), recording a delivery or a failure (markDelivered,
// markFailed), and keySet, the bounded set of outbox keys the claim checks.
// What the channel may take in a cluster is in cluster.go; the delivery
// itself in outbound.go.

package telegram

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/turnguard/turnguard/channels/delivery"
	"github.com/turnguard/turnguard/store"
)

// resendLoop sends the outbox's pending messages now and every
// resendInterval (those whose delivery failed for a reason that may pass).
func (c *Channel) resendLoop(ctx context.Context) {
	if c.outbox == nil {
		return
	}
	for {
		c.resendPending(ctx)
		if delivery.Sleep(ctx, resendInterval) != nil {
			return
		}
	}
}

// Claim tells the channel that the store has put terminal messages into the
// outbox (store.Options.OnOutbox): it takes them into the chats' queues
// soon, on its own goroutine. It never blocks.
func (c *Channel) Claim() {
	select {
	case c.claimWake <- struct{}{}:
	default:
	}
}

// claimLoop claims the outbox's pending messages each time Claim is
// called, until Close.
func (c *Channel) claimLoop() {
	defer c.wg.Done()
	for {
		var tick <-chan time.Time
		var t *time.Timer
		if c.claims != nil {
			// Rows other replicas wrote, or whose holder died, are
			// claimed at this pace; an ending a chat waits for is tried
			// again sooner (another replica's claim may have held its
			// row for a moment).
			wait := c.cl.ClaimEvery
			if c.hasAwaiting() {
				wait = min(wait, claimRetry)
			}
			t = time.NewTimer(wait)
			tick = t.C
		}
		select {
		case <-c.claimWake:
		case <-tick:
		case <-c.baseCtx.Done():
		}
		if t != nil {
			t.Stop()
		}
		if c.baseCtx.Err() != nil {
			return
		}
		c.claim(c.baseCtx, false)
	}
}

func (c *Channel) resendPending(ctx context.Context) { c.claim(ctx, true) }

// claim queues the outbox's pending messages that are not queued or being
// delivered already. It holds claimMu for writing from its Pending read to
// its queueing, and a delivery's inflight key is removed, once its outcome
// is recorded, under claimMu for reading, so a message delivered meanwhile
// is never queued a second time: either the read sees it delivered, or the
// key is still inflight when the claim checks it. resend (the start-up and
// periodic sweeps) takes every pending message; otherwise (a new ending
// was written) only those never tried, so a failing message is retried at
// the sweep's pace, not at every turn's end.
func (c *Channel) claim(ctx context.Context, resend bool) {
	c.claimMu.Lock()
	defer c.claimMu.Unlock()
	msgs, err := c.claimRows(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Error("telegram: reading the outbox failed", "err", c.red.err(err))
		}
		return
	}
	var giveBack []int64 // claimed rows this replica does not send now (cluster)
	defer func() { c.release(giveBack) }()
	if c.claims != nil {
		c.mu.Lock()
		c.forgetSeenLocked()
		c.mu.Unlock()
	}
	for _, m := range msgs {
		if !resend && m.Attempts > 0 {
			c.mu.Lock()
			if !c.inflight[m.RunID+"/"+string(m.Kind)] {
				giveBack = append(giveBack, m.ID)
			}
			c.mu.Unlock()
			continue // its delivery failed before: the periodic sweep resends it, not every new ending
		}
		chatID, perr := strconv.ParseInt(m.ChatRef, 10, 64)
		switch {
		case perr != nil:
			c.markFailed(m.ID, "chat reference is not a Telegram chat id")
			c.log.Error("telegram: outbox message has no valid chat id; giving up", "chatRef", m.ChatRef, "run", m.RunID)
			continue
		case m.Attempts >= maxOutboxTries:
			c.markFailed(m.ID, fmt.Sprintf("gave up after %d attempts", m.Attempts))
			c.log.Error("telegram: outbox message not delivered; giving up", "chat", chatID, "run", m.RunID, "attempts", m.Attempts, "lastError", m.LastError)
			continue
		}
		kind := itemNotice
		if m.Kind == store.OutboxFinal {
			kind = itemFinal
		}
		it := &outItem{kind: kind, runID: m.RunID, text: m.Text, outboxID: m.ID, partsSent: m.PartsSent}
		c.mu.Lock()
		if w := c.awaiting[it.key()]; w != nil {
			// The ending the chat is holding a place for: it goes now.
			delete(c.awaiting, it.key())
			w.awaiting, w.outboxID, w.text, w.partsSent = false, m.ID, m.Text, m.PartsSent
			if ch := c.chats[chatID]; ch != nil {
				ch.poke()
			}
			c.mu.Unlock()
			continue
		}
		if c.delivered.has(strconv.FormatInt(m.ID, 10)) {
			// Delivered; recording it failed then: it is not sent again.
			c.mu.Unlock()
			c.markDelivered(m.ID)
			continue
		}
		if c.sentMem.remove(it.key()) {
			// Sent from memory while the store could not write: the row
			// came later; it is delivered.
			c.mu.Unlock()
			c.markDelivered(m.ID)
			continue
		}
		if c.claims != nil && !c.inflight[it.key()] && !c.mayTakeLocked(m) {
			giveBack = append(giveBack, m.ID) // its owner's to send first (cluster.go)
			c.mu.Unlock()
			continue
		}
		if c.closing && !c.inflight[it.key()] {
			giveBack = append(giveBack, m.ID)
		}
		if !c.inflight[it.key()] && !c.closing {
			if c.durable {
				// The store may commit a turn's ending (and call Claim)
				// before the channel's own onEvent for it runs: that one
				// must not hold a place for a row already taken here.
				c.claimedEarly.add(it.key())
			}
			c.enqueueClaimedLocked(c.chatLocked(chatID), it)
			if resend || m.Attempts > 0 {
				c.log.Info("telegram: resending a message from the outbox", "chat", chatID, "run", m.RunID, "kind", m.Kind)
			}
		}
		c.mu.Unlock()
	}
}

func (c *Channel) markDelivered(id int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.outbox.MarkDelivered(ctx, id); err != nil {
		c.log.Warn("telegram: outbox update failed", "id", id, "err", c.red.err(err))
	}
}

// keySet is a bounded set of outbox keys, oldest dropped first.
type keySet struct {
	m     map[string]bool
	order []string
}

func (s *keySet) add(k string) {
	if s.m == nil {
		s.m = map[string]bool{}
	}
	if s.m[k] {
		return
	}
	if len(s.order) >= maxSentFromMemory {
		delete(s.m, s.order[0])
		s.order = s.order[1:]
	}
	s.m[k] = true
	s.order = append(s.order, k)
}

// has reports whether k is in the set.
func (s *keySet) has(k string) bool { return s.m[k] }

// remove reports whether k was in the set, and removes it.
func (s *keySet) remove(k string) bool {
	if !s.m[k] {
		return false
	}
	delete(s.m, k)
	return true
}

func (c *Channel) markFailed(id int64, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.outbox.MarkFailed(ctx, id, reason); err != nil {
		c.log.Warn("telegram: outbox update failed", "id", id, "err", c.red.err(err))
	}
}
