package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/turnguard/turnguard/internal/faketime"

	"github.com/turnguard/turnguard/internal/testlog"
)

type logBuffer = testlog.Buffer

func loggerTo(l *logBuffer) *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func historyConfig(n string) string { return "server:\n  historyLimit: " + n + "\n" }

// historySource writes historyConfig("10") to a fresh turnguard.yaml and
// returns its path and a Source loaded from it.
func historySource(t *testing.T) (string, *Source) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "turnguard.yaml")
	writeFile(t, path, historyConfig("10"))
	return path, NewSource(mustLoad(t, path))
}

// TestReloadDebounce drives the reload loop with synthetic file events under
// fake time: a burst causes one reload ReloadDebounce after its last event;
// other files, unchanged content and invalid content change nothing.
func TestReloadDebounce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "turnguard.yaml")
		writeFile(t, path, historyConfig("10"))
		src := NewSource(mustLoad(t, path))
		var logs logBuffer
		changes := make(chan [2]*Config, 10)
		r := newReloader(src, path, loggerTo(&logs), ReloadHooks{Changed: func(old, new *Config) { changes <- [2]*Config{old, new} }})
		events := make(chan fsnotify.Event)
		errs := make(chan error)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- r.run(ctx, events, errs) }()

		limit := func() int { return src.Current().Server.HistoryLimit }
		event := func(name string, op fsnotify.Op) { events <- fsnotify.Event{Name: name, Op: op} }

		// A burst of five events 100 ms apart.
		first := src.Current()
		writeFile(t, path, historyConfig("20"))
		for range 5 {
			event(path, fsnotify.Write)
			faketime.Advance(100 * time.Millisecond)
		}
		faketime.Advance(ReloadDebounce - 100*time.Millisecond - time.Millisecond)
		synctest.Wait()
		if limit() != 10 || len(changes) != 0 {
			t.Fatalf("reloaded %v after the last event, before the debounce elapsed", ReloadDebounce-time.Millisecond)
		}
		faketime.Advance(time.Millisecond)
		synctest.Wait()
		if limit() != 20 || len(changes) != 1 {
			t.Fatalf("after the debounce: historyLimit %d, %d changes; want 20, 1", limit(), len(changes))
		}
		if ch := <-changes; ch[0] != first || ch[1] != src.Current() {
			t.Error("onChange did not get (old, new)")
		}

		// Events for other files in the directory are ignored.
		writeFile(t, path, historyConfig("30"))
		event(filepath.Join(dir, "turnguard.db-wal"), fsnotify.Write)
		faketime.Advance(time.Minute)
		synctest.Wait()
		eq(t, "after an unrelated event", limit(), 20)

		// A chmod or touch with the same content is not a change.
		writeFile(t, path, historyConfig("20"))
		event(path, fsnotify.Chmod)
		faketime.Advance(time.Minute)
		synctest.Wait()
		eq(t, "changes after an unchanged file", len(changes), 0)

		// Invalid content is logged with the named key, never the secret,
		// and the current config stays.
		writeFile(t, path, "server:\n  token: zzsecret-token\n  lisen: x\n")
		event(path, fsnotify.Write)
		faketime.Advance(time.Minute)
		synctest.Wait()
		eq(t, "after an invalid edit", limit(), 20)
		eq(t, "changes after an invalid edit", len(changes), 0)
		logged := logs.String()
		for _, want := range []string{"config reload rejected; keeping the current configuration",
			`unknown key \"server.lisen\"`, path} {
			if !strings.Contains(logged, want) {
				t.Errorf("log lacks %q:\n%s", want, logged)
			}
		}
		if strings.Contains(logged, "zzsecret") {
			t.Errorf("log contains the secret:\n%s", logged)
		}

		// Rename-replace (Create of the name) and a key that needs a restart.
		writeFile(t, path, "server:\n  listen: 127.0.0.1:9000\n")
		event(path, fsnotify.Create)
		faketime.Advance(ReloadDebounce)
		synctest.Wait()
		eq(t, "listen after rename", src.Current().Server.Listen, "127.0.0.1:9000")
		if !strings.Contains(logs.String(), "needs_restart=server.listen") {
			t.Errorf("no restart notice for server.listen:\n%s", logs.String())
		}

		// A removed file keeps the current config.
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		event(path, fsnotify.Remove)
		faketime.Advance(ReloadDebounce)
		synctest.Wait()
		eq(t, "after removal", src.Current().Server.Listen, "127.0.0.1:9000")
		if !strings.Contains(logs.String(), "config file unreadable") {
			t.Errorf("removal not logged:\n%s", logs.String())
		}

		// A watcher error is logged and the loop goes on.
		errs <- os.ErrPermission
		synctest.Wait()
		if !strings.Contains(logs.String(), "config watch error") {
			t.Errorf("watcher error not logged:\n%s", logs.String())
		}

		cancel()
		if err := <-done; err != nil {
			t.Errorf("run after cancel = %v, want nil", err)
		}
	})
}

