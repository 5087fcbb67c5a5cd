package telegram

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-telegram/bot/models"
	"github.com/nats-io/nats.go"

	"github.com/turnguard/turnguard/channels/delivery"
	"github.com/turnguard/turnguard/cluster/tgupdates"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/store"
)

// The channel as one of several gateway replicas (issue 12,
// Options.Cluster):
//
//   - Receiving. No replica hands a received update to its own chats
//     directly: every update goes into the update stream
//     (cluster/tgupdates), partitioned by chat, and every replica consumes
//     its share of the partitions, one update at a time per partition, so
//     each chat's updates are handled in order on one replica. In polling
//     mode only the replica holding the poller lease (Cluster.Leader)
//     calls getUpdates, and it asks for the next offset only after the
//     stream confirmed every update before it: a poller that dies leaves
//     the unconfirmed updates at Telegram for the next one, and the stream
//     drops the ones it already has (same update id). In webhook mode the
//     handler answers 200 only after the stream confirmed the update, and
//     500 (Telegram sends it again) when it could not.
//   - Handling. A stored update is acknowledged once the chat has handled
//     it (the engine took the message or answered the command); a replica
//     that dies before leaves it to the next replica of its partition.
//     Handling is at least once: the turn's run id comes from the chat and
//     message ids, so the engine starts it once.
//   - The outbox. Rows are taken with Cluster.Claims (SKIP LOCKED: no two
//     replicas hold one row), not read with Outbox.Pending, and recorded
//     with the Outbox's MarkDelivered / MarkAttempt / MarkFailed as on one
//     process. Besides Claim and the start-up and periodic sweeps, a
//     replica claims every ClaimEvery, so rows written by another replica
//     (the interrupted notice a survivor writes for a dead replica's turn)
//     and rows whose holder died (their hold ran out) are sent promptly.
//     The replica whose turn wrote a row sends it: its chat holds the
//     ending's place behind the turn's last progress edit. So a replica
//     takes a row at once only for a turn it saw on its own engine (or one
//     given to it with Adopt); any other row it hands back, and takes it
//     only when it is still unsent two ClaimEvery after it first saw it
//     (longer than its writer's own claims take) — its writer died, or was
//     never going to send it (a takeover's notice).
//   - One sender per chat, in order, and nothing under a lost lease.
//     ClaimOutbox does not hand out a row behind an earlier pending row of
//     its chat that another replica holds, and immediately before sending
//     each part of a claimed row the chat's worker asks Claims.HoldOutbox
//     (mayDeliver):
//     a replica that was fenced, or whose claims a survivor took over,
//     drops the rows it held unsent (the survivor sends them); a row with
//     an earlier row of its chat still pending, whoever holds it, is
//     handed back and claimed again once that one is delivered or failed.
//     A delivery whose recording failed is recorded again until the
//     outbox takes it (delivery.Record), never sent a second time as if
//     it were not.

// PollerLease is the name of the lease under which one replica polls.
const PollerLease = "telegram-poller"

// streamSetupWait bounds one attempt to set the update stream up.
const streamSetupWait = 5 * time.Second

// Leader runs fn while this replica holds the lease name (time to live
// ttl): fn's context ends when the lease is lost, and then the replica
// competes again, until ctx ends (then it returns nil); it returns an
// error when it cannot compete at all. cluster/node's Node implements it.
type Leader interface {
	Lead(ctx context.Context, name string, ttl time.Duration, fn func(ctx context.Context)) error
}

// OutboxClaims hands out outbox rows to one replica at a time.
// *pgcoord.Replica implements it (see its ClaimOutbox, HoldOutbox and
// ReleaseOutbox). HoldOutbox is asked immediately before each send: nil
// only while this replica's lease is live and it still holds the row;
// store.ErrNotHeld (fenced, or its claims taken over: the row is dropped
// here, never sent) or store.ErrBehind (an earlier row of the chat is
// pending: the row is handed back and sent after it).
type OutboxClaims interface {
	ClaimOutbox(ctx context.Context, channel string, limit int, hold time.Duration) ([]store.OutboxMessage, error)
	HoldOutbox(ctx context.Context, id int64, hold time.Duration) error
	ReleaseOutbox(ctx context.Context, ids ...int64) error
}

