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

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/gateway/messages"
	"github.com/turnguard/turnguard/gateway/server"
	"github.com/turnguard/turnguard/gateway/web"
	"github.com/turnguard/turnguard/gateway/ws"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
	execrunner "github.com/turnguard/turnguard/runner/exec"
	"github.com/turnguard/turnguard/runner/openai"
	"github.com/turnguard/turnguard/store"
)

// Bounds of the shutdown steps that do not have a configured limit.
const (
	httpShutdownWait  = 5 * time.Second  // in-flight plain HTTP requests
	wsShutdownWait    = 5 * time.Second  // flushing and closing WebSocket clients
	storeShutdownWait = 10 * time.Second // writing the events still queued
	startupStoreWait  = 30 * time.Second // opening and recovering the store
)

// app is a running gateway: every component, in start order.
type app struct {
	log     *slog.Logger
	cfg     *config.Source
	store   *store.SQLite
	eng     *gateway.Engine
	ws      *ws.Server
	http    *http.Server
	ln      net.Listener
	ready   atomic.Bool
	unsub   func()
	stopBG  context.CancelFunc // config watcher
	bg      sync.WaitGroup
	runners map[string]bool // names built at start
	ops     *ops            // metrics, alerts, /api, /admin (ops.go)
	tg      *tgChannel      // the Telegram bot, when enabled (telegram.go)

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

	// Store: open, end the turns a previous process was cut off in, and
	// feed the engine's history from it.
	sctx, cancel := context.WithTimeout(ctx, startupStoreWait)
	defer cancel()
	a.store, err = store.Open(sctx, cfg.Store.Path, store.Options{QueueSize: cfg.Store.QueueSize, Logger: log})
	if err != nil {
		return a, err
	}
	recoverInterrupted(sctx, a.store, cfg, log)
	killLeftoverAgents(cfg, log)

	runners, err := buildRunners(cfg, log)
	if err != nil {
		return a, err
	}
	a.runners = map[string]bool{}
	for name := range runners {
		a.runners[name] = true
	}
	a.ops = newOps(a.cfg, log)
	a.eng, err = gateway.New(gateway.Options{Config: a.cfg, Runners: runners, Log: log, History: storeHistory(a.store), Observer: a.ops.observer()})
	if err != nil {
		return a, fmt.Errorf("engine: %w", err)
	}
	// Subscribed before any turn can start, so the store sees every event.
	a.unsub = a.eng.Bus().Subscribe("", a.store.Handle)
	a.eng.Start(ctx)

	// Channels. The WebSocket protocol serves the OpenClaw clients and the
	// web chat.
	a.ws = ws.NewServer(a.eng, a.cfg, ws.Options{
		Token: cfg.Server.Token, OperatorToken: cfg.Server.OperatorToken,
		Version: "turnguard " + version, Log: log.With("channel", "ws"),
	})
	// Telegram, when enabled: polling starts now; webhook updates are
	// accepted once the router serves /telegram/webhook.
	if a.tg, err = startTelegram(ctx, a); err != nil {
		return a, err // "telegram: …"
	}

	if err := a.ops.wire(ctx, a, a.tg.sender()); err != nil {
		return a, fmt.Errorf("operator routes: %w", err)
	}

	// HTTP last: once it listens, everything it serves is ready.
	a.ln, err = server.Listen(ctx, cfg.Server.Listen, cfg.Server.Token)
	if err != nil {
		return a, err
	}
	handler := server.NewRouter(server.Options{
		WebSocket: a.ws,
		Page:      web.Handler(),
		Ready:     a.readiness,
		Mount:     func(r chi.Router) { a.ops.mount(r); a.tg.mount(r) },
		Log:       log,
	})
	a.http = server.HTTPServer(handler, log)
	a.ready.Store(true)
	go func() {
		if err := a.http.Serve(a.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.serveErr <- err
		}
	}()
	addr := a.ln.Addr().String()
	log.Info("listening", "addr", addr, "url", "http://"+addr+"/", "runner", cfg.RunnerFor(config.ChannelWS),
		"store", cfg.Store.Path, "config", cfgOrDefaults(cfgPath))

	if cfgPath != "" {
		wctx, stop := context.WithCancel(ctx)
		a.stopBG = stop
		a.bg.Add(1)
		go func() {
			defer a.bg.Done()
			if err := a.cfg.Watch(wctx, cfgPath, log, a.configChanged); err != nil {
				log.Error("config hot reload is off", "error", err)
			}
		}()
	}
	return a, nil
}

func cfgOrDefaults(p string) string {
	if p == "" {
		return "(built-in defaults)"
	}
	return p
}

// readiness backs /readyz: ready from listening until shutdown starts.
func (a *app) readiness() error {
	if !a.ready.Load() {
		return errors.New("shutting down")
	}
	return nil
}

