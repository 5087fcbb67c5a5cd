package telegram

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
	"github.com/turnguard/turnguard/store"

	"github.com/turnguard/turnguard/internal/faketime"

	"github.com/turnguard/turnguard/internal/testlog"
)

const (
	testToken   = "123456789:AAHsecret-test-token-value_XYZ"
	testAPIURL  = "http://telegram.test"
	alice       = int64(1001)
	bob         = int64(1002)
	groupChatID = int64(-100500)
)

type syncBuffer = testlog.Buffer

// fakeOutbox is an in-memory Outbox.
type fakeOutbox struct {
	mu     sync.Mutex
	next   int64
	rows   map[int64]*outboxRow
	byKey  map[string]int64
	errOut error // Enqueue fails with it when set
}

type outboxRow struct {
	m                 store.OutboxMessage
	delivered, failed bool
	failReason        string
}

func newFakeOutbox() *fakeOutbox {
	return &fakeOutbox{rows: map[int64]*outboxRow{}, byKey: map[string]int64{}}
}

func (o *fakeOutbox) Enqueue(_ context.Context, m store.OutboxMessage) (int64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.errOut != nil {
		return 0, o.errOut
	}
	key := m.RunID + "/" + string(m.Kind)
	if id, ok := o.byKey[key]; ok {
		return id, fmt.Errorf("enqueue: %w", store.ErrDuplicate)
	}
	o.next++
	m.ID = o.next
	o.rows[m.ID] = &outboxRow{m: m}
	o.byKey[key] = m.ID
	return m.ID, nil
}

func (o *fakeOutbox) row(id int64) (*outboxRow, error) {
	r, ok := o.rows[id]
	if !ok {
		return nil, store.ErrNotFound
	}
	return r, nil
}

func (o *fakeOutbox) MarkDelivered(_ context.Context, id int64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	r, err := o.row(id)
	if err == nil {
		r.delivered = true
	}
	return err
}

func (o *fakeOutbox) MarkAttempt(_ context.Context, id int64, e error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	r, err := o.row(id)
	if err == nil {
		r.m.Attempts++
		r.m.LastError = e.Error()
	}
	return err
}

func (o *fakeOutbox) MarkFailed(_ context.Context, id int64, reason string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	r, err := o.row(id)
	if err == nil && !r.delivered {
		r.failed, r.failReason = true, reason
	}
	return err
}

func (o *fakeOutbox) Pending(_ context.Context, channel string, limit int) ([]store.OutboxMessage, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []store.OutboxMessage
	for id := int64(1); id <= o.next && len(out) < limit; id++ {
		if r, ok := o.rows[id]; ok && !r.delivered && !r.failed && (channel == "" || r.m.Channel == channel) {
			out = append(out, r.m)
		}
	}
	return out, nil
}

func (o *fakeOutbox) MarkPartsSent(_ context.Context, id int64, n int) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	r, err := o.row(id)
	if err == nil {
		r.m.PartsSent = max(r.m.PartsSent, n)
	}
	return err
}

func (o *fakeOutbox) IsPending(_ context.Context, id int64) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	r, err := o.row(id)
	return err == nil && !r.delivered && !r.failed, err
}

// states returns each row as "kind:state" in id order.
func (o *fakeOutbox) states() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for id := int64(1); id <= o.next; id++ {
		r := o.rows[id]
		st := "pending"
		switch {
		case r.delivered:
			st = "delivered"
		case r.failed:
			st = "failed"
		}
		out = append(out, fmt.Sprintf("%s:%s", r.m.Kind, st))
	}
	return out
}

// harness runs the channel against the fake API inside a synctest bubble,
// with a real engine and the demo runner.
type harness struct {
	t      *testing.T
	api    *fakeAPI
	tr     *memTransport
	eng    *gateway.Engine
	ch     *Channel
	demo   *demo.Runner
	outbox *fakeOutbox
	logs   *syncBuffer
	src    *config.Source
	start  time.Time

	runCtx    context.Context
	cancelRun context.CancelFunc
	runErr    chan error
	running   bool
	stopped   bool
}

