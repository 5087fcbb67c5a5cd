// Package alerts owns operator alerts: it watches the engine's event bus for
// the two signs that the gateway needs a person — a turn force-finalized
// because its runner ignored the abort, and a burst of step timeouts
// (alerts.stepTimeoutBurst of them within alerts.window) — and is told by
// the store when it cannot write (StoreHealth), and sends one
// alert when such an episode begins and one closing "recovered" message
// when it ends, to the Telegram chats in alerts.telegramChatIDs (through the
// Telegram channel) and/or as a JSON POST to alerts.webhookURL. Nothing is
// repeated in between: further force-finalizations or step timeouts during
// an open episode are only counted, and the recovered message reports the
// count.
//
// An episode ends (recovers) when a whole alerts.window passes without
// another event of its kind. The two kinds are independent episodes.
//
// Handle, the bus subscriber, never blocks: it copies the few events that
// matter into a bounded queue (overflow is counted and dropped). Run
// tracks episodes on its own goroutine and delivers alerts on another, each
// target with bounded retries, so a slow webhook or Telegram never slows the
// bus or the tracking. The configuration is read for each event and each
// delivery, so hot-reloaded alerts.* settings apply at once.
package alerts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
)

// Delivery limits.
const (
	eventQueue     = 256              // events waiting for the tracker
	alertQueue     = 64               // alerts waiting for delivery
	maxAttempts    = 3                // tries per alert and target
	firstBackoff   = 2 * time.Second  // wait before the second try; doubled after
	attemptTimeout = 30 * time.Second // one try (a Telegram send may wait for rate limits)
	maxBodyRead    = 4 << 10          // of a webhook's answer, for the log
)

// TelegramSender sends a plain-text message to a Telegram chat. The
// Telegram channel (channels/telegram.Channel) implements it.
type TelegramSender interface {
	SendText(ctx context.Context, chatID int64, text string) error
}

// Kind says what an alert is about.
type Kind string

// The alert kinds.
const (
	KindForceFinalized   Kind = "force_finalized"    // a turn's runner ignored its abort
	KindStepTimeoutBurst Kind = "step_timeout_burst" // stepTimeoutBurst step timeouts within the window
	KindStoreUnwritable  Kind = "store_unwritable"   // the store cannot write: new turns are refused
	KindRecovered        Kind = "recovered"          // the episode of Alert.Episode ended
	KindStuckRuns        Kind = "stuck_runs"         // a runner reached server.maxStuckRuns: its new turns are refused
	KindAgentSignIn      Kind = "agent_sign_in"      // an ACP agent needs the operator to sign it in (signin.go)
)

// Alert is one message to the operator. It is the JSON body POSTed to
// alerts.webhookURL; Text is what a Telegram chat receives.
type Alert struct {
	Source  string    `json:"source"` // always "turnguard"
	Kind    Kind      `json:"kind"`
	Episode string    `json:"episode"` // the id of the episode; a recovered alert carries the id of the one it closes
	Text    string    `json:"text"`
	Time    time.Time `json:"time"`
	// Count: force-finalized turns or step timeouts in the episode so far
	// (for a recovered alert: in the whole episode).
	Count         int       `json:"count"`
	WindowSeconds float64   `json:"windowSeconds"`
	EpisodeStart  time.Time `json:"episodeStart"`
	// The turn that raised the alert (not set for recovered alerts).
	RunID      string           `json:"runId,omitempty"`
	SessionKey string           `json:"sessionKey,omitempty"`
	Channel    string           `json:"channel,omitempty"`
	Step       string           `json:"step,omitempty"`
	StopReason event.StopReason `json:"stopReason,omitempty"`
}

// Options configure an Alerter.
type Options struct {
	// Config supplies alerts.* (required). It is read on every event and
	// every delivery.
	Config *config.Source
	// Telegram sends to alerts.telegramChatIDs. nil: those chats are skipped
	// and each skipped alert is logged.
	Telegram TelegramSender
	// HTTPClient posts to the webhook. nil: a client with a 10 s timeout.
	// Redirects are never followed, so an alert goes only to the configured
	// URL.
	HTTPClient *http.Client
	// Log receives alerts raised and delivery failures (default
	// slog.Default()). The webhook URL is logged redacted.
	Log *slog.Logger
}