// TestWatchRealFile edits a real file and waits (bounded) for fsnotify.
func TestWatchRealFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "turnguard.yaml")
	writeFile(t, path, historyConfig("10"))
	c, err := loadFile(t, path)
	if err != nil {
		t.Fatal(err)
	}
	src := NewSource(c)
	var logs logBuffer
	var mu sync.Mutex
	var seen []int
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- src.Watch(ctx, path, loggerTo(&logs), ReloadHooks{Changed: func(old, new *Config) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, new.Server.HistoryLimit)
		}})
	}()

	// waitFor rewrites the file until cond holds: the watcher may not be
	// set up yet when the first write happens, and identical content is
	// not reloaded twice.
	waitFor := func(what string, write func(), cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for next := time.Now(); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; log:\n%s", what, logs.String())
			}
			if time.Now().After(next) {
				write()
				next = time.Now().Add(time.Second)
			}
			time.Sleep(20 * time.Millisecond) // real time: fsnotify delivers real file events
		}
	}

	waitFor("an in-place edit", func() { writeFile(t, path, historyConfig("20")) },
		func() bool { return src.Current().Server.HistoryLimit == 20 })

	// An editor's rename-replace: write a temporary file, rename it over.
	waitFor("a rename-replace", func() {
		tmp := filepath.Join(dir, ".turnguard.yaml.swp")
		writeFile(t, tmp, historyConfig("30"))
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}, func() bool { return src.Current().Server.HistoryLimit == 30 })

	waitFor("an invalid edit to be rejected", func() {
		writeFile(t, path, "server:\n  token: zzsecret-token\n  historyLimit: -1\n")
	}, func() bool { return strings.Contains(logs.String(), "config reload rejected") })
	eq(t, "after the invalid edit", src.Current().Server.HistoryLimit, 30)
	if l := logs.String(); strings.Contains(l, "zzsecret") || !strings.Contains(l, "server.historyLimit") {
		t.Errorf("rejection log should name the key and not the secret:\n%s", l)
	}
	mu.Lock()
	eq(t, "onChange calls", seen, []int{20, 30})
	mu.Unlock()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Watch = %v after cancel, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not return after its context was cancelled")
	}
}

func TestWatchMissingDirectory(t *testing.T) {
	src := NewSource(Default())
	err := src.Watch(t.Context(), filepath.Join(t.TempDir(), "nope", "turnguard.yaml"), nil, ReloadHooks{})
	if err == nil || !strings.Contains(err.Error(), "config watch") {
		t.Fatalf("Watch on a missing directory = %v, want an error", err)
	}
}

// reloadOnce writes content to the file and runs one reload, bounded in
// real time: before template execution was bounded, a reload of the range
// below never returned (and wedged shutdown).
func reloadOnce(t *testing.T, r *reloader, content string) {
	t.Helper()
	writeFile(t, r.path, content)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.reload()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // real time: guards against a reload that never ends
		t.Fatal("the reload did not return within 10s")
	}
}