// Cluster makes the channel one of several replicas (see above). ReplicaID
// is required; Conn for Run; Leader in polling mode; Claims with an Outbox.
type Cluster struct {
	// Conn is this replica's NATS connection (JetStream). The caller owns
	// it.
	Conn *nats.Conn
	// ReplicaID names this replica among the update consumers; letters,
	// digits, '-' and '_' (others are replaced by '_').
	ReplicaID string
	// Leader decides which replica polls (PollerLease).
	Leader Leader
	// PollerTTL is the poller lease's time to live: a poller that dies is
	// replaced within it. Default 10 s.
	PollerTTL time.Duration
	// Claims claims outbox rows for this replica.
	Claims OutboxClaims
	// ClaimHold is how long a claimed row is held before any replica may
	// claim it again (its holder died). Each claim extends the hold of the
	// rows this replica still holds. Default 1 min.
	ClaimHold time.Duration
	// ClaimEvery is how often the replica claims the new rows. Default 1 s:
	// a row no live replica will send (a takeover's notice, unless Adopt was
	// told) goes out within about three of them.
	ClaimEvery time.Duration
	// Updates is the update stream's configuration, shared by every
	// replica (the zero value: tgupdates' defaults).
	Updates tgupdates.Config
	// Consumer tunes the update consumer; its ReplicaID is ReplicaID and
	// its OnError logs unless set.
	Consumer tgupdates.ConsumerOptions
}

func (cl *Cluster) withDefaults() (*Cluster, error) {
	if cl == nil {
		return nil, nil
	}
	c := *cl
	c.ReplicaID = kvKey(c.ReplicaID)
	if c.ReplicaID == "" {
		return nil, errors.New("telegram: cluster: a replica id is required")
	}
	if c.PollerTTL <= 0 {
		c.PollerTTL = 10 * time.Second
	}
	if c.ClaimHold <= 0 {
		c.ClaimHold = time.Minute
	}
	if c.ClaimEvery <= 0 {
		c.ClaimEvery = time.Second
	}
	c.Consumer.ReplicaID = c.ReplicaID
	return &c, nil
}

// kvKey makes id a valid KV key: letters, digits, '-' and '_'.
func kvKey(id string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, id)
}

// runCluster is Run's receiving part on a replica: it opens the update
// stream, consumes this replica's partitions and, in polling mode, polls
// while it holds the poller lease — until ctx ends; then it waits for the
// poll and the updates in hand to finish.
func (c *Channel) runCluster(ctx context.Context) error {
	if c.cl.Conn == nil {
		return errors.New("telegram: cluster: a NATS connection is required")
	}
	var (
		ulog *tgupdates.Log
		cons *tgupdates.Consumer
	)
	opt := c.cl.Consumer
	if opt.OnError == nil {
		opt.OnError = func(err error) {
			c.log.Warn("telegram: update stream", "err", c.red.err(err))
		}
	}
	err := c.retryStartup(ctx, "the update stream", func(cctx context.Context) error {
		var err error
		if ulog == nil {
			// Replicas starting together race to create the stream; the
			// losers' requests may go unanswered (nats-server 2.15): try
			// again soon rather than wait out a long timeout.
			sctx, cancel := context.WithTimeout(cctx, streamSetupWait)
			ulog, err = tgupdates.NewLog(sctx, c.cl.Conn, c.cl.Updates)
			cancel()
			if err != nil {
				return err
			}
		}
		// Consumption lasts as long as Run's ctx, not this attempt's.
		cons, err = tgupdates.Consume(ctx, c.cl.Conn, c.cl.Updates, c.handleStored, opt)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("telegram: the update stream: %w", err)
	}
	c.updates.Store(ulog)
	defer c.updates.Store(nil)
	c.consumer.Store(cons)
	c.ready.Store(true)
	defer c.ready.Store(false)

	var wg sync.WaitGroup
	wg.Go(func() { c.resendLoop(ctx) })
	if c.mode != config.TelegramWebhook {
		if c.cl.Leader == nil {
			c.log.Error("telegram: polling in a cluster needs a leader lease; this replica does not poll")
		} else {
			wg.Go(func() { c.lead(ctx, ulog) })
		}
	}
	<-ctx.Done()
	wg.Wait()
	<-cons.Done()
	return nil
}

// lead competes for the poller lease until ctx ends, polling while this
// replica holds it. Lead fails when it cannot set the lease up (NATS is
// unreachable, or replicas starting together race to create its bucket):
// it is tried again, backing off.
func (c *Channel) lead(ctx context.Context, ulog *tgupdates.Log) {
	backoff := time.Second
	for {
		err := c.cl.Leader.Lead(ctx, PollerLease, c.cl.PollerTTL, func(lctx context.Context) {
			// Lead may outlive ctx by a moment; the poll must not.
			pctx, cancel := context.WithCancel(lctx)
			defer cancel()
			stop := context.AfterFunc(ctx, cancel)
			defer stop()
			c.poll(pctx, ulog)
		})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.log.Warn("telegram: cannot compete for the poller lease; retrying", "in", backoff, "err", c.red.err(err))
		}
		if delivery.Sleep(ctx, backoff) != nil {
			return
		}
		backoff = min(2*backoff, startupMaxWait)
	}
}