// Stats are the alerter's counters.
type Stats struct {
	Raised        uint64 `json:"raised"`        // alerts raised
	Delivered     uint64 `json:"delivered"`     // deliveries to a target that succeeded
	Failed        uint64 `json:"failed"`        // deliveries to a target given up after retries
	DroppedEvents uint64 `json:"droppedEvents"` // events lost because the queue was full
	DroppedAlerts uint64 `json:"droppedAlerts"` // alerts lost because the delivery queue was full
}

// Alerter raises and delivers operator alerts. Create it with New,
// subscribe Handle to the bus and call Run once.
type Alerter struct {
	cfg *config.Source
	tg  TelegramSender
	hc  *http.Client
	log *slog.Logger

	events chan event.Event
	stuck  chan stuckSignal
	out    chan Alert

	raised, delivered, failed, droppedEvents, droppedAlerts atomic.Uint64

	storeMu sync.Mutex
	store   episode // the store_unwritable episode, guarded by storeMu

	signInMu sync.Mutex
	signIn   map[string]*episode // by runner: the agent_sign_in episodes (signin.go), guarded by signInMu
}

// New returns an alerter. It starts nothing.
func New(opts Options) (*Alerter, error) {
	if opts.Config == nil || opts.Config.Current() == nil {
		return nil, errors.New("alerts: no config")
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	// A copy, so that the caller's client keeps its own redirect policy.
	c := *hc
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Alerter{
		cfg: opts.Config, tg: opts.Telegram, hc: &c, log: opts.Log,
		events: make(chan event.Event, eventQueue), stuck: make(chan stuckSignal, eventQueue), out: make(chan Alert, alertQueue),
	}, nil
}

// Stats returns the counters.
func (a *Alerter) Stats() Stats {
	return Stats{
		Raised: a.raised.Load(), Delivered: a.delivered.Load(), Failed: a.failed.Load(),
		DroppedEvents: a.droppedEvents.Load(), DroppedAlerts: a.droppedAlerts.Load(),
	}
}

// Handle is an event.Handler: subscribe it to the bus for all sessions. It
// keeps ForceFinalized events and step-timeout aborts and never blocks.
func (a *Alerter) Handle(ev event.Event) {
	if !relevant(ev) {
		return
	}
	ev.Locals = nil // the run's subscriber state is not ours to keep alive
	select {
	case a.events <- ev:
	default:
		a.droppedEvents.Add(1)
	}
}

// stuckSignal is one change of a runner's stuck-runs state.
type stuckSignal struct {
	runner       string
	stuck, limit int
	saturated    bool
	at           time.Time
}

// StuckRuns is the engine's gateway.StuckRunsFunc: a runner reached its cap
// of force-finalized runs that still run (saturated: its new turns are
// refused), or dropped below it. The first raises one stuck_runs alert for
// the runner; the second closes it with a recovered alert. It never blocks
// (overflow is counted as a dropped event).
func (a *Alerter) StuckRuns(runner string, stuck, limit int, saturated bool) {
	select {
	case a.stuck <- stuckSignal{runner: runner, stuck: stuck, limit: limit, saturated: saturated, at: time.Now()}:
	default:
		a.droppedEvents.Add(1)
	}
}

func relevant(ev event.Event) bool {
	return ev.Kind == event.ForceFinalized || (ev.Kind == event.Aborted && ev.StopReason == event.ReasonStepTimeout)
}

// StoreHealth reports a change of the store's health (store.Options.OnHealth):
// a non-nil err opens a store_unwritable episode with one alert, nil closes
// it with a recovered message. Repeats of the same state are ignored. It
// never blocks. The reason text is the store's short cause, never a path or
// a secret.
func (a *Alerter) StoreHealth(err error) {
	now := time.Now()
	a.storeMu.Lock()
	defer a.storeMu.Unlock()
	ep := &a.store
	switch {
	case err != nil && !ep.open:
		*ep = episode{open: true, id: episodeID(KindStoreUnwritable, now), started: now, last: now, count: 1}
		a.raise([]Alert{{Source: "turnguard", Kind: KindStoreUnwritable, Episode: ep.id, Time: now, Count: 1, EpisodeStart: now,
			Text: "🚨 turnguard: the store cannot write (" + err.Error() + "). New turns are refused and /readyz fails " +
				"until it can; running turns' endings are kept and retried. Free disk space or restore the database file."}})
	case err == nil && ep.open:
		a.raise([]Alert{{Source: "turnguard", Kind: KindRecovered, Episode: ep.id, Time: now, Count: ep.count, EpisodeStart: ep.started,
			Text: fmt.Sprintf("✅ turnguard recovered: the store writes again after %s; new turns are accepted.",
				messages.Duration(now.Sub(ep.started)))}})
		*ep = episode{}
	}
}

// Run tracks episodes and delivers alerts until ctx ends. Alerts still
// queued or being delivered then are abandoned (and episodes still open
// get no recovered message).
func (a *Alerter) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.deliverLoop(ctx)
	}()
	defer func() { <-done }()

	var tr tracker
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-a.events:
			at := ev.Time
			if at.IsZero() {
				at = time.Now()
			}
			a.raise(tr.observe(ev, at, a.settings()))
		case sig := <-a.stuck:
			a.raise(tr.observeStuck(sig, a.settings()))
		case <-timer.C:
		}
		// Recoveries that are due, then re-arm for the next one.
		now := time.Now()
		a.raise(tr.due(now, a.settings()))
		timer.Stop()
		if next := tr.next(a.settings()); !next.IsZero() {
			timer.Reset(max(next.Sub(now), 0))
		}
	}
}

