package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/ops/admin"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/acp"
	"github.com/turnguard/turnguard/runner/demo"
	execrunner "github.com/turnguard/turnguard/runner/exec"
	"github.com/turnguard/turnguard/runner/openai"
)

// runnerSet gives the engine one runner per name (demo, openai, exec, acp) for
// the life of the process and builds what each configuration needs: at
// start, and on hot reload before the new configuration is swapped in, so a
// reload never names a runner that does not exist. A runner whose settings
// changed is rebuilt; turns already running keep the runner they started on.
type runnerSet struct {
	log      *slog.Logger
	sessions acp.SessionStore // where the acp runner keeps the conversations' agent sessions (nil: nowhere)
	telegram bool             // the process started with Telegram: it runs until a restart
	mu       sync.Mutex       // serializes prepare
	slots    map[string]*runnerSlot

	// probing: probe each runner built that can be (set by the app; off in
	// tests of the set, which must not reach a real provider).
	probing bool
	// alertSignIn, set by the app (nil: no alert), raises and closes the
	// operator alert of an ACP agent that needs a sign-in (ops/alerts
	// AgentSignIn); the runner's health shows it too (signIn).
	alertSignIn func(runner string, problem error)
	healthMu    sync.Mutex
	health      map[string]admin.RunnerHealth // the last probe of each runner that can be probed, or its sign-in state
	probes      sync.WaitGroup                // probes under way
}

// probeTimeout bounds one runner probe (runner.Prober).
const probeTimeout = 5 * time.Second

// runnerSlot is the engine's runner for one name: it delegates each Run to
// the runner built last.
type runnerSlot struct {
	name  string
	built atomic.Pointer[builtRunner]
}

// builtRunner is a runner and the settings it was built from.
type builtRunner struct {
	r    runner.Runner
	spec any // compared with reflect.DeepEqual to decide on a rebuild
}

// newRunnerSet makes the set; telegram is whether the process started with
// channels.telegram.enabled (disabling it takes a restart, so until then
// every configuration's Telegram runner is used).
func newRunnerSet(log *slog.Logger, telegram bool) *runnerSet {
	s := &runnerSet{log: log, telegram: telegram, slots: map[string]*runnerSlot{}}
	for _, name := range []string{config.RunnerDemo, config.RunnerOpenAI, config.RunnerExec, config.RunnerACP} {
		s.slots[name] = &runnerSlot{name: name}
	}
	return s
}

// engineRunners is the map for gateway.Options.Runners.
func (s *runnerSet) engineRunners() map[string]runner.Runner {
	out := make(map[string]runner.Runner, len(s.slots))
	for name, slot := range s.slots {
		out[name] = slot
	}
	return out
}

// prepare builds each runner cfg uses that is not built yet or whose
// settings differ from the ones it was built with. Either every build
// succeeds and all are installed, or nothing changes and the error names the
// runner and the key at fault.
func (s *runnerSet) prepare(cfg *config.Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	fresh := map[string]*builtRunner{}
	used := usedRunners(cfg, s.telegram)
	// config's validation requires the openai model only for the channels
	// it enables; Telegram also runs while a reload has disabled it.
	if s.telegram && !cfg.Channels.Telegram.Enabled && cfg.RunnerFor(config.ChannelTelegram) == config.RunnerOpenAI &&
		strings.TrimSpace(cfg.Agents.OpenAI.Model) == "" {
		return fmt.Errorf("agents.openai.model: is required when the openai runner is used (channels.telegram.runner; Telegram runs until a restart)")
	}
	for _, name := range used {
		slot, ok := s.slots[name]
		if !ok {
			return fmt.Errorf("unknown runner %q", name)
		}
		if _, done := fresh[name]; done {
			continue
		}
		spec := runnerSpec(name, cfg)
		if b := slot.built.Load(); b != nil && reflect.DeepEqual(b.spec, spec) {
			continue
		}
		r, err := buildRunner(name, cfg, s.log, s.sessions, s.signIn(name))
		if err != nil {
			return err
		}
		fresh[name] = &builtRunner{r: r, spec: spec}
	}
	for name, b := range fresh {
		s.probe(name, b.r)
		old := s.slots[name].built.Swap(b)
		s.log.Debug("runner built", "runner", name, "rebuilt", old != nil)
		// A runner that keeps processes (acp) lets them go once the turns
		// still running on it end.
		if r, ok := old.runner().(interface{ Retire() }); ok {
			r.Retire()
		}
	}
	return nil
}

