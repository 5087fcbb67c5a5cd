// Package telegram owns the Telegram bot channel of the gateway: receiving
// updates (long polling, or a webhook mounted on the gateway's router),
// turning each chat's messages into engine turns in order (one chat is one
// session), and turning the engine's events into Telegram messages — the
// typing indicator, one line per tool step, the "⏳ Still working" notice
// edited in place, final replies split and escaped, and the timeout, stop
// and shutdown notices — within Telegram's rate limits (channels/delivery).
// Final replies and notices go through an outbox (see Outbox) so that none
// is dropped silently: with Options.DurableEndings the store writes them
// there in the transaction that ends the turn and the channel claims them.
// Notices of turns that did not end as the person wanted carry a Retry
// button (retry.go); commands /stop, /status, /new and /help are handled
// here.
//
// Lifecycle: New (no network), then Run (start-up calls, then polling or
// waiting for webhook updates until its context ends), and at shutdown,
// after the engine's Shutdown has published the shutdown notices, Close,
// which delivers what is queued before it returns. docs/telegram.md
// describes the behaviour a user sees.
//
// With Options.Cluster the channel is one of several gateway replicas
// (cluster.go): updates go through a NATS stream partitioned by chat, one
// replica polls under a lease, and outbox rows are claimed per replica.
package telegram

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-telegram/bot"
	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/channels/delivery"
	"github.com/turnguard/turnguard/cluster/tgupdates"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/store"
)

// Timing and limits. They follow Telegram's documented limits: about one
// message per second in a chat (twenty per minute in a group), thirty per
// second for the whole bot, and a typing indicator that shows for about five
// seconds.
const (
	typingEvery      = 4 * time.Second // a typing action is repeated this often while a turn runs
	privateInterval  = time.Second     // least spacing of messages and edits in a private chat
	groupInterval    = 3 * time.Second // … in a group (20 per minute)
	globalPerSecond  = 30              // Bot API calls per second to chats, all chats together
	callTimeout      = 20 * time.Second
	maxAttempts      = 5 // tries of one message on 5xx and network errors
	maxRateLimits    = 8 // 429 answers tolerated for one message before it counts as failed
	firstBackoff     = 500 * time.Millisecond
	maxBackoff       = 8 * time.Second
	progressMaxWait  = 2 * time.Second // longest wait for the shared limiter a progress edit accepts
	typingMaxWait    = time.Second     // … a typing action accepts
	viewRetry        = 2 * time.Second // a failed progress edit is retried (with the latest text) after this
	maxViewFailures  = 5
	inboxLimit       = 50 // queued updates per chat; more are dropped (and logged)
	maxOutboxTries   = 10 // delivery attempts of an outbox message across sweeps before giving up
	resendInterval   = 5 * time.Minute
	pendingBatch     = 500
	webhookBodyLimit = 1 << 20
	startupMaxWait   = 30 * time.Second

	// DefaultPollTimeout is how long one getUpdates long poll waits.
	DefaultPollTimeout = 30 * time.Second
)

// Durable endings (Options.DurableEndings).
const (
	// claimWait is how long a turn's ending waits for the store to put it
	// in the outbox before it is sent from memory: the store cannot write,
	// and the user should not wait for the disk.
	claimWait = 10 * time.Second
	// maxSentFromMemory bounds the endings remembered as sent from memory
	// (so that the store's late row is marked delivered, not sent again).
	maxSentFromMemory = 10000
	// claimRetry: in a cluster, how soon a claim is tried again while an
	// ending waits for its row.
	claimRetry = 100 * time.Millisecond
)

// allowedUpdates are the update types asked of Telegram.
var allowedUpdates = []string{"message", "edited_message", "callback_query", "stopped_message_generation"}

// ErrClosed is returned by SendText after Close.
var ErrClosed = errors.New("telegram channel closed")

// Outbox is the durable store of terminal messages (final replies and
// stop/timeout notices). A message is enqueued before it is sent and marked
// delivered after; one whose delivery failed is marked (and, if the failure
// may pass, resent later); at start-up the pending ones are sent again.
// *store.SQLite implements it.
type Outbox interface {
	Enqueue(ctx context.Context, m store.OutboxMessage) (int64, error)
	MarkDelivered(ctx context.Context, id int64) error
	MarkAttempt(ctx context.Context, id int64, err error) error
	MarkFailed(ctx context.Context, id int64, reason string) error
	Pending(ctx context.Context, channel string, limit int) ([]store.OutboxMessage, error)
	// MarkPartsSent records that the first n parts of a split message
	// reached the chat: a resend starts after them.
	MarkPartsSent(ctx context.Context, id int64, n int) error
	// IsPending reports whether a message is neither delivered nor failed.
	IsPending(ctx context.Context, id int64) (bool, error)
}

