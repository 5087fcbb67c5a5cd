package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/turnguard/turnguard/channels/telegram"
	"github.com/turnguard/turnguard/channels/webchat"
	"github.com/turnguard/turnguard/channels/ws"
	"github.com/turnguard/turnguard/cluster/node"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/gateway/server"
	"github.com/turnguard/turnguard/ops/alerts"
	"github.com/turnguard/turnguard/ops/tracing"
	execrunner "github.com/turnguard/turnguard/runner/exec"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"
)

// Bounds of the shutdown steps that do not have a configured limit.
const (
	httpShutdownWait  = 5 * time.Second  // in-flight plain HTTP requests
	wsShutdownWait    = 5 * time.Second  // flushing and closing WebSocket clients
	storeShutdownWait = 10 * time.Second // writing the events still queued
	startupStoreWait  = 30 * time.Second // opening and recovering the store
	watchShutdownWait = 2 * time.Second  // the config watcher, which may be stuck reading its file
)

// app is a running gateway: every component, in start order.
type app struct {
	log     *slog.Logger
	cfg     *config.Source
	store   store.Backend // store.SQLite or postgres.Store (store.driver)
	eng     *gateway.Engine
	ws      *ws.Server
	http    *http.Server
	ln      net.Listener
	ready   atomic.Bool
	alerter atomic.Pointer[alerts.Alerter]   // store health alerts, once ops is wired
	tgClaim atomic.Pointer[telegram.Channel] // told when the store put Telegram endings into the outbox
	unsub   func()
	// tracer makes each turn a trace (telemetry.otlp.endpoint set; nil:
	// tracing off, nothing subscribed); unsubTrace removes it from the bus.
	tracer     *tracing.Tracer
	unsubTrace func()
	stopBG     context.CancelFunc // config watcher
	bg         sync.WaitGroup
	runners    *runnerSet // built at start and, as needed, on hot reload
	ops        *ops       // metrics, alerts, /api, /admin (ops.go)
	tg         *tgChannel // the Telegram bot, when enabled (telegram.go)
	node       *node.Node // this replica's membership, when cluster.enabled (cluster.go)
	// live is the engine once it runs queued messages (start's restore
	// done), for the cluster's callbacks, which may come before.
	live atomic.Pointer[gateway.Engine]

	serveErr chan error // the HTTP server's fatal error, if it fails
}