type setup struct {
	file    string // a YAML configuration in testdata/ instead of the defaults
	adjust  func(*config.Config)
	runner  runner.Runner // replaces the demo runner when set
	outbox  *fakeOutbox   // pre-filled outbox
	noRun   bool          // do not call Run
	admit   func() error  // gateway.Options.Admit
	prepare func(*fakeAPI, *memTransport)
	// store, when set, is the outbox with durable endings: it records the
	// engine's events and writes the endings (open it with openStore).
	store *durableStore
	// storeOutbox, with store, stands in front of it as the channel's
	// Outbox (a test's crash point).
	storeOutbox Outbox
	// cluster makes the channel a cluster replica (Options.Cluster).
	cluster *Cluster
}

// testConfig is the default configuration with Telegram enabled against
// the fake API, in edit mode (the in-package fake has no drafts: the draft
// mode is tested against internal/fakebot, drafts_test.go).
func testConfig(adjust func(*config.Config)) *config.Config {
	c := config.Default()
	tg := &c.Channels.Telegram
	tg.Enabled, tg.Token, tg.APIURL, tg.Streaming = true, testToken, testAPIURL, config.TelegramStreamEdit
	if adjust != nil {
		adjust(c)
	}
	return c
}

// newHarness must be called inside a synctest bubble.
func newHarness(t *testing.T, s setup) *harness {
	t.Helper()
	var c *config.Config
	if s.file != "" {
		var err error
		if c, err = config.Load(filepath.Join("testdata", s.file)); err != nil {
			t.Fatal(err)
		}
		c.Channels.Telegram.Streaming = config.TelegramStreamEdit
	} else {
		c = testConfig(s.adjust)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, api: newFakeAPI(testToken), logs: &syncBuffer{}, src: config.NewSource(c), start: time.Now()}
	h.tr = &memTransport{h: h.api}
	if s.prepare != nil {
		s.prepare(h.api, h.tr)
	}
	h.demo = demo.New()
	var rn runner.Runner = h.demo
	if s.runner != nil {
		rn = s.runner
	}
	log := slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	eng, err := gateway.New(gateway.Options{Config: h.src, Runners: map[string]runner.Runner{"demo": rn}, Log: log, Admit: s.admit})
	if err != nil {
		t.Fatal(err)
	}
	eng.Start(context.Background())
	h.eng = eng
	// Let the engine's registry clock leave zero, as it has in any real
	// gateway by the time a message arrives (a pause at registry time 0 is
	// not recorded).
	faketime.Advance(time.Second)
	h.start = time.Now()
	h.api.start = h.start
	h.outbox = s.outbox
	if h.outbox == nil {
		h.outbox = newFakeOutbox()
	}
	opts := Options{Log: log, Outbox: h.outbox, HTTPClient: &http.Client{Transport: h.tr}, PollTimeout: 10 * time.Second}
	if s.store != nil {
		opts.Outbox, opts.DurableEndings, opts.Sync, opts.Runs = s.store.st, true, s.store.st.Flush, s.store.st
		if s.storeOutbox != nil {
			opts.Outbox = s.storeOutbox
		}
		t.Cleanup(eng.Bus().Subscribe("", s.store.handle))
	}
	opts.Cluster = s.cluster
	h.ch, err = New(eng, h.src, opts)
	if err != nil {
		t.Fatal(err)
	}
	if s.store != nil {
		s.store.claim.Store(h.ch)
	}
	h.runCtx, h.cancelRun = context.WithCancel(context.Background())
	h.runErr = make(chan error, 1)
	if !s.noRun {
		h.run()
	}
	t.Cleanup(h.stop)
	return h
}

// durableStore is a real SQLite store that writes Telegram's turn endings
// to its outbox and tells the channel in claim (store.Options.OnOutbox).
type durableStore struct {
	st    *store.SQLite
	claim atomic.Pointer[Channel]

	mu              sync.Mutex
	holding         bool          // events are held back from the store (a slow or stuck writer)
	held            []event.Event // in order
	slowSubscribers bool          // flush at each ending and pause (fake time): the store claims before the channel's onEvent
}

