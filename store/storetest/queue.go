package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// testQueuedOrderReplaceRemove: Queued lists messages in the order they
// were queued across sessions, with every field; adding a queued run id
// again replaces its text in place (a collect turn another message
// joined); RemoveQueued forgets the named ones and ignores unknown ids.
func testQueuedOrderReplaceRemove(t *testing.T, h *H) {
	ctx := context.Background()
	s := h.Open(t, h.New(t), Config{})
	for _, m := range []store.QueuedMessage{
		{RunID: "r1", SessionKey: "ws:a", Channel: "ws", Owner: "alice", Text: "first", QueuedAt: T0},
		{RunID: "r2", SessionKey: "telegram:42", Channel: "telegram", ChatRef: "42", Owner: "7", Text: "second", QueuedAt: T0.Add(time.Second)},
		{RunID: "r3", SessionKey: "ws:a", Channel: "ws", Owner: "alice", Text: "third", QueuedAt: T0.Add(2 * time.Second)},
	} {
		if err := s.AddQueued(ctx, m); err != nil {
			t.Fatalf("AddQueued(%s): %v", m.RunID, err)
		}
	}
	q, err := s.Queued(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := store.QueuedMessage{RunID: "r2", SessionKey: "telegram:42", Channel: "telegram", ChatRef: "42", Owner: "7",
		Text: "second", QueuedAt: T0.Add(time.Second)}
	if len(q) != 3 || q[1] != want {
		t.Fatalf("Queued()[1] = %+v, want %+v (all: %+v)", q[1], want, q)
	}
	EqStrings(t, "queued", QueuedTexts(t, s), []string{"r1=first", "r2=second", "r3=third"})

	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "r1", SessionKey: "ws:a", Text: "first\n\nmore", QueuedAt: T0.Add(time.Hour)}); err != nil {
		t.Fatalf("AddQueued again: %v", err)
	}
	EqStrings(t, "after a join", QueuedTexts(t, s), []string{"r1=first\n\nmore", "r2=second", "r3=third"})
	if q, _ := s.Queued(ctx); !q[0].QueuedAt.Equal(T0) || q[0].Owner != "alice" {
		t.Errorf("joined message = %+v: its queued time and owner changed", q[0])
	}

	if err := s.RemoveQueued(ctx, "r1", "nope", "r3"); err != nil {
		t.Fatalf("RemoveQueued: %v", err)
	}
	EqStrings(t, "after remove", QueuedTexts(t, s), []string{"r2=second"})
	if err := s.RemoveQueued(ctx); err != nil {
		t.Fatalf("RemoveQueued(): %v", err)
	}
	// A message queued after removals still goes last.
	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "r4", SessionKey: "ws:a", Text: "fourth"}); err != nil {
		t.Fatal(err)
	}
	EqStrings(t, "after another", QueuedTexts(t, s), []string{"r2=second", "r4=fourth"})
}

// testQueuedSurvivesReopen: what AddQueued returned for is there after the
// store is closed and opened again (a restart), in order.
func testQueuedSurvivesReopen(t *testing.T, h *H) {
	ctx := context.Background()
	path := h.New(t)
	s, err := h.OpenErr(t, path, Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i, text := range []string{"one", "two", "three"} {
		if err := s.AddQueued(ctx, store.QueuedMessage{RunID: text, SessionKey: "ws:a", Text: text, QueuedAt: T0.Add(time.Duration(i))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.RemoveQueued(ctx, "two"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "late", SessionKey: "ws:a", Text: "late"}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("AddQueued after Close = %v, want ErrClosed", err)
	}
	s2 := h.Open(t, path, Config{})
	EqStrings(t, "after reopen", QueuedTexts(t, s2), []string{"one=one", "three=three"})
}

// testAddQueuedRejectsBadInput: a message missing what its turn needs is a
// clear error and stores nothing.
func testAddQueuedRejectsBadInput(t *testing.T, h *H) {
	ctx := context.Background()
	s := h.Open(t, h.New(t), Config{})
	for _, tc := range []struct {
		name string
		m    store.QueuedMessage
	}{
		{"no run id", store.QueuedMessage{SessionKey: "ws:a", Text: "x"}},
		{"no session", store.QueuedMessage{RunID: "r", Text: "x"}},
		{"no text", store.QueuedMessage{RunID: "r", SessionKey: "ws:a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.AddQueued(ctx, tc.m); !errors.Is(err, store.ErrInvalid) {
				t.Errorf("AddQueued(%+v) = %v, want ErrInvalid", tc.m, err)
			}
		})
	}
	EqStrings(t, "queued", QueuedTexts(t, s), nil)
}

// testPruneKeepsQueued: retention never deletes a queued message, however
// old, even when its session's history goes.
func testPruneKeepsQueued(t *testing.T, h *H) {
	ctx := context.Background()
	s := h.Open(t, h.New(t), Config{Retention: KeepDays})
	WriteTurns(t, s, "a", 20, 0)
	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "q1", SessionKey: "s1", Text: "waiting", QueuedAt: T0}); err != nil {
		t.Fatal(err)
	}
	ps, err := s.Prune(ctx, time.Now().Add(365*24*time.Hour))
	if err != nil {
		t.Fatalf("Prune: %v", err)
	}
	if ps.Sessions == 0 || ps.Messages == 0 {
		t.Fatalf("Prune = %+v: the test needs it to delete the old history and sessions", ps)
	}
	EqStrings(t, "queued after prune", QueuedTexts(t, s), []string{"q1=waiting"})
}

// testTurnStartedRemovesItsQueuedRows: the transaction that records a
// turn's TurnStarted deletes the queued rows of its run id and of the
// messages joined into it (Joined): across a crash a queued message is
// either still queued (its start not written) or its turn is recorded —
// never both, never neither. A row stored again for a started run id (a
// late write) is not listed: it must not run twice.
func testTurnStartedRemovesItsQueuedRows(t *testing.T, h *H) {
	ctx := context.Background()
	s := h.Open(t, h.New(t), Config{})
	for _, id := range []string{"q1", "q2", "q3"} {
		if err := s.AddQueued(ctx, store.QueuedMessage{RunID: id, SessionKey: "ws:a", Text: "text " + id}); err != nil {
			t.Fatal(err)
		}
	}
	tr := NewTurn("q1", "ws:a")
	s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "text q1\n\ntext q2"; e.Joined = []string{"q2"} }))
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	EqStrings(t, "queued after q1 started", QueuedTexts(t, s), []string{"q3=text q3"})
	if got := MustTurn(t, s, "q1"); got.State != store.TurnRunning {
		t.Errorf("turn %+v, want running", got)
	}
	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "q1", SessionKey: "ws:a", Text: "text q1"}); err != nil {
		t.Fatal(err)
	}
	EqStrings(t, "queued after a late write of q1", QueuedTexts(t, s), []string{"q3=text q3"})
}

// A queued message's per-request timeout survives a reopen.
func testQueuedKeepsTimeout(t *testing.T, h *H) {
	ctx := context.Background()
	path := h.New(t)
	s := h.Open(t, path, Config{})
	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "q", SessionKey: "ws:a", Text: "x", Timeout: 42 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "bad", SessionKey: "ws:a", Text: "x", Timeout: -time.Second}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("negative timeout: %v, want ErrInvalid", err)
	}
	s.Close()
	s = h.Open(t, path, Config{})
	q, err := s.Queued(ctx)
	if err != nil || len(q) != 1 || q[0].Timeout != 42*time.Second {
		t.Fatalf("Queued = %+v, %v; want q with timeout 42s", q, err)
	}
}