// start wires configuration → store → engine → runners → channels → HTTP and
// returns once the gateway is listening. On error everything already started
// is stopped again.
func start(ctx context.Context, cfgPath string, cfg *config.Config, log *slog.Logger) (a *app, err error) {
	a = &app{log: log, cfg: config.NewSource(cfg), serveErr: make(chan error, 1)}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	if cfg.Telemetry.OTLP.Endpoint != "" {
		// Tracing: built first, so every log line about a turn carries
		// its trace id.
		a.tracer, err = tracing.New(ctx, tracing.Options{Telemetry: cfg.Telemetry, Version: version,
			Instance: cfg.Cluster.ReplicaID, Log: log.With("component", "tracing")})
		if err != nil {
			return a, err
		}
		log = slog.New(tracing.LogHandler(log.Handler()))
		a.log = log
		log.Info("tracing: each turn is exported as a trace over OTLP", "protocol", cfg.Telemetry.OTLP.Protocol,
			"sampleRatio", cfg.Telemetry.SampleRatio)
	}

	// Metrics first: the store's recovery counts its resume decisions.
	a.ops = newOps(a.cfg, log)

	// Store: open, end the turns a previous process was cut off in, and
	// feed the engine's history from it.
	sctx, cancel := context.WithTimeout(ctx, startupStoreWait)
	defer cancel()
	a.store, err = openStore(sctx, cfg, log, storeHooks{
		OnHealth: func(err error) {
			if al := a.alerter.Load(); al != nil {
				al.StoreHealth(err)
			}
		},
		// Telegram's replies and notices go into the outbox with the
		// turn's end; the channel claims them after the commit.
		OnOutbox: a.outboxWritten,
	})
	if err != nil {
		return a, err
	}
	if cfg.Cluster.Enabled {
		// A replica: the turns a dead replica (or this one's last life)
		// was running are taken over through the lease table, not here.
		if err := a.joinCluster(sctx, cfg); err != nil {
			return a, err
		}
	} else {
		recoverInterrupted(sctx, a.store, cfg, log, a.ops.metrics.ResumeDecision)
	}
	killLeftoverAgents(cfg, log)

	a.runners = newRunnerSet(log, cfg.Channels.Telegram.Enabled)
	a.runners.sessions = a.store // an ACP conversation resumes its agent session after a restart
	a.runners.probing = true
	a.runners.alertSignIn = func(runner string, problem error) {
		if al := a.alerter.Load(); al != nil {
			al.AgentSignIn(runner, problem)
		}
	}
	if err := a.runners.prepare(cfg); err != nil {
		return a, err
	}
	// While the store cannot write, a turn would leave no trace: refuse new
	// ones (retryable) until it can.
	opts := gateway.Options{Config: a.cfg, Runners: a.runners.engineRunners(), Log: log, History: storeHistory(a.store),
		TurnDetails: storeTurnDetails(a.store), Observer: a.ops.observer(), StuckRuns: a.ops.stuckRuns, Admit: a.store.Health, Queue: storeQueue{a.store, a.cfg}}
	if a.node != nil {
		opts.Cluster = a.node
		if pg, ok := a.store.(*postgres.Store); ok {
			opts.HistoryCheck = storeHistoryCheck{pg}
		}
	}
	opts.Settings = a.store // a session's own busy mode (/queue <mode>), kept across restarts
	a.eng, err = gateway.New(opts)
	if err != nil {
		return a, fmt.Errorf("engine: %w", err)
	}
	// Subscribed before any turn can start, so the store sees every event.
	a.unsub = a.eng.Bus().Subscribe("", a.store.Handle)
	if a.tracer != nil {
		a.unsubTrace = a.eng.Bus().Subscribe("", a.tracer.Handle)
	}
	a.eng.Start(ctx)
	if a.node != nil {
		a.node.Serve(a.eng) // messages and aborts other replicas forward here
	}

	// Channels. The WebSocket protocol serves the OpenClaw clients and the
	// web chat.
	a.ws = ws.NewServer(a.eng, a.cfg, ws.Options{
		Token: cfg.Server.Token, OperatorToken: cfg.Server.OperatorToken,
		Version: "turnguard " + version, Log: log.With("channel", "ws"),
		Resumed: a.store.Resumed, // a resumed turn's notice offers no Retry
	})
	// Telegram, when enabled: it follows the engine's events now; it takes
	// updates from receive on (webhook updates once the router serves
	// /telegram/webhook).
	if a.tg, err = newTelegram(a); err != nil {
		return a, err // "telegram: …"
	}

	if err := a.ops.wire(ctx, a, a.tg.sender()); err != nil {
		return a, fmt.Errorf("operator routes: %w", err)
	}
	if al := a.ops.alerts; al != nil {
		a.alerter.Store(al)
		if err := a.store.Health(); err != nil {
			al.StoreHealth(err) // it failed before the alerter existed
		}
	}

	// The messages queued before the last stop run now: after the
	// interrupted notices (recoverInterrupted), once every subscriber —
	// the channels (Telegram's Retry memory), metrics, alerts — follows the
	// bus, so their TurnStarted reaches everyone, and before any channel
	// takes a new message (Telegram receives below, HTTP listens last), so
	// new messages queue behind them.
	// (A replica restores only the messages of sessions no replica runs:
	// the others' are queued in their memory. Engine.RestoreQueued.)
	restoreQueued(sctx, a.eng, log)
	a.live.Store(a.eng) // takeovers restore their sessions' queued messages from now on
	a.tg.receive(ctx, a)

	// HTTP last: once it listens, everything it serves is ready.
	a.ln, err = server.Listen(ctx, cfg.Server.Listen, cfg.Server.Token)
	if err != nil {
		return a, err
	}
	handler := server.NewRouter(server.Options{
		WebSocket: a.ws,
		Page:      webchat.Handler(),
		Ready:     a.readiness,
		Mount:     func(r chi.Router) { a.ops.mount(r); a.tg.mount(r) },
		Log:       log,
		AllowHost: a.allowHost(cfg.Server.Token),
	})
	a.http = server.HTTPServer(handler, log)
	a.ready.Store(true)
	go func() {
		if err := a.http.Serve(a.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.serveErr <- err
		}
	}()
	if cfgPath != "" {
		a.watchConfig(ctx, cfgPath) // before "listening": an edit after it is seen
	}
	addr := a.ln.Addr().String()
	log.Info("listening", "addr", addr, "url", "http://"+addr+"/", "runner", cfg.RunnerFor(config.ChannelWS),
		"store", storeWhere(cfg), "config", cfg.Sources())

	return a, nil
}

