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
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Source holds the current configuration and swaps in a new one on hot
// reload. Readers call Current when a turn starts and keep that *Config for
// the whole turn, so a reload applies to turns that start afterwards.
// Methods are safe for concurrent use.
type Source struct {
	cur atomic.Pointer[Config]
}

// NewSource returns a Source whose current configuration is c (typically
// the result of Load).
func NewSource(c *Config) *Source {
	s := &Source{}
	s.cur.Store(c)
	return s
}

// Current returns the configuration in force. The *Config must not be
// modified.
func (s *Source) Current() *Config { return s.cur.Load() }

// ReloadDebounce is how long the file must be quiet after a change before it
// is reloaded, so that an editor's burst of events (truncate, write, chmod,
// rename) causes one reload of the finished file.
const ReloadDebounce = 250 * time.Millisecond

// restartOnly are keys a running gateway reads once at startup; a reload
// that changes them is still applied but logs that they need a restart.
var restartOnly = []struct {
	key string
	get func(*Config) any
}{
	{"server.listen", func(c *Config) any { return c.Server.Listen }},
	{"store.path", func(c *Config) any { return c.Store.Path }},
	{"store.queueSize", func(c *Config) any { return c.Store.QueueSize }},
	{"store.retention", func(c *Config) any { return c.Store.Retention }},
	{"channels.telegram.enabled", func(c *Config) any { return c.Channels.Telegram.Enabled }},
	{"channels.telegram.token", func(c *Config) any { return c.Channels.Telegram.Token }},
	{"channels.telegram.mode", func(c *Config) any { return c.Channels.Telegram.Mode }},
	{"channels.telegram.apiURL", func(c *Config) any { return c.Channels.Telegram.APIURL }},
	{"channels.telegram.webhookURL", func(c *Config) any { return c.Channels.Telegram.WebhookURL }},
}

// Watch reloads the file at path when it changes, until ctx is done; it
// then returns nil.
//
// Watch watches the file's directory, so an editor that writes a new file
// and renames it over the old one is seen. After a change it waits for
// ReloadDebounce of quiet, reads the file and, unless its content is the same
// as at the previous reload, loads it as Load does (defaults, file,
// environment); the first event after Watch starts always reloads, so an
// edit made between Load and Watch is not missed. A
// valid configuration is swapped in atomically and onChange (if not nil) is
// called with the old and the new one, on Watch's goroutine; an invalid one
// is logged with its named-key error (which never contains a secret) and
// the current configuration stays. A nil log means slog.Default().
//
// Watch returns an error only if the watch cannot be set up or the watcher
// fails for good.
func (s *Source) Watch(ctx context.Context, path string, log *slog.Logger, onChange func(old, new *Config)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("config watch %s: %w", path, err)
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(path)); err != nil {
		return fmt.Errorf("config watch %s: %w", path, err)
	}
	r := newReloader(s, path, log, onChange)
	return r.run(ctx, w.Events, w.Errors)
}

type reloader struct {
	src      *Source
	path     string
	log      *slog.Logger
	onChange func(old, new *Config)
	last     [sha256.Size]byte // of the content last loaded or rejected; zero at first
}

func newReloader(s *Source, path string, log *slog.Logger, onChange func(old, new *Config)) *reloader {
	if log == nil {
		log = slog.Default()
	}
	return &reloader{src: s, path: path, log: log, onChange: onChange}
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
	old := r.src.cur.Swap(next)
	r.log.Info("config reloaded; new turns use it", "file", r.path)
	if old != nil {
		for _, k := range restartOnly {
			if k.get(old) != k.get(next) {
				r.log.Warn("config key changed that takes effect only after a restart", "key", k.key)
			}
		}
	}
	if r.onChange != nil {
		r.onChange(old, next)
	}
}

// bytesProvider is a koanf.Provider of YAML bytes already read.
type bytesProvider []byte

func (b bytesProvider) ReadBytes() ([]byte, error) { return b, nil }

func (bytesProvider) Read() (map[string]any, error) {
	return nil, errors.New("bytesProvider: use ReadBytes")
}