// Options configure a Channel. All are optional.
type Options struct {
	// Log receives the channel's logs (default slog.Default()). The bot
	// token never appears in them.
	Log *slog.Logger
	// Outbox makes final replies and notices durable. Without it they are
	// sent from memory and a failure is only logged.
	Outbox Outbox
	// HTTPClient makes the Bot API calls. The default has a timeout a little
	// longer than PollTimeout. Tests pass one whose transport is a fake
	// server.
	HTTPClient *http.Client
	// PollTimeout is the long-poll wait of getUpdates (default
	// DefaultPollTimeout; at least 2s).
	PollTimeout time.Duration
	// DurableEndings says that the store writes each Telegram turn's
	// terminal messages (reply, notice) into Outbox in the transaction
	// that records the turn's end (store.Options.OutboxChannels lists
	// "telegram"). The channel then never enqueues them itself: it claims
	// the pending rows when Claim is called (wire it to
	// store.Options.OnOutbox) and at start-up, so a crash at any instant
	// after the turn ended loses none. Requires Outbox.
	DurableEndings bool
	// Runs finds a turn's stop reason, sender and its user's message when
	// the channel no longer remembers them (a Retry button under a notice
	// sent before a restart), and keeps the Retry buttons' tokens (shared
	// by the replicas of a cluster). store.Backend implements it. Without
	// it, tokens are kept in memory (the last maxRecentRuns) and such a
	// Retry answers that the button has expired.
	Runs Runs
	// Sync, with DurableEndings, waits until the endings published so far
	// are in the outbox (store.Flush). Close calls it, so the shutdown
	// notices are delivered before the channel stops (or stay pending for
	// the next start).
	Sync func(ctx context.Context) error
	// Cluster, if set, makes the channel one of several gateway replicas
	// (cluster.go): updates go through a NATS stream, one replica polls,
	// outbox rows are claimed with Cluster.Claims.
	Cluster *Cluster
}

// Channel is the Telegram channel. Create it with New; methods are safe for
// concurrent use.
type Channel struct {
	eng    *gateway.Engine
	cfg    *config.Source
	log    *slog.Logger
	outbox Outbox
	bot    *bot.Bot
	api    api
	red    redactor
	global *delivery.Limiter

	// Read at New: changing them needs a restart (config says so too).
	mode       string
	secret     string
	webhookURL string

	baseCtx   context.Context // the workers' context; cancelled by Close
	cancel    context.CancelFunc
	markCtx   context.Context // recording deliveries keeps trying until it ends: when Close begins
	stopMarks context.CancelFunc
	wg        sync.WaitGroup
	unsub     func()

	running atomic.Bool
	ready   atomic.Bool // start-up calls done: the webhook accepts updates
	me      atomic.Pointer[identity]

	mu       sync.Mutex
	chats    map[int64]*chat
	inflight map[string]bool // outbox keys (run/kind) queued or being delivered
	queued   int             // items queued or being delivered, all chats
	drained  chan struct{}   // closed when queued drops to 0; nil until Close asks
	closing  bool            // Close was called: no new updates, no progress
	closed   bool            // workers are stopping; nothing new starts
	rejected map[int64]bool  // chats refused by allowedChatIDs, logged once each

	secretLogged atomic.Int64 // unix seconds of the last bad-secret log line

	runs         Runs                         // Options.Runs
	tokens       store.RetryTokens            // Retry buttons' tokens: Options.Runs, or kept in memory without it
	recent       recentRuns                   // recent runs' texts and endings, for Retry; guarded by mu
	durable      bool                         // Options.DurableEndings
	sync         func(context.Context) error  // Options.Sync
	claimWake    chan struct{}                // 1-buffered: Claim was called
	awaiting     map[string]*outItem          // durable endings waiting for their outbox row, by key; guarded by mu
	sentMem      keySet                       // durable endings sent from memory before their row came; guarded by mu
	claimedEarly keySet                       // durable endings claim queued before their onEvent came; guarded by mu
	delivered    keySet                       // outbox ids delivered whose recording failed: marked, never resent; guarded by mu
	claimMu      sync.RWMutex                 // a claim (write) vs. recording a delivery (read): see claim
	questions    map[string]*question         // runners' questions shown in chats, by approval id (approvals.go); guarded by mu
	noDrafts     atomic.Bool                  // the Bot API server has no sendMessageDraft: edit mode everywhere (drafts.go)
	stops        map[int64]*stoppedGeneration // Stop taps peeked in getUpdates answers, by update id (drafts.go); guarded by mu

	apiURL      string       // the Bot API's base URL, without a trailing slash
	hc          *http.Client // the Bot API's HTTP client
	pollTimeout time.Duration

	cl              *Cluster                           // Options.Cluster with defaults; nil on one process
	claims          OutboxClaims                       // cl.Claims when there is an outbox
	updates         atomic.Pointer[tgupdates.Log]      // the update stream while Run receives (cluster)
	polling         atomic.Bool                        // this replica polls now (cluster)
	consumer        atomic.Pointer[tgupdates.Consumer] // this replica's update consumer while Run receives (cluster)
	onStoredHandled func(tgupdates.Update)             // tests: a stored update was handled (set before Run)
	ours            keySet                             // runs whose endings are this replica's to send (cluster); guarded by mu
	seenRows        map[int64]time.Time                // outbox rows of others' turns, when first claimed here (cluster); guarded by mu
	pollMu          sync.Mutex                         // one poll loop at a time (cluster)
}