// watchConfig starts hot reload of the file at path and returns once the
// watch is set up (or has failed, which is logged), so that an edit made
// after start returns is never missed.
func (a *app) watchConfig(ctx context.Context, path string) {
	wctx, stop := context.WithCancel(ctx)
	a.stopBG = stop
	watching := make(chan struct{})
	var once sync.Once
	set := func() { once.Do(func() { close(watching) }) }
	hooks := config.ReloadHooks{Prepare: a.prepareConfig, Changed: a.configChanged, Watching: set}
	a.bg.Add(1)
	go func() {
		defer a.bg.Done()
		defer set()
		if err := a.cfg.Watch(wctx, path, a.log, hooks); err != nil {
			a.log.Error("config hot reload is off", "error", err)
		}
	}()
	<-watching
}

// readiness backs /readyz: ready from listening until shutdown starts, and
// not while the store cannot write (new turns are refused then).
func (a *app) readiness() error {
	if !a.ready.Load() {
		return errors.New("shutting down")
	}
	return a.store.Health()
}

// retention is the store's pruning policy from store.retention.*.
func retention(r config.StoreRetention) store.Retention {
	const day = 24 * time.Hour
	return store.Retention{
		History: time.Duration(r.HistoryDays) * day, MaxMessagesPerSession: r.MaxMessagesPerSession,
		Journal: time.Duration(r.JournalDays) * day, Outbox: time.Duration(r.OutboxDays) * day,
		Interval: time.Duration(r.IntervalMinutes) * time.Minute, BatchRows: r.BatchRows,
	}
}

// prepareConfig builds the runners a reloaded configuration needs before it
// is swapped in (a runner it names for the first time, or one whose settings
// changed); if one cannot be built the reload is refused and the current
// configuration stays.
func (a *app) prepareConfig(_, next *config.Config) error {
	return a.runners.prepare(next)
}

// configChanged applies a reloaded configuration to the engine.
func (a *app) configChanged(_, next *config.Config) {
	a.eng.ConfigChanged(next)
}

// shutdown stops the gateway: stop accepting, abort running turns with stop
// reason shutdown (each user gets the shutdown message), wait up to the
// abort grace, close client connections, flush and close the store.
func (a *app) shutdown(ctx context.Context) {
	a.ready.Store(false)
	a.log.Info("shutting down: no new connections; stopping running turns", "live_turns", len(a.eng.Live()))
	hctx, cancel := context.WithTimeout(ctx, httpShutdownWait)
	if err := a.http.Shutdown(hctx); err != nil {
		a.log.Warn("HTTP shutdown", "error", err)
	}
	cancel()

	// No more Telegram updates; the engine bounds its own wait by the runs'
	// abortGraceSeconds, and its shutdown notices reach Telegram in close.
	a.tg.stopReceiving()
	a.eng.Shutdown(ctx)
	a.runners.close() // the agent processes runners keep (acp)

	wctx, cancel := context.WithTimeout(ctx, wsShutdownWait)
	a.ws.Shutdown(wctx)
	cancel()
	a.close()
}