// configChanged applies a reloaded configuration to the engine. A runner the
// new configuration names but that was not built at start needs a restart.
func (a *app) configChanged(_, next *config.Config) {
	a.eng.ConfigChanged(next)
	for _, name := range usedRunners(next) {
		if !a.runners[name] {
			a.log.Warn("the reloaded configuration uses a runner that is built only at start; restart the gateway to use it",
				"runner", name)
		}
	}
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
		a.bg.Wait()
	}
	if a.ln != nil && a.http == nil {
		a.ln.Close()
	}
	if a.eng != nil && a.http == nil {
		a.eng.Shutdown(context.Background())
	}
	a.tg.close(a)
	a.ops.close()
	if a.unsub != nil {
		a.unsub()
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

// usedRunners lists the runner names a configuration uses:
// agents.defaults.runner and each enabled channel's override.
func usedRunners(cfg *config.Config) []string {
	names := []string{cfg.Agents.Defaults.Runner, cfg.RunnerFor(config.ChannelWS)}
	if cfg.Channels.Telegram.Enabled {
		names = append(names, cfg.RunnerFor(config.ChannelTelegram))
	}
	return names
}

// buildRunners constructs each runner the configuration uses, and only
// those: openai needs a model and exec a command, which a demo set-up does
// not have.
func buildRunners(cfg *config.Config, log *slog.Logger) (map[string]runner.Runner, error) {
	out := map[string]runner.Runner{}
	grace := max(cfg.TurnSettings(config.ChannelWS, 0).AbortGrace, cfg.TurnSettings(config.ChannelTelegram, 0).AbortGrace)
	for _, name := range usedRunners(cfg) {
		if _, ok := out[name]; ok {
			continue
		}
		switch name {
		case config.RunnerDemo:
			// A stuck step outlasts the abort grace (the turn is force-finalized)
			// and then gives up, so it cannot pile up goroutines.
			out[name] = demo.New(demo.WithStuckFor(grace + 5*time.Second))
		case config.RunnerOpenAI:
			r, err := openai.New(cfg.Agents.OpenAI, openai.WithLogger(log.With("runner", name)))
			if err != nil {
				return nil, fmt.Errorf("runner openai: %w", err)
			}
			out[name] = r
		case config.RunnerExec:
			r, err := execrunner.New(cfg.Agents.Exec, grace, log.With("runner", name),
				execrunner.WithInstance(execrunner.InstanceID(cfg.Store.Path)))
			if err != nil {
				return nil, fmt.Errorf("runner exec: %w", err)
			}
			out[name] = r
		default:
			return nil, fmt.Errorf("unknown runner %q", name)
		}
	}
	return out, nil
}

// killLeftoverAgents kills the exec agents a previous process on the same
// store left running that its shims could not kill (see runner/exec: a
// process tagged with this store's instance id), before any turn starts.
func killLeftoverAgents(cfg *config.Config, log *slog.Logger) {
	n, err := execrunner.KillInstance(execrunner.InstanceID(cfg.Store.Path))
	switch {
	case err != nil && !errors.Is(err, errors.ErrUnsupported):
		log.Error("cannot look for agent processes left by the last stop", "error", err)
	case n > 0:
		log.Warn("killed agent processes left running by the last stop", "count", n)
	}
}

// storeHistory loads a session's stored history for the engine.
func storeHistory(st *store.SQLite) gateway.HistoryLoader {
	return func(ctx context.Context, sessionKey string, limit int) ([]gateway.Message, error) {
		msgs, err := st.History(ctx, sessionKey, limit)
		if err != nil {
			return nil, err
		}
		out := make([]gateway.Message, 0, len(msgs))
		for _, m := range msgs {
			out = append(out, gateway.Message{Role: string(m.Role), Text: m.Text, StopReason: m.StopReason, Time: m.Time})
		}
		return out, nil
	}
}

// recoverInterrupted ends every turn the previous process was cut off in
// with stop reason "interrupted": the interrupted message goes into the
// session's history and, for channels that deliver from the outbox (all but
// WebSocket, whose clients read the history), into the outbox. The notice
// is enqueued before the turn is marked, so a crash in between loses
// nothing: the turn stays running and the next start's Enqueue is
// deduplicated. Failures are logged; they do not stop the gateway from
// starting.
func recoverInterrupted(ctx context.Context, st *store.SQLite, cfg *config.Config, log *slog.Logger) {
	turns, err := st.RunningTurns(ctx)
	if err != nil {
		log.Error("store: cannot list turns cut off by the last stop", "error", err)
		return
	}
	msgs := cfg.MessageSet()
	for _, t := range turns {
		text := msgs.Render(messages.Interrupted, messages.Fields{
			Elapsed:     messages.Duration(t.UpdatedAt.Sub(t.StartedAt)),
			LastStep:    t.LastStep.Label(),
			CurrentStep: t.CurrentStep.Label(),
		})
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