// probe checks r aside when it can be probed (runner.Prober: the openai
// runner asks its provider), within probeTimeout: start-up and reloads do
// not wait for it. A failure is logged as a warning and, like a success,
// kept for /api/diagnose.
func (s *runnerSet) probe(name string, r runner.Runner) {
	p, ok := r.(runner.Prober)
	if !ok || !s.probing {
		return
	}
	s.probes.Add(1)
	go func() {
		defer s.probes.Done()
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		err := p.Probe(ctx)
		h := admin.RunnerHealth{Runner: name, OK: err == nil, CheckedAt: time.Now().UTC()}
		if err != nil {
			h.Problem = err.Error()
			s.log.Warn("runner cannot work: turns on it will fail until this is fixed", "runner", name, "problem", h.Problem)
		}
		s.healthMu.Lock()
		defer s.healthMu.Unlock()
		if s.health == nil {
			s.health = map[string]admin.RunnerHealth{}
		}
		s.health[name] = h
	}()
}

// signIn is runner name's acp.WithSignInAlert: a problem (the agent needs
// the operator to sign it in) makes the runner's health failing with it,
// for /api/diagnose and the dashboard, and raises the operator alert; nil
// (a prompt succeeded) makes it healthy again and closes the alert.
func (s *runnerSet) signIn(name string) func(problem error) {
	return func(problem error) {
		h := admin.RunnerHealth{Runner: name, OK: problem == nil, CheckedAt: time.Now().UTC()}
		if problem != nil {
			h.Problem = problem.Error()
		}
		s.healthMu.Lock()
		if s.health == nil {
			s.health = map[string]admin.RunnerHealth{}
		}
		s.health[name] = h
		s.healthMu.Unlock()
		if s.alertSignIn != nil {
			s.alertSignIn(name, problem)
		}
	}
}

// healthOf lists the last probe of each probed runner, by name.
func (s *runnerSet) healthOf() []admin.RunnerHealth {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	out := make([]admin.RunnerHealth, 0, len(s.health))
	for _, name := range slices.Sorted(maps.Keys(s.health)) {
		out = append(out, s.health[name])
	}
	return out
}

// runner is b's runner; nil for a nil b.
func (b *builtRunner) runner() runner.Runner {
	if b == nil {
		return nil
	}
	return b.r
}

// close stops the processes of the runners that keep some (acp: its agent
// process); turns still running on them end. For shutdown, after the
// engine's.
func (s *runnerSet) close() {
	for name, slot := range s.slots {
		if c, ok := slot.built.Load().runner().(interface{ Close() error }); ok {
			if err := c.Close(); err != nil {
				s.log.Warn("runner close", "runner", name, "err", err)
			}
		}
	}
}

// built reports whether the runner name has been built.
func (s *runnerSet) built(name string) bool {
	slot, ok := s.slots[name]
	return ok && slot.built.Load() != nil
}

// Run runs the turn on the runner built last.
func (r *runnerSlot) Run(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
	b := r.built.Load()
	if b == nil {
		// Not reachable through a validated configuration: prepare builds
		// every runner a configuration names before it is used.
		return runner.Result{}, fmt.Errorf("runner %s is not configured", r.name)
	}
	return b.r.Run(ctx, turn, cb)
}

// Unwrap returns the runner built last (nil before one is built): the
// engine's RunnerOf asks it, not the slot, what it knows beyond turns (an
// ACP agent's commands, modes, settings and sessions for /help, /mode,
// /status and Telegram's command menu).
func (r *runnerSlot) Unwrap() runner.Runner {
	if b := r.built.Load(); b != nil {
		return b.r
	}
	return nil
}