// close stops what start started, in reverse order; it is also the clean-up
// of a failed start.
func (a *app) close() {
	if a.stopBG != nil {
		a.stopBG()
		stopped := make(chan struct{})
		go func() { a.bg.Wait(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(watchShutdownWait):
			// A reload blocked reading the file (a FIFO, a hung mount)
			// must not hold the exit.
			a.log.Warn("config hot reload did not stop in time (a reload is stuck reading the file); exiting without it",
				"waited", watchShutdownWait)
		}
	}
	if a.ln != nil && a.http == nil {
		a.ln.Close()
	}
	if a.eng != nil && a.http == nil {
		a.eng.Shutdown(context.Background())
	}
	a.tg.close(a)
	a.ops.close()
	// The endings of the turns stopped above are recorded: the lease goes
	// back, and survivors take over nothing of this replica.
	a.leaveCluster()
	if a.unsub != nil {
		a.unsub()
	}
	if a.unsubTrace != nil {
		a.unsubTrace()
	}
	if a.tracer != nil {
		// The spans of the turns stopped above are exported, or given up
		// after tracing.ShutdownTimeout.
		if err := a.tracer.Shutdown(context.Background()); err != nil {
			a.log.Warn("tracing: spans still queued at exit were not exported", "error", err)
		}
	}
	if a.store != nil {
		fctx, cancel := context.WithTimeout(context.Background(), storeShutdownWait)
		if err := a.store.Flush(fctx); err != nil {
			a.log.Warn("store: events still queued at exit were not written", "error", err)
		}
		cancel()
		if err := a.store.Close(); err != nil {
			a.log.Warn("store close", "error", err)
		}
	}
}

// killLeftoverAgents kills the exec agents a previous process on the same
// store left running that its shims could not kill (see runner/exec: a
// process tagged with this store's instance id), before any turn starts. It
// runs after store.Open took the store's lock, so no live gateway uses that
// instance; an in-memory store has a random instance per process and nothing
// left over.
func killLeftoverAgents(cfg *config.Config, log *slog.Logger) {
	if cfg.Store.Driver != config.StorePostgres && cfg.Store.Path == ":memory:" {
		return
	}
	n, err := execrunner.KillInstance(execrunner.InstanceID(storeInstance(cfg)))
	switch {
	case err != nil && !errors.Is(err, errors.ErrUnsupported):
		log.Error("cannot look for agent processes left by the last stop", "error", err)
	case n > 0:
		log.Warn("killed agent processes left running by the last stop", "count", n)
	}
}

// storeHistory loads a session's stored history for the engine.
func storeHistory(st store.Reader) gateway.HistoryLoader {
	return func(ctx context.Context, sessionKey string, limit int) ([]gateway.Message, error) {
		msgs, err := st.History(ctx, sessionKey, limit)
		if err != nil {
			return nil, err
		}
		return toEngineHistory(msgs), nil
	}
}

// toEngineHistory is a stored history as the engine keeps it.
func toEngineHistory(msgs []store.Message) []gateway.Message {
	out := make([]gateway.Message, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, gateway.Message{RunID: m.RunID, Role: string(m.Role), Text: m.Text, StopReason: m.StopReason, Time: m.Time})
	}
	return out
}

// storeHistoryCheck lets a replica keep an idle session's cached history
// while the shared store shows no change (gateway.HistoryChecker).
type storeHistoryCheck struct{ st *postgres.Store }

func (c storeHistoryCheck) LoadMarked(ctx context.Context, sessionKey string, limit int) ([]gateway.Message, gateway.HistoryMark, error) {
	msgs, mark, err := c.st.HistoryMarked(ctx, sessionKey, limit)
	if err != nil {
		return nil, gateway.HistoryMark{}, err
	}
	return toEngineHistory(msgs), gateway.HistoryMark(mark), nil
}

func (c storeHistoryCheck) Since(ctx context.Context, sessionKey string, mark gateway.HistoryMark, n int) (gateway.HistorySince, error) {
	got, err := c.st.HistorySince(ctx, sessionKey, postgres.HistoryMark(mark), n)
	if err != nil {
		return gateway.HistorySince{}, err
	}
	out := gateway.HistorySince{Mark: gateway.HistoryMark(got.Mark), BusyMode: got.BusyMode}
	for _, k := range got.Messages {
		out.Messages = append(out.Messages, gateway.HistoryKey{RunID: k.RunID, Role: string(k.Role), StopReason: k.StopReason})
	}
	return out, nil
}

