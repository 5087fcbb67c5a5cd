package main

import (
	"context"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/nats-io/nats.go"

	"github.com/turnguard/turnguard/channels/telegram"
	"github.com/turnguard/turnguard/cluster/busauth"
	"github.com/turnguard/turnguard/cluster/pgcoord"
	"github.com/turnguard/turnguard/cluster/tgupdates"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway/server"
	"github.com/turnguard/turnguard/ops/alerts"
	"github.com/turnguard/turnguard/store"
)

// telegramShutdownWait bounds the delivery of the replies and notices still
// queued for Telegram at shutdown; what is left stays in the outbox.
const telegramShutdownWait = 10 * time.Second

// tgChannel is the running Telegram channel (nil when disabled).
type tgChannel struct {
	ch   *telegram.Channel
	stop context.CancelFunc // ends Run: no more updates
	done chan struct{}      // closed when Run returned
}

// tgCluster is what the Telegram channel needs of the cluster when
// cluster.enabled: cluster/node's *Node.
type tgCluster interface {
	// Conn is the replica's NATS connection: the update stream.
	Conn() *nats.Conn
	// Lead runs fn while this replica holds the lease name (the poller's).
	Lead(ctx context.Context, name string, ttl time.Duration, fn func(ctx context.Context)) error
	// Coordinator claims outbox rows for this replica; its ID names the
	// replica to the update consumers. It changes when a fenced replica
	// joins again (a new epoch).
	Coordinator() *pgcoord.Replica
	// Key signs the updates this replica stores and verifies those it
	// consumes (cluster.secret).
	Key() *busauth.Key
}

// coordClaims claims outbox rows through the replica's current
// coordinator: the one it had at start is fenced for good once the replica
// lost its lease and joined again.
type coordClaims struct{ cl tgCluster }

func (c coordClaims) ClaimOutbox(ctx context.Context, channel string, limit int, hold time.Duration) ([]store.OutboxMessage, error) {
	return c.cl.Coordinator().ClaimOutbox(ctx, channel, limit, hold)
}

// HoldOutbox asks the current coordinator: a row claimed under an epoch
// that was fenced is not held by the new one, and is not sent.
func (c coordClaims) HoldOutbox(ctx context.Context, id int64, hold time.Duration) error {
	return c.cl.Coordinator().HoldOutbox(ctx, id, hold)
}

func (c coordClaims) ReleaseOutbox(ctx context.Context, ids ...int64) error {
	return c.cl.Coordinator().ReleaseOutbox(ctx, ids...)
}

// newTelegram builds the Telegram channel (newTelegramIn), as a cluster
// replica when the gateway joined a cluster (a.node).
func newTelegram(a *app) (*tgChannel, error) {
	var cl tgCluster
	if a.node != nil {
		cl = a.node
	}
	return newTelegramIn(a, cl)
}

// newTelegramIn builds the Telegram channel when channels.telegram.enabled:
// it follows the engine's events from now on, but takes no update before
// receive. Its replies and notices go through the store's outbox. With cl
// (cluster.enabled; pass an untyped nil otherwise) it is one replica of
// several: updates go through the NATS update stream, one replica polls
// (the lease lasts cluster.leaseSeconds), and outbox rows are claimed with
// cl's coordinator (telegram.Cluster). Wire the coordinator's outbox
// callback (pgcoord Options.OnOutbox, node Options.OnOutbox) to the
// channel's Claim as the store's is (app.tgClaim), so a survivor's
// interrupted notices go out at once; otherwise the channel's own claim
// every couple of seconds finds them.
func newTelegramIn(a *app, cl tgCluster) (*tgChannel, error) {
	cfg := a.cfg.Current()
	if !cfg.Channels.Telegram.Enabled {
		return nil, nil
	}
	ch, err := telegram.New(a.eng, a.cfg, telegram.Options{
		Log:            a.log,
		Outbox:         a.ops.telegramOutbox(a.store),
		HTTPClient:     a.ops.telegramHTTPClient(telegram.DefaultPollTimeout + 15*time.Second),
		DurableEndings: true, // the store writes them (outboxChannels)
		Sync:           a.store.Flush,
		Runs:           a.store, // Retry of a notice sent before a restart
		Cluster:        telegramCluster(cfg, cl),
	})
	if err != nil {
		return nil, err
	}
	a.tgClaim.Store(ch)
	t := &tgChannel{ch: ch, stop: func() {}, done: make(chan struct{})}
	close(t.done) // not receiving yet
	return t, nil
}