var _ runner.Wrapper = (*runnerSlot)(nil)

// Steers reports whether the runner built last reads Turn.Inbox (busy mode
// steer): the engine asks the runner it holds, which is this slot.
func (r *runnerSlot) Steers() bool {
	b := r.built.Load()
	if b == nil {
		return false
	}
	st, ok := b.r.(runner.Steerer)
	return ok && st.Steers()
}

var _ runner.Steerer = (*runnerSlot)(nil)

// runnerSpec is what a runner is built from: a change of it rebuilds.
func runnerSpec(name string, cfg *config.Config) any {
	switch name {
	case config.RunnerOpenAI:
		return cfg.Agents.OpenAI
	case config.RunnerExec:
		return struct {
			Exec  config.Exec
			Grace time.Duration
		}{cfg.Agents.Exec, execGrace(cfg)}
	case config.RunnerACP:
		return struct {
			ACP   config.ACP
			Grace time.Duration
		}{cfg.Agents.ACP, execGrace(cfg)}
	}
	return struct {
		Name  string
		Grace time.Duration
	}{name, execGrace(cfg)} // demo: its stuck bound follows the grace
}

// usedRunners lists the runner names a configuration uses:
// agents.defaults.runner and each enabled channel's override. Telegram
// counts as enabled when telegramStarted (the process started with it: it
// stops only on a restart), whatever cfg says.
func usedRunners(cfg *config.Config, telegramStarted bool) []string {
	names := []string{cfg.Agents.Defaults.Runner, cfg.RunnerFor(config.ChannelWS)}
	if cfg.Channels.Telegram.Enabled || telegramStarted {
		names = append(names, cfg.RunnerFor(config.ChannelTelegram))
	}
	return names
}

// execGrace is how long an aborted exec command has between SIGTERM and
// SIGKILL: the longer of the channels' abort graces.
func execGrace(cfg *config.Config) time.Duration {
	return max(cfg.TurnSettings(config.ChannelWS, 0).AbortGrace, cfg.TurnSettings(config.ChannelTelegram, 0).AbortGrace)
}

// buildRunner constructs one runner: openai needs a model, exec and acp a
// command, which a demo set-up does not have. sessions is where acp keeps
// the conversations' agent sessions (nil: nowhere); signIn is told of the
// acp agent's sign-in state (acp.WithSignInAlert).
func buildRunner(name string, cfg *config.Config, log *slog.Logger, sessions acp.SessionStore, signIn func(error)) (runner.Runner, error) {
	switch name {
	case config.RunnerDemo:
		// A stuck step outlasts the abort grace (the turn is force-finalized)
		// and then gives up, so it cannot pile up goroutines.
		return demo.New(demo.WithStuckFor(execGrace(cfg) + 5*time.Second)), nil
	case config.RunnerOpenAI:
		r, err := openai.New(cfg.Agents.OpenAI, openai.WithLogger(log.With("runner", name)))
		if err != nil {
			return nil, fmt.Errorf("runner openai: %w", err)
		}
		return r, nil
	case config.RunnerExec:
		r, err := execrunner.New(cfg.Agents.Exec, execGrace(cfg), log.With("runner", name),
			execrunner.WithInstance(execrunner.InstanceID(storeInstance(cfg))))
		if err != nil {
			return nil, fmt.Errorf("runner exec: %w", err)
		}
		return r, nil
	case config.RunnerACP:
		opts := []acp.Option{acp.WithInstance(execrunner.InstanceID(storeInstance(cfg))), acp.WithVersion(version), acp.WithSignInAlert(signIn)}
		if sessions != nil {
			opts = append(opts, acp.WithSessions(sessions))
		}
		r, err := acp.New(cfg.Agents.ACP, execGrace(cfg), log.With("runner", name), opts...)
		if err != nil {
			return nil, fmt.Errorf("runner acp: %w", err)
		}
		return r, nil
	}
	return nil, fmt.Errorf("unknown runner %q", name)
}
