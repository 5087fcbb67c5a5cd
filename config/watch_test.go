package config

import (
	"context"
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
		r := newReloader(src, path, loggerTo(&logs), func(old, new *Config) { changes <- [2]*Config{old, new} })
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
		if !strings.Contains(logs.String(), "key=server.listen") {
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
		done <- src.Watch(ctx, path, loggerTo(&logs), func(old, new *Config) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, new.Server.HistoryLimit)
		})
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
	err := src.Watch(t.Context(), filepath.Join(t.TempDir(), "nope", "turnguard.yaml"), nil, nil)
	if err == nil || !strings.Contains(err.Error(), "config watch") {
		t.Fatalf("Watch on a missing directory = %v, want an error", err)
	}
}