// defaultWindow stands in for a window that is not positive (Load refuses
// one; a Config built in code may have it).
const defaultWindow = 10 * time.Minute

// settings are the alert thresholds in force.
func (a *Alerter) settings() config.Alerts {
	c := a.cfg.Current().Alerts
	if c.Window <= 0 {
		c.Window = defaultWindow
	}
	return c
}

func (a *Alerter) raise(alerts []Alert) {
	for _, al := range alerts {
		a.raised.Add(1)
		a.log.Warn("operator alert", "kind", al.Kind, "episode", al.Episode, "count", al.Count, "run", al.RunID, "session", al.SessionKey)
		select {
		case a.out <- al:
		default:
			a.droppedAlerts.Add(1)
			a.log.Error("operator alert dropped: the delivery queue is full", "kind", al.Kind, "episode", al.Episode)
		}
	}
}

func (a *Alerter) deliverLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case al := <-a.out:
			a.deliver(ctx, al)
		}
	}
}

// deliver sends al to every configured target, in order: the Telegram
// chats, then the webhook.
func (a *Alerter) deliver(ctx context.Context, al Alert) {
	c := a.settings()
	for _, chat := range c.TelegramChatIDs {
		target := "telegram chat " + strconv.FormatInt(chat, 10)
		if a.tg == nil {
			a.failed.Add(1)
			a.log.Warn("operator alert not sent: alerts.telegramChatIDs is set but the Telegram channel is not running",
				"target", target, "kind", al.Kind)
			continue
		}
		a.try(ctx, target, al, func(ctx context.Context) error { return a.tg.SendText(ctx, chat, al.Text) })
	}
	if c.WebhookURL != "" {
		u := c.WebhookURL
		target := "webhook " + (&config.Config{Alerts: config.Alerts{WebhookURL: u}}).Redacted().Alerts.WebhookURL
		a.try(ctx, target, al, func(ctx context.Context) error { return a.post(ctx, u, al) })
	}
}

// try calls send up to maxAttempts times, backing off between tries, unless
// it fails permanently or ctx ends.
func (a *Alerter) try(ctx context.Context, target string, al Alert, send func(context.Context) error) {
	backoff := firstBackoff
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := send(actx)
		cancel()
		if err == nil {
			a.delivered.Add(1)
			return
		}
		var perm *permanentError
		final := errors.As(err, &perm) || attempt >= maxAttempts || ctx.Err() != nil
		if final {
			a.failed.Add(1)
			a.log.Error("operator alert not delivered", "target", target, "kind", al.Kind, "attempts", attempt, "err", err)
			return
		}
		a.log.Warn("operator alert delivery failed; retrying", "target", target, "kind", al.Kind, "in", backoff, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			a.failed.Add(1)
			return
		case <-t.C:
		}
		backoff *= 2
	}
}

