package main

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/store"
)

// TestResetDuringATurnStaysOutOfTheReloadedHistory (issue 20, defect 4,
// the store's side): /new while a turn runs; the turn ends after the reset
// point and the store writes its reply then. Once the session is evicted
// and its history reloaded from the store (a real SQLite file), the old
// reply is neither in chat.history nor in what the next turn's runner
// receives.
func TestResetDuringATurnStaysOutOfTheReloadedHistory(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := config.Default()
	cfg.Server.MaxSessions = 1 // opening another session evicts an idle one
	src := config.NewSource(cfg)
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "turnguard.db"), store.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })

	// The runner tells the test the history each turn received; the first
	// turn runs until released.
	release, heard := make(chan struct{}), make(chan []runner.Message, 2)
	rn := runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		heard <- turn.History
		if turn.RunID == "r1" {
			<-release
		}
		return runner.Result{Text: "reply to " + turn.Message}, nil
	})
	eng, err := gateway.New(gateway.Options{Config: src, Log: log, History: storeHistory(st),
		Runners: map[string]runner.Runner{config.RunnerDemo: rn}})
	if err != nil {
		t.Fatal(err)
	}
	unsub := eng.Bus().Subscribe("", st.Handle)
	eng.Start(ctx)
	t.Cleanup(func() { eng.Shutdown(context.Background()); unsub() })

	if _, err := eng.Send(ctx, gateway.SendRequest{SessionKey: "chat1", Channel: config.ChannelWS, RunID: "r1", Text: "old question"}); err != nil {
		t.Fatal(err)
	}
	eng.Reset("chat1")
	close(release)
	if out, ok := eng.Wait(ctx, "r1"); !ok || out.Text != "reply to old question" {
		t.Fatalf("old turn's outcome %+v", out)
	}
	if err := st.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	evict := func() {
		t.Helper()
		if _, _, err := eng.History(ctx, "other", 0); err != nil {
			t.Fatal(err)
		}
		for _, s := range eng.Sessions() {
			if s.Key == "chat1" {
				t.Fatal("chat1 was not evicted")
			}
		}
	}
	evict()
	if _, h, err := eng.History(ctx, "chat1", 0); err != nil || len(h) != 0 {
		t.Fatalf("history reloaded after /new = %+v, %v; want empty", h, err)
	}
	evict()
	if _, err := eng.Send(ctx, gateway.SendRequest{SessionKey: "chat1", Channel: config.ChannelWS, RunID: "r2", Text: "new question"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := eng.Wait(ctx, "r2"); !ok {
		t.Fatal("no outcome for r2")
	}
	<-heard // r1's
	if h := <-heard; len(h) != 0 {
		t.Fatalf("the new conversation's first turn received history %+v, want none", h)
	}
}