// Polling reports whether this replica is polling now (it holds the
// poller lease).
func (c *Channel) Polling() bool { return c.polling.Load() }

// poll calls getUpdates and stores each update in the stream until ctx
// ends. The offset passed to Telegram (which confirms, and so drops, every
// update below it) moves past an update only once the stream has it.
func (c *Channel) poll(ctx context.Context, ulog publisher) {
	c.pollMu.Lock() // one poll loop per replica, even if Lead overlaps its terms
	defer c.pollMu.Unlock()
	c.polling.Store(true)
	defer c.polling.Store(false)
	c.log.Info("telegram: this replica polls for updates (it holds the poller lease)")
	defer c.log.Info("telegram: this replica stopped polling")
	var offset int64 // 0: from the oldest update Telegram has not had confirmed
	var backoff time.Duration
	for ctx.Err() == nil {
		if backoff > 0 && delivery.Sleep(ctx, backoff) != nil {
			return
		}
		raws, err := c.getUpdates(ctx, offset)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			backoff = min(max(2*backoff, 100*time.Millisecond), startupMaxWait)
			var ae *apiError
			if errors.As(err, &ae) && ae.retryAfter > 0 {
				backoff = ae.retryAfter
			}
			c.log.Warn("telegram: getUpdates failed; retrying", "in", backoff, "err", c.red.err(err))
			continue
		}
		backoff = 0
		for _, raw := range raws {
			id, chat, ok, err := updateKey(raw)
			if err != nil {
				c.log.Error("telegram: getUpdates returned an update without an id; polling again", "err", err)
				backoff = time.Second
				break
			}
			if ok {
				if err := ulog.PublishUpdate(ctx, id, chat, raw); err != nil {
					if ctx.Err() == nil {
						backoff = time.Second
						c.log.Warn("telegram: the update stream did not confirm an update; polling it again", "update", id, "chat", chat, "err", err)
					}
					break
				}
			}
			offset = id + 1
		}
	}
}

// publisher stores an update (*tgupdates.Log); nil only once it is
// confirmed stored.
type publisher interface {
	PublishUpdate(ctx context.Context, updateID, chatID int64, raw []byte) error
}

// updateKey reads an update's id and the chat it is about; ok is false for
// updates the channel does not handle (they are confirmed, not stored).
func updateKey(raw []byte) (id, chat int64, ok bool, err error) {
	var u models.Update
	if err := json.Unmarshal(raw, &u); err != nil {
		var bare struct {
			ID *int64 `json:"update_id"`
		}
		if json.Unmarshal(raw, &bare) != nil || bare.ID == nil {
			return 0, 0, false, fmt.Errorf("not an update: %w", err)
		}
		return *bare.ID, 0, false, nil // an update the library cannot read: not for this bot
	}
	in, ok := updateInput(&u, stopOf(raw))
	if !ok {
		return u.ID, 0, false, nil
	}
	return u.ID, in.msg.Chat.ID, true, nil
}