type identity struct {
	id       int64
	username string
}

// SessionKey is the engine session of a Telegram chat.
func SessionKey(chatID int64) string { return "telegram:" + strconv.FormatInt(chatID, 10) }

// startupClaimTimeout bounds New's read of the outbox.
const startupClaimTimeout = 10 * time.Second

// New builds the channel from cfg's channels.telegram section, queues the
// outbox's pending messages and subscribes it to eng's event bus. It makes
// no network call itself (the queued messages go out on the chats'
// workers). It logs a
// warning when the chat allow-list is empty and the channel's runner is not
// the free demo runner.
func New(eng *gateway.Engine, cfg *config.Source, opts Options) (*Channel, error) {
	if eng == nil || cfg == nil || cfg.Current() == nil {
		return nil, errors.New("telegram: engine and config are required")
	}
	c0 := cfg.Current()
	tg := c0.Channels.Telegram
	if strings.TrimSpace(tg.Token) == "" {
		return nil, errors.New("telegram: channels.telegram.token is empty")
	}
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	log = log.With("channel", config.ChannelTelegram)
	poll := opts.PollTimeout
	if poll == 0 {
		poll = DefaultPollTimeout
	}
	poll = max(poll, 2*time.Second)
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: poll + 15*time.Second}
	}
	c := &Channel{
		eng: eng, cfg: cfg, log: log, outbox: opts.Outbox, red: newRedactor(tg.Token),
		global: delivery.NewLimiter(globalPerSecond), mode: tg.Mode, secret: tg.WebhookSecret, webhookURL: tg.WebhookURL,
		chats: map[int64]*chat{}, inflight: map[string]bool{}, rejected: map[int64]bool{},
		awaiting: map[string]*outItem{}, questions: map[string]*question{}, runs: opts.Runs, durable: opts.DurableEndings && opts.Outbox != nil, sync: opts.Sync, claimWake: make(chan struct{}, 1),
	}
	c.tokens = newMemTokens()
	if opts.Runs != nil {
		c.tokens = opts.Runs
	}
	if opts.DurableEndings && opts.Outbox == nil {
		return nil, errors.New("telegram: durable endings need an outbox")
	}
	c.apiURL, c.hc, c.pollTimeout = strings.TrimRight(tg.APIURL, "/"), hc, poll
	var err error
	if c.cl, err = opts.Cluster.withDefaults(); err != nil {
		return nil, err
	}
	if c.cl != nil && c.outbox != nil {
		if c.cl.Claims == nil {
			return nil, errors.New("telegram: cluster: an outbox needs Cluster.Claims (rows are claimed, not read)")
		}
		c.claims = c.cl.Claims
	}
	if c.mode == "" {
		c.mode = config.TelegramPolling
	}
	b, err := bot.New(tg.Token,
		bot.WithSkipGetMe(),
		bot.WithServerURL(c.apiURL),
		bot.WithHTTPClient(poll, doer{c: hc, peek: c.peekUpdates}),
		bot.WithDefaultHandler(func(_ context.Context, _ *bot.Bot, u *models.Update) { c.dispatch(u) }),
		bot.WithNotAsyncHandlers(), // dispatch only queues: order is kept, nothing blocks
		bot.WithAllowedUpdates(allowedUpdates),
		bot.WithErrorsHandler(func(err error) {
			c.log.Warn("telegram: polling failed", "err", c.red.err(err))
		}),
		bot.WithDebugHandler(func(string, ...any) {}),
	)
	if err != nil {
		return nil, fmt.Errorf("telegram: %w", c.red.err(err))
	}
	c.bot, c.api = b, api{b: b, url: c.apiURL, hc: hc}
	c.baseCtx, c.cancel = context.WithCancel(context.Background())
	c.markCtx, c.stopMarks = context.WithCancel(c.baseCtx)
	if c.outbox != nil {
		// What the outbox still holds (the endings and interrupted notices
		// of the last run) is queued before the channel hears of any new
		// turn, so in each chat it goes before what those turns say.
		ctx, cancel := context.WithTimeout(c.baseCtx, startupClaimTimeout)
		c.resendPending(ctx)
		cancel()
	}
	c.unsub = eng.Bus().Subscribe("", c.onEvent)
	if c.durable {
		c.wg.Add(1)
		go c.claimLoop()
	}
	if r := c0.RunnerFor(config.ChannelTelegram); r != config.RunnerDemo && len(tg.AllowedChatIDs) == 0 {
		log.Warn("telegram: channels.telegram.allowedChatIDs is empty, so anyone who finds the bot can use it; "+
			"the runner may cost money — list the allowed chat ids", "runner", r)
	}
	return c, nil
}