// TestReloadRefusesUnboundedTemplate: the template of issue 10 is refused
// by hot reload at once, naming the key; the old configuration stays.
func TestReloadRefusesUnboundedTemplate(t *testing.T) {
	path, src := historySource(t)
	var logs logBuffer
	r := newReloader(src, path, loggerTo(&logs), ReloadHooks{})
	reloadOnce(t, r, "server:\n  historyLimit: 20\nmessages:\n  progress: \"{{range $i := .Elapsed}}x{{end}}\"\n")
	eq(t, "historyLimit after the refused reload", src.Current().Server.HistoryLimit, 10)
	for _, want := range []string{"config reload rejected; keeping the current configuration",
		"messages.progress: progress:1:8: {{range}} is not allowed in a message"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

// TestReloadRestartKeys: a key read only at start is named as needing a
// restart, and the log then does not claim "config reloaded"; a value equal
// to the one in force (unchanged, or changed back) gives no warning; a
// reload Prepare refuses keeps the current configuration.
func TestReloadRestartKeys(t *testing.T) {
	const base = "server:\n  token: zzsecret-token-0001\n  historyLimit: %s\n  listen: %s\n"
	cfg := func(token, limit, listen string) string {
		return strings.Replace(fmt.Sprintf(base, limit, listen), "zzsecret-token-0001", token, 1)
	}
	tests := []struct {
		name        string
		content     string
		wantLimit   int
		wantLog     []string
		notLog      []string
		prepareFail bool
	}{
		// server.operatorToken defaults to server.token, so it changes too.
		{name: "token changed", content: cfg("zzsecret-token-0002", "20", "127.0.0.1:1"), wantLimit: 20,
			wantLog: []string{"config applied except server.token, server.operatorToken: needs a restart", "needs_restart=server.token,server.operatorToken",
				`changed="server.historyLimit, server.operatorToken (secret), server.token (secret)"`},
			notLog: []string{"config reloaded", "zzsecret"}},
		{name: "token and listen changed", content: cfg("zzsecret-token-0002", "30", "127.0.0.1:2"), wantLimit: 30,
			wantLog: []string{"config applied except server.listen, server.token, server.operatorToken: needs a restart"},
			notLog:  []string{"config reloaded", "zzsecret"}},
		{name: "both changed back to the values in force", content: cfg("zzsecret-token-0001", "40", "127.0.0.1:1"), wantLimit: 40,
			wantLog: []string{"config reloaded; new turns use it"},
			notLog:  []string{"needs a restart", "needs_restart"}},
		{name: "restart key unchanged, another key changed", content: cfg("zzsecret-token-0001", "50", "127.0.0.1:1"), wantLimit: 50,
			wantLog: []string{"config reloaded; new turns use it", "changed=server.historyLimit\n"},
			notLog:  []string{"needs a restart"}},
		{name: "refused by Prepare", content: cfg("zzsecret-token-0001", "60", "127.0.0.1:1"), wantLimit: 50, prepareFail: true,
			wantLog: []string{"config reload refused; keeping the current configuration", "runner exec: cannot be built"},
			notLog:  []string{"config reloaded"}},
	}
	path := filepath.Join(t.TempDir(), "turnguard.yaml")
	writeFile(t, path, cfg("zzsecret-token-0001", "10", "127.0.0.1:1"))
	src := NewSource(mustLoad(t, path))
	failPrepare := false
	changed := 0
	var logs logBuffer
	r := newReloader(src, path, loggerTo(&logs), ReloadHooks{
		Prepare: func(old, next *Config) error {
			if failPrepare {
				return errors.New("runner exec: cannot be built")
			}
			return nil
		},
		Changed: func(old, next *Config) { changed++ },
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			from := len(logs.String())
			failPrepare = tt.prepareFail
			before := changed
			reloadOnce(t, r, tt.content)
			eq(t, "historyLimit", src.Current().Server.HistoryLimit, tt.wantLimit)
			if tt.prepareFail != (changed == before) {
				t.Errorf("Changed called %d times", changed-before)
			}
			got := logs.String()[from:]
			for _, w := range tt.wantLog {
				if !strings.Contains(got, w) {
					t.Errorf("log lacks %q:\n%s", w, got)
				}
			}
			for _, n := range tt.notLog {
				if strings.Contains(got, n) {
					t.Errorf("log contains %q:\n%s", n, got)
				}
			}
		})
	}
}

// TestRefusedReloadIsRetried: a reload Prepare refused (a runner it could not
// build yet) is tried again at the next event for the file, even when its
// content did not change (a touch after installing what was missing).
func TestRefusedReloadIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path, src := historySource(t)
		var logs logBuffer
		var mu sync.Mutex
		ready := false // what Prepare needs is missing at first
		r := newReloader(src, path, loggerTo(&logs), ReloadHooks{Prepare: func(old, next *Config) error {
			mu.Lock()
			defer mu.Unlock()
			if !ready {
				return errors.New("agents.exec.command: /opt/agent: no such file")
			}
			return nil
		}})
		events := make(chan fsnotify.Event)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go r.run(ctx, events, make(chan error))

		writeFile(t, path, historyConfig("20"))
		events <- fsnotify.Event{Name: path, Op: fsnotify.Write}
		faketime.Advance(ReloadDebounce)
		synctest.Wait()
		eq(t, "historyLimit after a refused reload", src.Current().Server.HistoryLimit, 10)
		if !strings.Contains(logs.String(), "config reload refused") {
			t.Fatalf("the refusal was not logged:\n%s", logs.String())
		}

		mu.Lock()
		ready = true
		mu.Unlock()
		events <- fsnotify.Event{Name: path, Op: fsnotify.Chmod} // touch: same content
		faketime.Advance(ReloadDebounce)
		synctest.Wait()
		eq(t, "historyLimit after the retry", src.Current().Server.HistoryLimit, 20)
	})
}