// telegramCluster is the channel's cluster options from the replica's
// cluster and configuration; nil without a cluster. The update stream and
// its members bucket keep 3 copies when cluster.nats.urls lists three
// servers or more (as cluster/node's streams do), else 1. A replica that
// vanishes loses its update partitions and its poller lease within
// cluster.leaseSeconds (at least 2 s: the consumer's floor).
func telegramCluster(cfg *config.Config, cl tgCluster) *telegram.Cluster {
	if cl == nil {
		return nil
	}
	ttl := time.Duration(cfg.Cluster.LeaseSeconds * float64(time.Second))
	if ttl <= 0 {
		ttl = 3 * time.Second
	}
	replicas := 1
	if len(cfg.Cluster.NATS.URLs) >= 3 {
		replicas = 3
	}
	return &telegram.Cluster{
		Conn:      cl.Conn(),
		ReplicaID: cl.Coordinator().ID(), // the same in every epoch
		Leader:    cl,
		PollerTTL: ttl,
		Claims:    coordClaims{cl},
		Updates:   tgupdates.Config{Replicas: replicas, Sign: cl.Key().Sign, Verify: cl.Key().VerifyStored},
		Consumer:  tgupdates.ConsumerOptions{MemberTTL: max(ttl, 2*time.Second), PinnedTTL: max(ttl, 2*time.Second)},
	}
}

// receive starts receiving updates (polling, or the webhook mounted by
// mount). Call it once.
func (t *tgChannel) receive(ctx context.Context, a *app) {
	if t == nil {
		return
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	t.stop, t.done = stop, make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		if err := t.ch.Run(rctx); err != nil {
			a.log.Error("the Telegram channel could not start; the other channels keep running", "error", err)
		}
	}(t.done)
}

// outboxChannels are the channels whose turn endings the store writes to
// the outbox with the turn's end (store.Options.OutboxChannels): Telegram
// when enabled. WebSocket clients read the history instead. Enabling
// Telegram needs a restart, so this is read once.
func outboxChannels(cfg *config.Config) []string {
	if cfg.Channels.Telegram.Enabled {
		return []string{config.ChannelTelegram}
	}
	return nil
}

// telegramTookOver tells the Telegram channel about turns this replica
// took over from a dead one (call it from node Options.OnTakeover): it
// sends their interrupted notices at once, instead of first leaving them
// two claim periods to their dead owner. Safe before the channel exists.
func (a *app) telegramTookOver(tk pgcoord.Takeover) {
	ch := a.tgClaim.Load()
	if ch == nil {
		return
	}
	var runs []string
	for _, turn := range tk.Turns {
		if turn.Channel == config.ChannelTelegram && turn.Outboxed {
			runs = append(runs, turn.RunID)
		}
	}
	ch.Adopt(runs...)
}

// sender is the alerts' Telegram sender: nil (untyped) when disabled.
func (t *tgChannel) sender() alerts.TelegramSender {
	if t == nil {
		return nil
	}
	return t.ch
}

// mount adds POST /telegram/webhook (it answers 404 in polling mode).
func (t *tgChannel) mount(r chi.Router) {
	if t != nil {
		r.Method(http.MethodPost, server.TelegramWebhookPath, t.ch.WebhookHandler())
	}
}

// stopReceiving ends polling (or webhook acceptance) and waits for Run.
func (t *tgChannel) stopReceiving() {
	if t == nil {
		return
	}
	t.stop()
	<-t.done
}

// close delivers what is still queued (bounded) and stops the channel.
// Call it after the engine's shutdown (which queues the shutdown notices)
// and before the store closes.
func (t *tgChannel) close(a *app) {
	if t == nil {
		return
	}
	t.stopReceiving()
	ctx, cancel := context.WithTimeout(context.Background(), telegramShutdownWait)
	defer cancel()
	if err := t.ch.Close(ctx); err != nil {
		a.log.Warn("telegram: shutdown", "error", err)
	}
}