// permanentError is a failure that retrying will not change: a webhook
// answer 3xx, or 4xx other than 408 and 429, or a URL that does not parse.
type permanentError struct{ msg string }

func (e *permanentError) Error() string { return e.msg }

// post sends al as JSON to the webhook. Errors never contain the URL (its
// query may hold a token).
func (a *Alerter) post(ctx context.Context, u string, al Alert) error {
	body, err := json.Marshal(al)
	if err != nil {
		return fmt.Errorf("encode alert: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return &permanentError{msg: "alerts.webhookURL is not a valid URL"}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "turnguard-alerts")
	res, err := a.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error quotes the URL
		}
		return fmt.Errorf("webhook: %w", err)
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, maxBodyRead))
	switch s := res.StatusCode; {
	case s >= 200 && s < 300:
		return nil
	case s >= 300 && s < 400:
		return &permanentError{msg: fmt.Sprintf("webhook answered with a redirect (HTTP %d); alerts are sent only to the configured URL", s)}
	case s >= 400 && s < 500 && s != http.StatusRequestTimeout && s != http.StatusTooManyRequests:
		return &permanentError{msg: fmt.Sprintf("webhook refused the alert: HTTP %d", s)}
	default:
		return fmt.Errorf("webhook answered HTTP %d", s)
	}
}

// tracker holds the two kinds of episode. It is used by Run's goroutine
// only.
type tracker struct {
	ff    episode             // force-finalizations
	burst episode             // step-timeout bursts
	steps []time.Time         // step timeouts within the window, oldest first
	stuck map[string]*episode // by runner: at its cap of stuck runs
}

// observeStuck opens a runner's stuck-runs episode when it reaches its cap
// and closes it when it drops below; it ends on that signal, not on a quiet
// window.
func (t *tracker) observeStuck(sig stuckSignal, c config.Alerts) []Alert {
	ep := t.stuck[sig.runner]
	switch {
	case sig.saturated && ep == nil:
		if t.stuck == nil {
			t.stuck = map[string]*episode{}
		}
		ep = &episode{open: true, id: episodeID(KindStuckRuns, sig.at) + "-" + sig.runner, started: sig.at, last: sig.at, count: sig.stuck}
		t.stuck[sig.runner] = ep
		return []Alert{{Source: "turnguard", Kind: KindStuckRuns, Episode: ep.id, Time: sig.at, Count: sig.stuck,
			WindowSeconds: c.Window.Seconds(), EpisodeStart: sig.at,
			Text: fmt.Sprintf("🚨 turnguard: runner %s has %d turns that ignored cancellation and still run (server.maxStuckRuns is %d). "+
				"New turns for it are refused until one of them returns; check the runner's processes.", sig.runner, sig.stuck, sig.limit)}}
	case !sig.saturated && ep != nil:
		delete(t.stuck, sig.runner)
		al := t.recovered(ep, sig.at, c.Window, fmt.Sprintf(
			"✅ turnguard recovered: runner %s is below its cap of stuck runs (%d of %d) and accepts new turns again. The episode lasted %s.",
			sig.runner, sig.stuck, sig.limit, messages.Duration(sig.at.Sub(ep.started))))
		return []Alert{al}
	}
	return nil
}

type episode struct {
	open    bool
	id      string
	started time.Time
	last    time.Time // the latest event of the episode
	count   int
}