// apiError is a Bot API refusal of getUpdates.
type apiError struct {
	code       int
	desc       string
	retryAfter time.Duration
}

func (e *apiError) Error() string {
	return fmt.Sprintf("getUpdates: %d %s", e.code, e.desc)
}

// getUpdates long-polls Telegram for the updates from offset on and
// returns them as Telegram sent them (the stream stores those bytes). It
// is the bot library's getUpdates, without its advancing the offset before
// the updates are stored.
func (c *Channel) getUpdates(ctx context.Context, offset int64) ([]json.RawMessage, error) {
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	allowed, _ := json.Marshal(allowedUpdates)
	fields := [][2]string{{"timeout", strconv.Itoa(int((c.pollTimeout - time.Second).Seconds()))}, {"allowed_updates", string(allowed)}}
	if offset > 0 {
		fields = append(fields, [2]string{"offset", strconv.FormatInt(offset, 10)})
	}
	for _, f := range fields {
		if err := w.WriteField(f[0], f[1]); err != nil {
			return nil, fmt.Errorf("getUpdates: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("getUpdates: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.apiURL+"/bot"+c.bot.Token()+"/getUpdates", &body)
	if err != nil {
		return nil, fmt.Errorf("getUpdates: %w", c.red.err(err))
	}
	req.Header.Set("Content-Type", w.FormDataContentType())
	resp, err := doer{c: c.hc}.Do(req)
	if err != nil {
		return nil, fmt.Errorf("getUpdates: %w", c.red.err(err))
	}
	defer resp.Body.Close()
	var ans struct {
		OK          bool              `json:"ok"`
		Result      []json.RawMessage `json:"result"`
		ErrorCode   int               `json:"error_code"`
		Description string            `json:"description"`
		Parameters  struct {
			RetryAfter int `json:"retry_after"`
		} `json:"parameters"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
		return nil, fmt.Errorf("getUpdates: HTTP %d, unreadable answer: %w", resp.StatusCode, err)
	}
	if !ans.OK {
		return nil, &apiError{code: ans.ErrorCode, desc: c.red.text(ans.Description), retryAfter: time.Duration(ans.Parameters.RetryAfter) * time.Second}
	}
	return ans.Result, nil
}

// handleStored is the update consumer's handler: the update goes to its
// chat as a polled one would, and the handler returns once the chat has
// handled it, so the stream acknowledges only handled updates.
func (c *Channel) handleStored(ctx context.Context, su tgupdates.Update) error {
	var u models.Update
	if err := json.Unmarshal(su.Raw, &u); err != nil {
		c.log.Error("telegram: a stored update cannot be read; dropping it", "update", su.ID, "chat", su.ChatID, "err", err)
		return nil
	}
	done := make(chan error, 1)
	if err := c.dispatchDone(&u, stopOf(su.Raw), done); err != nil {
		return fmt.Errorf("telegram: update %d of chat %d: %w", su.ID, su.ChatID, err)
	}
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("telegram: update %d of chat %d: %w", su.ID, su.ChatID, err)
		}
		if c.onStoredHandled != nil {
			c.onStoredHandled(su)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("telegram: update %d of chat %d: %w", su.ID, su.ChatID, ctx.Err())
	}
}

// publishUpdate stores a webhook's update in the stream (see
// WebhookHandler); updates the channel does not handle are not stored.
func (c *Channel) publishUpdate(ctx context.Context, ulog *tgupdates.Log, raw []byte) error {
	id, chat, ok, err := updateKey(raw)
	if err != nil || !ok {
		return err
	}
	if err := ulog.PublishUpdate(ctx, id, chat, raw); err != nil {
		return fmt.Errorf("telegram: store webhook update: %w", err)
	}
	return nil
}

// claimRows returns the outbox rows to consider: on one process the
// pending ones, in a cluster those this replica claimed.
func (c *Channel) claimRows(ctx context.Context) ([]store.OutboxMessage, error) {
	if c.claims == nil {
		return c.outbox.Pending(ctx, config.ChannelTelegram, pendingBatch)
	}
	return c.claims.ClaimOutbox(ctx, config.ChannelTelegram, pendingBatch, c.cl.ClaimHold)
}

// release hands claimed rows this replica will not send now back to the
// other replicas (a no-op on one process).
func (c *Channel) release(ids []int64) {
	if c.claims == nil || len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.claims.ReleaseOutbox(ctx, ids...); err != nil {
		c.log.Warn("telegram: handing outbox rows back failed; they are claimable when their hold ends", "rows", len(ids), "err", c.red.err(err))
	}
}

// Adopt makes the outbox rows of runs this replica's to send at once — the
// turns it took over from a dead replica (pgcoord.Takeover): their
// interrupted notices then go out without waiting for the dead owner —
// and claims them. It is a no-op on one process.
func (c *Channel) Adopt(runIDs ...string) {
	if c.claims == nil || len(runIDs) == 0 {
		return
	}
	c.mu.Lock()
	for _, id := range runIDs {
		c.ours.add(id)
	}
	c.mu.Unlock()
	c.Claim()
}

// mayTakeLocked reports whether this replica sends claimed row m now: its
// run is this replica's, or the row has been left unsent for two
// ClaimEvery since this replica first saw it (its writer claims at least
// every ClaimEvery). Called with c.mu held.
func (c *Channel) mayTakeLocked(m store.OutboxMessage) bool {
	if c.ours.has(m.RunID) {
		return true
	}
	first, seen := c.seenRows[m.ID]
	if !seen {
		if c.seenRows == nil {
			c.seenRows = map[int64]time.Time{}
		}
		c.seenRows[m.ID] = time.Now()
		return false
	}
	if time.Since(first) < 2*c.cl.ClaimEvery {
		return false
	}
	delete(c.seenRows, m.ID)
	return true
}

// forgetSeenLocked drops the first sightings older than a hold and two
// claim periods: such a row was sent or taken by another replica since (a
// row still pending then is seen anew). Called with c.mu held.
func (c *Channel) forgetSeenLocked() {
	for id, first := range c.seenRows {
		if time.Since(first) > c.cl.ClaimHold+2*c.cl.ClaimEvery {
			delete(c.seenRows, id)
		}
	}
}

// hasAwaiting reports whether a chat holds a place for an ending whose
// outbox row this replica has not claimed yet.
func (c *Channel) hasAwaiting() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.awaiting) > 0
}

// mayDeliver asks, immediately before sending claimed outbox row it — each
// of its parts (cluster) — whether this replica may send it now
// (Claims.HoldOutbox);
// when not, the row is dropped from this replica's chat (handed back when
// it waits for an earlier row) and false is returned. On one process, and
// for items with no row, it is true.
func (c *Channel) mayDeliver(ctx context.Context, ch *chat, it *outItem) bool {
	if c.claims == nil || it.outboxID == 0 {
		return true
	}
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	err := c.claims.HoldOutbox(hctx, it.outboxID, c.cl.ClaimHold)
	cancel()
	switch {
	case err == nil:
		return true
	case errors.Is(err, store.ErrBehind):
		c.log.Debug("telegram: an earlier message of the chat is pending; this one goes after it", "chat", ch.id, "run", it.runID)
		c.release([]int64{it.outboxID})
	case errors.Is(err, store.ErrNotHeld):
		c.log.Warn("telegram: an outbox message is no longer this replica's to send; not sending it", "chat", ch.id, "run", it.runID, "err", c.red.err(err))
	default:
		// Not known to be ours: not sent now; the row stays claimed
		// and is taken again by a later claim.
		c.log.Warn("telegram: cannot confirm an outbox message is this replica's to send; trying again later", "chat", ch.id, "run", it.runID, "err", c.red.err(err))
	}
	return false
}