// Run makes the start-up calls — getMe (retried until it works; a refused
// token is an error), setMyCommands, and setWebhook in webhook mode or
// deleteWebhook in polling mode — sends the outbox's pending messages, and
// then receives updates by long polling (polling mode) or lets
// WebhookHandler accept them (webhook mode) until ctx ends. It returns nil
// when ctx ends, an error if the bot cannot start. Outgoing messages keep
// flowing after Run returns, until Close. Call Run once.
func (c *Channel) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("telegram: Run called twice")
	}
	if err := c.startup(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if c.cl != nil {
		return c.runCluster(ctx)
	}
	c.ready.Store(true)
	defer c.ready.Store(false)

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.resendLoop(ctx)
	}()
	if c.mode == config.TelegramWebhook {
		<-ctx.Done()
	} else {
		c.bot.Start(ctx)
	}
	wg.Wait()
	return nil
}

func (c *Channel) startup(ctx context.Context) error {
	var u *models.User
	err := c.retryStartup(ctx, "getMe", func(ctx context.Context) error {
		var err error
		u, err = c.bot.GetMe(ctx)
		return err
	})
	if err != nil {
		if errors.Is(err, bot.ErrorUnauthorized) || errors.Is(err, bot.ErrorNotFound) {
			return fmt.Errorf("telegram: the Bot API refused the token (check channels.telegram.token): %w", c.red.err(err))
		}
		return fmt.Errorf("telegram: getMe: %w", c.red.err(err))
	}
	c.me.Store(&identity{id: u.ID, username: u.Username})
	c.log.Info("telegram: bot ready", "bot", "@"+u.Username, "mode", c.mode)

	if err := c.retryStartup(ctx, "setMyCommands", func(ctx context.Context) error {
		_, err := c.bot.SetMyCommands(ctx, &bot.SetMyCommandsParams{Commands: botCommands})
		return err
	}); err != nil && ctx.Err() == nil {
		c.log.Warn("telegram: setMyCommands failed; the command menu may be missing", "err", c.red.err(err))
	}

	if c.mode == config.TelegramWebhook {
		if c.webhookURL == "" {
			c.log.Info("telegram: webhook mode without channels.telegram.webhookURL: not calling setWebhook (register the webhook elsewhere)")
			return nil
		}
		err := c.retryStartup(ctx, "setWebhook", func(ctx context.Context) error {
			_, err := c.bot.SetWebhook(ctx, &bot.SetWebhookParams{URL: c.webhookURL, SecretToken: c.secret, AllowedUpdates: allowedUpdates})
			return err
		})
		if err != nil {
			return fmt.Errorf("telegram: setWebhook: %w", c.red.err(err))
		}
		return nil
	}
	// Telegram refuses getUpdates while a webhook is set.
	if err := c.retryStartup(ctx, "deleteWebhook", func(ctx context.Context) error {
		_, err := c.bot.DeleteWebhook(ctx, &bot.DeleteWebhookParams{})
		return err
	}); err != nil && ctx.Err() == nil {
		c.log.Warn("telegram: deleteWebhook failed; polling may be refused while a webhook is set", "err", c.red.err(err))
	}
	return nil
}