// observe records one event at time at and returns the alerts it raises.
func (t *tracker) observe(ev event.Event, at time.Time, c config.Alerts) []Alert {
	window := c.Window
	switch {
	case ev.Kind == event.ForceFinalized:
		if t.ff.open {
			t.ff.count++
			t.ff.last = at
			return nil
		}
		t.ff = episode{open: true, id: episodeID(KindForceFinalized, at), started: at, last: at, count: 1}
		al := t.turnAlert(KindForceFinalized, &t.ff, ev, at, window)
		al.Text = fmt.Sprintf("🚨 turnguard: turn %s (session %s, %s) was force-finalized: its runner ignored the %s abort for %s%s. "+
			"The session is free again, but the runner may still be running. "+
			"No further alert until a whole %s passes without another force-finalization.",
			ev.RunID, ev.SessionKey, orNone(ev.Channel), ev.StopReason, messages.Duration(ev.Elapsed),
			stepText(ev.Step, " while %s was running"), messages.Duration(window))
		return []Alert{al}
	case ev.Kind == event.Aborted && ev.StopReason == event.ReasonStepTimeout:
		t.steps = append(t.steps, at)
		t.prune(at, window)
		if t.burst.open {
			t.burst.count++
			t.burst.last = at
			return nil
		}
		burst := max(c.StepTimeoutBurst, 1)
		if len(t.steps) < burst {
			return nil
		}
		t.burst = episode{open: true, id: episodeID(KindStepTimeoutBurst, at), started: t.steps[0], last: at, count: len(t.steps)}
		al := t.turnAlert(KindStepTimeoutBurst, &t.burst, ev, at, window)
		al.Text = fmt.Sprintf("🚨 turnguard: %d turns stopped for a step timeout within %s (alert threshold %d). "+
			"Latest: turn %s (session %s, %s)%s. "+
			"No further alert until a whole %s passes without a step timeout.",
			len(t.steps), messages.Duration(window), burst, ev.RunID, ev.SessionKey, orNone(ev.Channel),
			stepText(ev.Step, ", stuck on %s"), messages.Duration(window))
		return []Alert{al}
	}
	return nil
}

// prune forgets step timeouts that are no longer within window of now.
func (t *tracker) prune(now time.Time, window time.Duration) {
	i := 0
	for i < len(t.steps) && !t.steps[i].After(now.Add(-window)) {
		i++
	}
	t.steps = append(t.steps[:0], t.steps[i:]...)
}

func (t *tracker) turnAlert(k Kind, ep *episode, ev event.Event, at time.Time, window time.Duration) Alert {
	return Alert{
		Source: "turnguard", Kind: k, Episode: ep.id, Time: at, Count: ep.count,
		WindowSeconds: window.Seconds(), EpisodeStart: ep.started,
		RunID: ev.RunID, SessionKey: ev.SessionKey, Channel: ev.Channel, Step: ev.Step.Label(), StopReason: ev.StopReason,
	}
}

// due closes the episodes whose window has passed quietly by now and
// returns their recovered alerts.
func (t *tracker) due(now time.Time, c config.Alerts) []Alert {
	var out []Alert
	window := c.Window
	if t.ff.open && !now.Before(t.ff.last.Add(window)) {
		out = append(out, t.recovered(&t.ff, now, window,
			fmt.Sprintf("✅ turnguard recovered: no turn force-finalized for %s. The episode had %d force-finalized turn(s) and lasted %s.",
				messages.Duration(window), t.ff.count, messages.Duration(now.Sub(t.ff.started)))))
	}
	t.prune(now, window)
	if t.burst.open && !now.Before(t.burst.last.Add(window)) {
		out = append(out, t.recovered(&t.burst, now, window,
			fmt.Sprintf("✅ turnguard recovered: no step timeout for %s. The episode had %d step timeout(s) and lasted %s.",
				messages.Duration(window), t.burst.count, messages.Duration(now.Sub(t.burst.started)))))
	}
	return out
}

func (t *tracker) recovered(ep *episode, now time.Time, window time.Duration, text string) Alert {
	al := Alert{Source: "turnguard", Kind: KindRecovered, Episode: ep.id, Text: text, Time: now, Count: ep.count,
		WindowSeconds: window.Seconds(), EpisodeStart: ep.started}
	*ep = episode{}
	return al
}

// next is when the earliest open episode recovers if nothing else happens
// (zero: none open).
func (t *tracker) next(c config.Alerts) time.Time {
	var next time.Time
	for _, ep := range []*episode{&t.ff, &t.burst} {
		if ep.open {
			if at := ep.last.Add(c.Window); next.IsZero() || at.Before(next) {
				next = at
			}
		}
	}
	return next
}

func episodeID(k Kind, at time.Time) string {
	return string(k) + "-" + at.UTC().Format("20060102T150405.000Z")
}

// stepText formats the step's label into format, or is "" for no step.
func stepText(s event.Step, format string) string {
	if s.IsZero() {
		return ""
	}
	return fmt.Sprintf(format, s.Label())
}

func orNone(s string) string {
	if s == "" {
		return "unknown channel"
	}
	return s
}
