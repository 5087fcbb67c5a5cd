package telegram

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
	"github.com/turnguard/turnguard/store"
)

// waitUntil polls cond each time the fake API answers a call (getUpdates
// long-polls return at least every second), up to a real-time limit.
func waitUntil(t *testing.T, api *fakeAPI, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(limit)
	for !cond() {
		select {
		case <-api.notify:
		case <-deadline:
			t.Fatalf("timed out after %v waiting for %s; calls:\n%s", limit, what, strings.Join(callLines(api.allCalls()), "\n"))
		}
	}
}

// TestRealHTTP runs the channel over real TCP against the fake API (the
// client's own HTTP stack and multipart encoding), with the SQLite store
// as its outbox.
func TestRealHTTP(t *testing.T) {
	api := newFakeAPI(testToken)
	srv := httptest.NewServer(api)
	defer srv.Close()

	c := testConfig(func(c *config.Config) {
		c.Channels.Telegram.APIURL = srv.URL + "/" // a trailing slash is fine
		c.Channels.Telegram.ShowSteps = true
	})
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	src := config.NewSource(c)
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "turnguard.db"), store.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d := demo.New()
	eng, err := gateway.New(gateway.Options{Config: src, Runners: map[string]runner.Runner{"demo": d}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	eng.Start(ctx)
	ch, err := New(eng, src, Options{Log: log, Outbox: st, PollTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- ch.Run(runCtx) }()

	// Let the client's long poll start first, so the update wakes it.
	waitUntil(t, api, 20*time.Second, "the first long poll", func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		return api.getUpdates > 0
	})
	sent := time.Now()
	api.say(alice, "/steps web_search:1s say:Hello_<over>_&_HTTP")
	// The step line shows the step's real duration, rounded to 0.1 s: 1s,
	// or a little more on a loaded machine (real HTTP, real clock).
	stepLine := regexp.MustCompile(`^✅ web_search · 1(\.[0-9])? s$`)
	waitUntil(t, api, 20*time.Second, "the reply and the step line", func() bool {
		sc := api.screen(alice)
		return len(sc) == 2 && stepLine.MatchString(sc[0]) && sc[1] == "Hello <over> & HTTP"
	})
	if d := time.Since(sent); d > 10*time.Second {
		t.Errorf("the reply took %v: the long poll did not return when the update came", d)
	}
	var names []string
	for _, c := range api.commands {
		names = append(names, c.Command)
	}
	if !slices.Equal(names, []string{"stop", "status", "new", "queue", "help"}) {
		t.Errorf("setMyCommands over multipart registered %v", names)
	}
	// Real SQLite I/O with a full sync: give a loaded machine time.
	waitUntil(t, api, 30*time.Second, "the outbox to record the delivery", func() bool {
		n, err := st.Counts(ctx)
		return err == nil && n.Delivered == 1 && n.Pending == 0
	})

	stopRun()
	select {
	case err := <-runDone:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	d.Release()
	eng.Shutdown(ctx)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ch.Close(cctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	if strings.Contains(logs.String(), testToken) {
		t.Errorf("the token is in the logs:\n%s", logs.String())
	}
}
