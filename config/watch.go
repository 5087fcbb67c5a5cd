package config

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Source holds the current configuration and swaps in a new one on hot
// reload. Readers call Current when a turn starts and keep that *Config for
// the whole turn, so a reload applies to turns that start afterwards.
// Methods are safe for concurrent use.
type Source struct {
	cur  atomic.Pointer[Config]
	boot *Config // the configuration the process started with: its restart-only keys are in force
}

// NewSource returns a Source whose current configuration is c (typically
// the result of Load). c's restart-only keys (RestartPending) are taken to
// be the ones in force for the life of the process.
func NewSource(c *Config) *Source {
	s := &Source{boot: c}
	s.cur.Store(c)
	return s
}

// Current returns the configuration in force. The *Config must not be
// modified.
func (s *Source) Current() *Config { return s.cur.Load() }

// Swap makes c the configuration in force, as a hot reload that passed
// validation does, without a file or the reload hooks: for code that builds
// its configuration itself, and for tests that reload inside a
// testing/synctest bubble (Watch's file watcher cannot run there). c must be
// valid (Validate) and must not be modified afterwards.
func (s *Source) Swap(c *Config) { s.cur.Store(c) }

// RestartPending lists the keys of next that a running gateway reads only at
// start and whose value differs from the one the process started with: they
// take effect only after a restart. Values are compared, never shown
// (several are secrets).
func (s *Source) RestartPending(next *Config) []string {
	if s.boot == nil || next == nil {
		return nil
	}
	var keys []string
	for _, k := range restartOnly {
		if k.get(s.boot) != k.get(next) {
			keys = append(keys, k.key)
		}
	}
	return keys
}

// ReloadDebounce is how long the file must be quiet after a change before it
// is reloaded, so that an editor's burst of events (truncate, write, chmod,
// rename) causes one reload of the finished file.
const ReloadDebounce = 250 * time.Millisecond

// restartOnly are keys a running gateway reads once at startup: the
// listener, the tokens the WebSocket server and the operator routes were
// built with, the store, the cluster, telemetry and the Telegram channel. A reload that changes
// them applies everything else and names them as needing a restart.
var restartOnly = []struct {
	key string
	get func(*Config) any
}{
	{"server.listen", func(c *Config) any { return c.Server.Listen }},
	{"server.token", func(c *Config) any { return c.Server.Token }},
	{"server.operatorToken", func(c *Config) any { return c.Server.OperatorToken }},
	{"store.driver", func(c *Config) any { return c.Store.Driver }},
	{"store.path", func(c *Config) any { return c.Store.Path }},
	{"store.url", func(c *Config) any { return c.Store.URL }},
	{"store.queueSize", func(c *Config) any { return c.Store.QueueSize }},
	{"store.retention", func(c *Config) any { return c.Store.Retention }},
	{"cluster.enabled", func(c *Config) any { return c.Cluster.Enabled }},
	{"cluster.replicaID", func(c *Config) any { return c.Cluster.ReplicaID }},
	{"cluster.leaseSeconds", func(c *Config) any { return c.Cluster.LeaseSeconds }},
	{"cluster.nats.urls", func(c *Config) any { return strings.Join(c.Cluster.NATS.URLs, " ") }},
	{"cluster.secret", func(c *Config) any { return c.Cluster.Secret }},
	{"cluster.secretFile", func(c *Config) any { return c.Cluster.SecretFile }},
	{"cluster.nats.credsFile", func(c *Config) any { return c.Cluster.NATS.CredsFile }},
	{"cluster.nats.nkeySeedFile", func(c *Config) any { return c.Cluster.NATS.NKeySeedFile }},
	{"cluster.nats.user", func(c *Config) any { return c.Cluster.NATS.User }},
	{"cluster.nats.password", func(c *Config) any { return c.Cluster.NATS.Password }},
	{"cluster.nats.tls", func(c *Config) any { return c.Cluster.NATS.TLS }},
	{"cluster.nats.insecureTrustedNetwork", func(c *Config) any { return c.Cluster.NATS.InsecureTrustedNetwork }},
	{"telemetry.serviceName", func(c *Config) any { return c.Telemetry.ServiceName }},
	{"telemetry.sampleRatio", func(c *Config) any { return c.Telemetry.SampleRatio }},
	{"telemetry.otlp", func(c *Config) any { return fmt.Sprint(c.Telemetry.OTLP) }},
	{"channels.telegram.enabled", func(c *Config) any { return c.Channels.Telegram.Enabled }},
	{"channels.telegram.token", func(c *Config) any { return c.Channels.Telegram.Token }},
	{"channels.telegram.mode", func(c *Config) any { return c.Channels.Telegram.Mode }},
	{"channels.telegram.apiURL", func(c *Config) any { return c.Channels.Telegram.APIURL }},
	{"channels.telegram.webhookURL", func(c *Config) any { return c.Channels.Telegram.WebhookURL }},
	{"channels.telegram.webhookSecret", func(c *Config) any { return c.Channels.Telegram.WebhookSecret }},
}