// detailsFlushWait bounds how long a history's turn details wait for the
// recorder's queue.
const detailsFlushWait = time.Second

// storeTurnDetails reads finished turns' steps and settled approvals for
// the engine (store.TurnDetails bounds what it reads). A turn's last events
// may still be in the recorder's queue when a page reloads right after it
// ended: the read waits for them up to detailsFlushWait, then reads anyway.
func storeTurnDetails(st interface {
	store.TurnDetails
	store.Recorder
}) gateway.TurnDetailsLoader {
	return func(ctx context.Context, runIDs []string) (map[string]event.TurnDetail, error) {
		fctx, cancel := context.WithTimeout(ctx, detailsFlushWait)
		_ = st.Flush(fctx) // not flushed in time: what is written is shown
		cancel()
		return st.TurnDetails(ctx, runIDs)
	}
}

// recoverInterrupted ends every turn the previous process was cut off in
// with stop reason "interrupted": the interrupted message goes into the
// session's history and, for channels that deliver from the outbox (all but
// WebSocket, whose clients read the history), into the outbox. The notice
// is enqueued before the turn is marked, so a crash in between loses
// nothing: the turn stays running and the next start's Enqueue is
// deduplicated. MarkInterrupted expires the questions (approvals) the turn
// was waiting on; then every approval still pending has no run left to
// answer it and is expired too. Failures are logged; they do not stop the
// gateway from starting.
//
// With agents.defaults.resume.enabled, a turn that has attempts left is
// dispatched again (resumeTurn): its next attempt is queued durably,
// ahead of the session's waiting messages, before the turn is marked, and
// the turn ends with the resuming notice instead; restoreQueued runs it.
func recoverInterrupted(ctx context.Context, st interface {
	store.Reader
	store.Outbox
	store.ApprovalStore
	resumeStore
}, cfg *config.Config, log *slog.Logger, count func(outcome string)) {
	defer func() {
		if n, err := st.ExpireOrphanApprovals(ctx); err != nil {
			log.Error("store: cannot expire the approvals left pending by the last stop", "error", err)
		} else if n > 0 {
			log.Warn("approvals left pending by the last stop expired", "count", n)
		}
	}()
	turns, err := st.RunningTurns(ctx)
	if err != nil {
		log.Error("store: cannot list turns cut off by the last stop", "error", err)
		return
	}
	msgs := cfg.MessageSet()
	for _, t := range turns {
		text := resumeTurn(ctx, st, cfg, t, interruptedNotice(msgs, t), log, count)
		if t.Channel != config.ChannelWS && t.ChatRef != "" {
			if _, err := st.Enqueue(ctx, store.OutboxMessage{Channel: t.Channel, ChatRef: t.ChatRef, RunID: t.RunID,
				Kind: store.OutboxNotice, Text: text}); err != nil && !errors.Is(err, store.ErrDuplicate) {
				log.Error("store: cannot queue the interrupted notice; the turn stays running until the next start",
					"run", t.RunID, "error", err)
				continue
			}
		}
		won, err := st.MarkInterrupted(ctx, t.RunID, text)
		if err != nil {
			log.Error("store: cannot end an interrupted turn", "run", t.RunID, "error", err)
			continue
		}
		if won {
			log.Warn("turn interrupted by the last stop", "run", t.RunID, "session", t.SessionKey, "channel", t.Channel)
		}
	}
}

// allowHost is the router's DNS rebinding guard: with no token, only
// requests addressed to a local name (server.allowedHosts read at each
// request, so a reload applies).
func (a *app) allowHost(token string) func(*http.Request) bool {
	if token != "" {
		return nil
	}
	return func(r *http.Request) bool { return server.LocalRequest(r, a.cfg.Current().Server.AllowedHosts) }
}
