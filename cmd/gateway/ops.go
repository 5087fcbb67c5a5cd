package main

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway/maintenance"
	"github.com/turnguard/turnguard/ops/admin"
	"github.com/turnguard/turnguard/ops/alerts"
	"github.com/turnguard/turnguard/ops/metrics"
	"github.com/turnguard/turnguard/ops/tracing"
)

// ops is the operator side of the gateway: Prometheus metrics
// (ops/metrics), operator alerts (ops/alerts), and the diagnostics
// API with the admin dashboard (ops/admin). The app creates it before
// the engine (the engine's scheduler reports abort lateness to it), wires
// it once the engine and channels exist, mounts its routes on the HTTP
// router and closes it at shutdown. Every method is safe on a nil *ops
// and on one that was never wired.
type ops struct {
	log     *slog.Logger
	cfg     *config.Source
	started time.Time
	metrics *metrics.Metrics
	alerts  *alerts.Alerter
	stuckAl atomic.Pointer[alerts.Alerter] // alerts, for the engine's StuckRuns hook (called from any goroutine)
	admin   *admin.Handler
	unsub   []func()
	stop    context.CancelFunc
	done    chan struct{}
}

// newOps creates the metrics registry. Nothing runs yet.
func newOps(cfg *config.Source, log *slog.Logger) *ops {
	return &ops{log: log, cfg: cfg, started: time.Now(), metrics: metrics.New(version)}
}

// observer is the engine's maintenance observer (abort lateness).
func (o *ops) observer() maintenance.Observer {
	if o == nil {
		return maintenance.Observer{}
	}
	return o.metrics.Observer()
}

// stuckRuns is the engine's StuckRuns hook: it raises (and recovers) the
// stuck_runs operator alert once the alerter is wired.
func (o *ops) stuckRuns(runner string, stuck, limit int, saturated bool) {
	if o == nil {
		return
	}
	if al := o.stuckAl.Load(); al != nil {
		al.StuckRuns(runner, stuck, limit, saturated)
	}
}

// telegramOutbox wraps the outbox given to the Telegram channel so that its
// deliveries, retries and failures are counted (turnguard_deliveries_total).
func (o *ops) telegramOutbox(st metrics.Outbox) metrics.Outbox {
	if o == nil {
		return st
	}
	return o.metrics.Outbox(config.ChannelTelegram, st)
}

// telegramHTTPClient is the HTTP client for the Telegram channel: every Bot
// API call is counted by method and result (turnguard_telegram_api_calls_total).
// timeout must exceed the channel's long-poll wait.
func (o *ops) telegramHTTPClient(timeout time.Duration) *http.Client {
	c := &http.Client{Timeout: timeout}
	if o != nil {
		c.Transport = o.metrics.TelegramTransport(nil)
	}
	return c
}

// wire subscribes the metrics and the alerter to the engine's bus, registers
// the scrape-time gauges, builds the API and starts the alerter. tg sends
// alerts to alerts.telegramChatIDs; pass nil (an untyped nil, not a nil
// *telegram.Channel) when the Telegram channel is not running. Call it
// after the engine and channels are built and before the HTTP router.
func (o *ops) wire(ctx context.Context, a *app, tg alerts.TelegramSender) error {
	if o == nil {
		return nil
	}
	bus := a.eng.Bus()
	o.unsub = append(o.unsub, bus.Subscribe("", o.metrics.Handle))
	o.metrics.AddSources(metrics.Sources{
		ActiveTurns: a.eng.Registry().Len, TurnClasses: a.eng.TurnClasses, WSClients: a.ws.Clients, Store: a.store, Outbox: a.store,
	})

	al, err := alerts.New(alerts.Options{Config: o.cfg, Telegram: tg, Log: o.log.With("component", "alerts")})
	if err != nil {
		return err
	}
	o.alerts = al
	o.stuckAl.Store(al)
	o.unsub = append(o.unsub, bus.Subscribe("", al.Handle))
	actx, stop := context.WithCancel(context.WithoutCancel(ctx))
	o.stop, o.done = stop, make(chan struct{})
	go func() {
		defer close(o.done)
		al.Run(actx)
	}()

	o.admin, err = admin.New(admin.Options{
		Engine: a.eng, Config: o.cfg, Store: a.store, Metrics: o.metrics, MetricsHandler: o.metrics.Handler(),
		Alerts: al, WSClients: a.ws.Clients, Runners: a.runners.healthOf, OperatorToken: o.cfg.Current().Server.OperatorToken,
		Version: "turnguard " + version, StartedAt: o.started, Log: o.log.With("component", "admin"),
		TraceID: traceIDs(a.tracer),
	})
	return err
}

// mount adds /metrics, /api/* and /admin to the router (server.Options.Mount).
func (o *ops) mount(r chi.Router) {
	if o == nil || o.admin == nil {
		return
	}
	o.admin.Mount(r)
}

// close stops the alerter (alerts still being delivered are abandoned) and
// unsubscribes from the bus. Call it after the engine's shutdown.
func (o *ops) close() {
	if o == nil {
		return
	}
	for _, u := range o.unsub {
		u()
	}
	o.unsub = nil
	if o.stop != nil {
		o.stop()
		<-o.done
		o.stop = nil
	}
}

// traceIDs names a turn's trace id for /api/turns while tracing is on (nil
// when it is off: no trace id is shown).
func traceIDs(t *tracing.Tracer) func(runID string) string {
	if t == nil {
		return nil
	}
	return tracing.TraceIDString
}