// ReloadHooks are what Watch calls around swapping in a new configuration.
// Both are optional and run on Watch's goroutine.
type ReloadHooks struct {
	// Prepare gets a valid new configuration before it is swapped in, to
	// build what it needs (a runner it names); an error refuses the reload:
	// it is logged and the current configuration stays.
	Prepare func(old, next *Config) error
	// Changed is called after the swap with the old and the new
	// configuration.
	Changed func(old, next *Config)
	// Watching is called once the watch is set up: every change of the
	// file from then on is seen.
	Watching func()
}

// Watch reloads the file at path when it changes, until ctx is done; it
// then returns nil.
//
// Watch watches the file's directory, so an editor that writes a new file
// and renames it over the old one is seen. After a change it waits for
// ReloadDebounce of quiet, reads the file and, unless its content is the same
// as at the previous reload, loads it as Load does (defaults, file,
// environment); the first event after Watch starts always reloads, so an
// edit made between Load and Watch is not missed. A valid configuration is
// passed to hooks.Prepare, then swapped in atomically, then passed to
// hooks.Changed; an invalid one, or one Prepare refuses, is logged with its
// named-key error (which never contains a secret) and the current
// configuration stays. A reload Prepare refused is tried again at the next
// event for the file, even with the same content. The log line of a swap says "config reloaded" only
// when every changed key applied; otherwise it names the keys that need a
// restart (RestartPending). A nil log means slog.Default().
//
// Watch returns an error only if the watch cannot be set up or the watcher
// fails for good.
func (s *Source) Watch(ctx context.Context, path string, log *slog.Logger, hooks ReloadHooks) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("config watch %s: %w", path, err)
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(path)); err != nil {
		return fmt.Errorf("config watch %s: %w", path, err)
	}
	if hooks.Watching != nil {
		hooks.Watching()
	}
	r := newReloader(s, path, log, hooks)
	return r.run(ctx, w.Events, w.Errors)
}

type reloader struct {
	src   *Source
	path  string
	log   *slog.Logger
	hooks ReloadHooks
	last  [sha256.Size]byte // of the content last loaded or found invalid; zero at first and after Prepare refused
}

func newReloader(s *Source, path string, log *slog.Logger, hooks ReloadHooks) *reloader {
	if log == nil {
		log = slog.Default()
	}
	return &reloader{src: s, path: path, log: log, hooks: hooks}
}

// run debounces file events and reloads; it is separate from Watch so the
// timing is tested with synthetic events under synctest.
func (r *reloader) run(ctx context.Context, events <-chan fsnotify.Event, errs <-chan error) error {
	base := filepath.Base(r.path)
	timer := time.NewTimer(ReloadDebounce)
	timer.Stop()
	defer timer.Stop()
	var fire <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return fmt.Errorf("config watch %s: the file watcher stopped", r.path)
			}
			if filepath.Base(ev.Name) != base {
				continue
			}
			timer.Reset(ReloadDebounce)
			fire = timer.C
		case err, ok := <-errs:
			if !ok {
				return fmt.Errorf("config watch %s: the file watcher stopped", r.path)
			}
			r.log.Warn("config watch error", "file", r.path, "error", err)
		case <-fire:
			fire = nil
			r.reload()
		}
	}
}

// reload loads the file if its content changed and swaps it in if valid.
func (r *reloader) reload() {
	b, err := os.ReadFile(r.path)
	if err != nil {
		r.log.Warn("config file unreadable; keeping the current configuration", "file", r.path, "error", err)
		return
	}
	sum := sha256.Sum256(b)
	if bytes.Equal(sum[:], r.last[:]) {
		return
	}
	r.last = sum
	next, err := load(r.path, bytesProvider(b), os.Environ())
	if err != nil {
		r.log.Error("config reload rejected; keeping the current configuration", "file", r.path, "error", err)
		return
	}
	old := r.src.Current()
	if r.hooks.Prepare != nil {
		if err := r.hooks.Prepare(old, next); err != nil {
			// Prepare may fail for the world, not the content (a command
			// not installed yet): the next event retries, even unchanged.
			r.last = [sha256.Size]byte{}
			r.log.Error("config reload refused; keeping the current configuration", "file", r.path, "error", err)
			return
		}
	}
	r.src.cur.Store(next)
	changed := strings.Join(Changed(old, next), ", ")
	if changed == "" {
		changed = "(no value)"
	}
	if pending := r.src.RestartPending(next); len(pending) > 0 {
		r.log.Warn("config applied except "+strings.Join(pending, ", ")+
			": needs a restart to take effect; new turns use the other changes", "file", r.path, "needs_restart", strings.Join(pending, ","),
			"changed", changed)
	} else {
		r.log.Info("config reloaded; new turns use it", "file", r.path, "changed", changed)
	}
	for _, w := range next.Warnings() {
		r.log.Warn("config: a value is not used as written", "key", w.Key, "warning", w.Text)
	}
	if r.hooks.Changed != nil {
		r.hooks.Changed(old, next)
	}
}

// bytesProvider is a koanf.Provider of YAML bytes already read.
type bytesProvider []byte

func (b bytesProvider) ReadBytes() ([]byte, error) { return b, nil }

func (bytesProvider) Read() (map[string]any, error) {
	return nil, errors.New("bytesProvider: use ReadBytes")
}