// retryStartup calls fn until it succeeds, fails permanently or ctx ends,
// waiting out 429s and backing off (up to startupMaxWait) on other errors.
func (c *Channel) retryStartup(ctx context.Context, what string, fn func(context.Context) error) error {
	backoff := time.Second
	for {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		err := fn(cctx)
		cancel()
		class, ra := classify(ctx, err)
		switch class {
		case delivery.OK:
			return nil
		case delivery.Permanent, delivery.Canceled:
			return err
		case delivery.RateLimit:
			backoff = ra
		}
		c.log.Warn("telegram: start-up call failed, retrying", "call", what, "in", backoff, "err", c.red.err(err))
		if delivery.Sleep(ctx, backoff) != nil {
			return ctx.Err()
		}
		backoff = min(backoff*2, startupMaxWait)
	}
}

// Close stops the channel: no new updates are accepted and progress updates
// stop, the queued replies and notices are delivered (until ctx ends), and
// then the workers stop. A final reply or notice still undelivered when ctx
// ends stays in the outbox and is sent at the next start. Order at
// shutdown: end Run's context (no more updates), then the engine's
// Shutdown (which publishes the shutdown notices), then Close — and only
// then close the store the outbox lives in.
func (c *Channel) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	c.stopMarks() // a delivery the store does not take now is remembered until exit, then resent at the next start
	if c.durable {
		// The shutdown notices are written by the store: wait for them
		// and take them into the chats' queues.
		if c.sync != nil {
			if err := c.sync(ctx); err != nil {
				c.log.Warn("telegram: the store did not write every ending in time; the rest is sent at the next start", "err", c.red.err(err))
			}
		}
		c.claim(ctx, false)
	}
	c.mu.Lock()
	c.closing = true
	for _, ch := range c.chats {
		ch.poke()
	}
	var drained <-chan struct{}
	if c.queued == 0 {
		d := make(chan struct{})
		close(d)
		drained = d
	} else {
		if c.drained == nil {
			c.drained = make(chan struct{})
		}
		drained = c.drained
	}
	c.mu.Unlock()

	var err error
	select {
	case <-drained:
	case <-ctx.Done():
		err = ctx.Err()
	}
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	c.unsub()

	c.mu.Lock()
	var left []*outItem
	var leftChat []*chat
	for _, ch := range c.chats {
		for _, it := range ch.queue {
			left, leftChat = append(left, it), append(leftChat, ch)
		}
		ch.queue = nil
	}
	c.mu.Unlock()
	var giveBack []int64
	for i, it := range left {
		c.shelve(leftChat[i], it)
		if it.outboxID != 0 {
			giveBack = append(giveBack, it.outboxID)
		}
	}
	c.release(giveBack) // another replica sends them now, not when their hold ends
	if err != nil {
		return fmt.Errorf("telegram: close: %d message(s) not delivered in time: %w", len(left), err)
	}
	return nil
}

// shelve puts an item that could not be delivered before shutdown into the
// outbox (if it is a terminal message not there yet), so the next start
// sends it; anything else is logged as dropped.
func (c *Channel) shelve(ch *chat, it *outItem) {
	if it.done != nil {
		it.done <- ErrClosed
	}
	if !it.durable() || c.outbox == nil {
		c.log.Warn("telegram: message dropped at shutdown", "chat", ch.id, "run", it.runID)
		return
	}
	if it.outboxID == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := c.outbox.Enqueue(ctx, it.outboxMessage(ch)); err != nil && !errors.Is(err, store.ErrDuplicate) {
			c.log.Error("telegram: message lost at shutdown: the outbox refused it", "chat", ch.id, "run", it.runID, "err", c.red.err(err))
			return
		}
	}
	c.log.Warn("telegram: message not delivered before shutdown; it will be sent at the next start", "chat", ch.id, "run", it.runID)
}

// SendText sends text (plain, split if long) to a chat — for operator
// alerts. It waits for the delivery (with the usual retries) or ctx; if
// ctx ends first the message may still be sent. The chat allow-list does
// not apply.
func (c *Channel) SendText(ctx context.Context, chatID int64, text string) error {
	if strings.TrimSpace(text) == "" {
		return errors.New("telegram: send: empty text")
	}
	it := &outItem{kind: itemReply, text: text, done: make(chan error, 1)}
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return ErrClosed
	}
	c.enqueueLocked(c.chatLocked(chatID), it)
	c.mu.Unlock()
	select {
	case err := <-it.done:
		if err != nil {
			return fmt.Errorf("telegram: send to chat %d: %w", chatID, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
