package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

func init() {
	cases = append(cases,
		testCase{"TurnSenderRecorded", testTurnSenderRecorded},
		testCase{"RetryTokenLifecycle", testRetryTokenLifecycle},
		testCase{"RetryTokenUsedOnceUnderConcurrency", testRetryTokenUsedOnceUnderConcurrency},
		testCase{"RetryTokensPrunedWithTheirTurns", testRetryTokensPrunedWithTheirTurns},
	)
}

// testTurnSenderRecorded: the sender of a turn's message (TurnStarted's
// Sender) is kept with the turn and survives a reopen — a Retry button
// offered after a restart is still bound to its sender.
func testTurnSenderRecorded(t *testing.T, h *H) {
	loc := h.New(t)
	s := h.Open(t, loc, Config{})
	tr, anon := NewTurn("run-1", "s1"), NewTurn("run-2", "s2")
	HandleAll(s,
		tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Sender = "telegram-user:7" }),
		tr.Ev(event.Aborted, time.Second, func(e *event.Event) { e.StopReason = event.ReasonStepTimeout }),
		anon.Ev(event.TurnStarted, 0, nil))
	Flush(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = h.Open(t, loc, Config{SecondProcess: true})
	for run, want := range map[string]string{"run-1": "telegram-user:7", "run-2": ""} {
		if got := MustTurn(t, s, run).Sender; got != want {
			t.Errorf("turn %s: sender %q, want %q", run, got, want)
		}
	}
}

// testRetryTokenLifecycle: a saved token is found by its secret only (the
// store keeps its hash), is used once, can be released only by the run
// that used it, and is used again after a release.
func testRetryTokenLifecycle(t *testing.T, h *H) {
	ctx := context.Background()
	s := h.Open(t, h.New(t), Config{})
	tok := store.RetryToken{RunID: "tg-42-7", Channel: "telegram", ChatRef: "42", Sender: "telegram-user:42", CreatedAt: T0}
	if err := s.SaveRetryToken(ctx, "secret-1", tok); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveRetryToken(ctx, "secret-1", store.RetryToken{RunID: "other", CreatedAt: T0}); err != nil {
		t.Fatalf("saving a secret again: %v", err)
	}
	got, err := s.RetryToken(ctx, "secret-1")
	if err != nil || got != tok {
		t.Fatalf("RetryToken = %+v, %v; want %+v (the first save)", got, err, tok)
	}
	for _, secret := range []string{"secret-2", store.RetryTokenHash("secret-1"), ""} {
		if _, err := s.RetryToken(ctx, secret); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("RetryToken(%q) err = %v, want ErrNotFound", secret, err)
		}
		if _, err := s.UseRetryToken(ctx, secret, "r", T0); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("UseRetryToken(%q) err = %v, want ErrNotFound", secret, err)
		}
	}
	at := T0.Add(time.Minute)
	if got, err := s.UseRetryToken(ctx, "secret-1", "retry-a", at); err != nil || got != tok {
		t.Fatalf("first use = %+v, %v; want %+v", got, err, tok)
	}
	got, err = s.UseRetryToken(ctx, "secret-1", "retry-b", at)
	if !errors.Is(err, store.ErrTokenUsed) || got.UsedBy != "retry-a" || !got.UsedAt.Equal(at) {
		t.Fatalf("second use = %+v, %v; want ErrTokenUsed, used by retry-a at %v", got, err, at)
	}
	if err := s.ReleaseRetryToken(ctx, "secret-1", "retry-b"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.RetryToken(ctx, "secret-1"); got.UsedBy != "retry-a" {
		t.Fatalf("released by a run that does not hold it: used by %q", got.UsedBy)
	}
	if err := s.ReleaseRetryToken(ctx, "secret-1", "retry-a"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.UseRetryToken(ctx, "secret-1", "retry-c", at); err != nil || got.UsedBy != "" {
		t.Fatalf("use after release = %+v, %v; want the unused token", got, err)
	}
}

// testRetryTokenUsedOnceUnderConcurrency: of many presses of one button at
// once (one store each, as replicas), exactly one gets the token.
func testRetryTokenUsedOnceUnderConcurrency(t *testing.T, h *H) {
	ctx := context.Background()
	loc := h.New(t)
	s := h.Open(t, loc, Config{})
	if err := s.SaveRetryToken(ctx, "secret", store.RetryToken{RunID: "r", Channel: "telegram", ChatRef: "1", CreatedAt: T0}); err != nil {
		t.Fatal(err)
	}
	other := h.Open(t, loc, Config{SecondProcess: true})
	const presses = 8
	var wg sync.WaitGroup
	errs := make([]error, presses)
	for i := range presses {
		st := s
		if i%2 == 1 {
			st = other
		}
		wg.Go(func() { _, errs[i] = st.UseRetryToken(ctx, "secret", string(rune('a'+i)), T0) })
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, store.ErrTokenUsed):
			t.Errorf("press %d: %v", i, err)
		}
	}
	if won != 1 {
		t.Fatalf("%d presses got the token, want 1", won)
	}
}

// testRetryTokensPrunedWithTheirTurns: retention deletes a token with its
// turn, never one of a turn kept.
func testRetryTokensPrunedWithTheirTurns(t *testing.T, h *H) {
	ctx := context.Background()
	s := h.Open(t, h.New(t), Config{Retention: KeepDays})
	old, recent := NewTurn("old", "s1"), NewTurn("recent", "s2")
	recentAt := 100 * 24 * time.Hour
	HandleAll(s,
		old.Ev(event.TurnStarted, 0, nil),
		old.Ev(event.Aborted, time.Second, func(e *event.Event) { e.StopReason = event.ReasonTimeout }),
		recent.Ev(event.TurnStarted, recentAt, nil),
		recent.Ev(event.Aborted, recentAt+time.Second, func(e *event.Event) { e.StopReason = event.ReasonTimeout }))
	Flush(t, s)
	for secret, tok := range map[string]store.RetryToken{
		"old":    {RunID: "old", CreatedAt: T0.Add(2 * time.Second)},
		"recent": {RunID: "recent", CreatedAt: T0.Add(recentAt + 2*time.Second)},
	} {
		if err := s.SaveRetryToken(ctx, secret, tok); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := s.Prune(ctx, T0.Add(recentAt+time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if ps.RetryTokens != 1 {
		t.Errorf("pruned %d retry tokens, want 1", ps.RetryTokens)
	}
	if _, err := s.RetryToken(ctx, "old"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the old turn's token: %v, want ErrNotFound", err)
	}
	if _, err := s.RetryToken(ctx, "recent"); err != nil {
		t.Errorf("the recent turn's token: %v", err)
	}
}