// handle hands ev to the store, unless events are held.
func (d *durableStore) handle(ev event.Event) {
	d.mu.Lock()
	if d.holding {
		d.held = append(d.held, ev)
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	d.st.Handle(ev)
	if d.slowSubscribers && ev.Kind.Terminal() {
		_ = d.st.Flush(context.Background())
		faketime.Advance(time.Millisecond) // the subscribers between the store and the channel take a while
	}
}

// hold makes the store see no event until release.
func (d *durableStore) hold() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.holding = true
}

// release hands the held events to the store, in order.
func (d *durableStore) release() {
	d.mu.Lock()
	held := d.held
	d.held, d.holding = nil, false
	d.mu.Unlock()
	for _, ev := range held {
		d.st.Handle(ev)
	}
}

// openStore opens a durableStore at path; it is closed when the test ends
// (after the harness stopped). Call it before newHarness.
func openStore(t *testing.T, path string) *durableStore {
	t.Helper()
	d := &durableStore{}
	st, err := store.Open(context.Background(), path, store.Options{
		Logger: slog.New(slog.DiscardHandler), OutboxChannels: []string{config.ChannelTelegram},
		OnOutbox: func(string) {
			if c := d.claim.Load(); c != nil {
				c.Claim()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	d.st = st
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("store Close: %v", err)
		}
	})
	return d
}

// run starts Run (with the harness's context) and lets start-up settle.
func (h *harness) run() {
	h.running = true
	go func() { h.runErr <- h.ch.Run(h.runCtx) }()
	synctest.Wait()
}

// stop shuts everything down in the order the gateway does and checks that
// the token never reached the logs.
func (h *harness) stop() {
	if h.stopped {
		return
	}
	h.stopped = true
	h.cancelRun()
	if h.running && !h.waitRun() {
		h.t.Error("Run did not return after its context ended")
	}
	h.demo.Release()
	h.eng.Shutdown(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.ch.Close(ctx); err != nil {
		h.t.Errorf("Close: %v", err)
	}
	h.checkLogs()
}

func (h *harness) waitRun() bool {
	select {
	case err := <-h.runErr:
		if err != nil {
			h.t.Errorf("Run: %v", err)
		}
		return true
	case <-time.After(time.Minute):
		return false
	}
}

func (h *harness) checkLogs() {
	h.t.Helper()
	logs := h.logs.String()
	for _, secret := range newRedactor(testToken).secrets {
		if strings.Contains(logs, secret) {
			h.t.Errorf("the bot token appears in the logs:\n%s", logs)
		}
	}
}

// finishedEvent is the Finished event of the chat's first run, as the
// engine published it.
func finishedEvent(h *harness, chatID int64) event.Event {
	h.outbox.mu.Lock()
	defer h.outbox.mu.Unlock()
	r := h.outbox.rows[1]
	return event.Event{Kind: event.Finished, RunID: r.m.RunID, SessionKey: SessionKey(chatID), Channel: "telegram",
		ChatRef: r.m.ChatRef, StopReason: event.ReasonStop, FullText: r.m.Text, Time: time.Now()}
}

// say sends a user message and lets everything settle.
func (h *harness) say(chatID int64, text string) {
	h.api.say(chatID, text)
	synctest.Wait()
}

// advance moves the fake clock by d and lets everything settle.
func (h *harness) advance(d time.Duration) {
	faketime.Advance(d)
	synctest.Wait()
}

func (h *harness) screen(chatID int64) []string { return h.api.screen(chatID) }

// last is the newest message in the chat.
func (h *harness) last(chatID int64) string {
	s := h.screen(chatID)
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

func (h *harness) wantScreen(chatID int64, want ...string) {
	h.t.Helper()
	got := h.screen(chatID)
	if strings.Join(got, "\n---\n") != strings.Join(want, "\n---\n") {
		h.t.Errorf("chat %d shows:\n%s\nwant:\n%s\nlogs:\n%s", chatID, quoteAll(got), quoteAll(want), h.logs.String())
	}
}

func quoteAll(s []string) string {
	var b strings.Builder
	for i, x := range s {
		fmt.Fprintf(&b, "  %d: %q\n", i+1, x)
	}
	return b.String()
}

var errNetwork = errors.New("dial tcp: connection refused")
