package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// queuedTexts lists "runID=text" of what Queued returns, in its order.
func queuedTexts(t *testing.T, s *store.SQLite) []string {
	t.Helper()
	q, err := s.Queued(context.Background())
	if err != nil {
		t.Fatalf("Queued: %v", err)
	}
	out := make([]string, len(q))
	for i, m := range q {
		out[i] = m.RunID + "=" + m.Text
	}
	return out
}

func eqStrings(t *testing.T, what string, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s = %q, want %q", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s = %q, want %q", what, got, want)
		}
	}
}

// TestQueuedOrderReplaceRemove: Queued lists messages in the order they
// were queued across sessions, with every field; adding a queued run id
// again replaces its text in place (a collect turn another message
// joined); RemoveQueued forgets the named ones and ignores unknown ids.
func TestQueuedOrderReplaceRemove(t *testing.T) {
	ctx := context.Background()
	s := open(t, dbPath(t), store.Options{})
	for _, m := range []store.QueuedMessage{
		{RunID: "r1", SessionKey: "ws:a", Channel: "ws", Owner: "alice", Text: "first", QueuedAt: t0},
		{RunID: "r2", SessionKey: "telegram:42", Channel: "telegram", ChatRef: "42", Owner: "7", Text: "second", QueuedAt: t0.Add(time.Second)},
		{RunID: "r3", SessionKey: "ws:a", Channel: "ws", Owner: "alice", Text: "third", QueuedAt: t0.Add(2 * time.Second)},
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
		Text: "second", QueuedAt: t0.Add(time.Second)}
	if len(q) != 3 || q[1] != want {
		t.Fatalf("Queued()[1] = %+v, want %+v (all: %+v)", q[1], want, q)
	}
	eqStrings(t, "queued", queuedTexts(t, s), []string{"r1=first", "r2=second", "r3=third"})

	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "r1", SessionKey: "ws:a", Text: "first\n\nmore", QueuedAt: t0.Add(time.Hour)}); err != nil {
		t.Fatalf("AddQueued again: %v", err)
	}
	eqStrings(t, "after a join", queuedTexts(t, s), []string{"r1=first\n\nmore", "r2=second", "r3=third"})
	if q, _ := s.Queued(ctx); !q[0].QueuedAt.Equal(t0) || q[0].Owner != "alice" {
		t.Errorf("joined message = %+v: its queued time and owner changed", q[0])
	}

	if err := s.RemoveQueued(ctx, "r1", "nope", "r3"); err != nil {
		t.Fatalf("RemoveQueued: %v", err)
	}
	eqStrings(t, "after remove", queuedTexts(t, s), []string{"r2=second"})
	if err := s.RemoveQueued(ctx); err != nil {
		t.Fatalf("RemoveQueued(): %v", err)
	}
	// A message queued after removals still goes last.
	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "r4", SessionKey: "ws:a", Text: "fourth"}); err != nil {
		t.Fatal(err)
	}
	eqStrings(t, "after another", queuedTexts(t, s), []string{"r2=second", "r4=fourth"})
}

// TestQueuedSurvivesReopen: what AddQueued returned for is there after the
// store is closed and opened again (a restart), in order.
func TestQueuedSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	path := dbPath(t)
	s, err := store.Open(ctx, path, store.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for i, text := range []string{"one", "two", "three"} {
		if err := s.AddQueued(ctx, store.QueuedMessage{RunID: text, SessionKey: "ws:a", Text: text, QueuedAt: t0.Add(time.Duration(i))}); err != nil {
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
	s2 := open(t, path, store.Options{})
	eqStrings(t, "after reopen", queuedTexts(t, s2), []string{"one=one", "three=three"})
}

// TestAddQueuedRejectsBadInput: a message missing what its turn needs is a
// clear error and stores nothing.
func TestAddQueuedRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	s := open(t, dbPath(t), store.Options{})
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
	eqStrings(t, "queued", queuedTexts(t, s), nil)
}

// TestPruneKeepsQueued: retention never deletes a queued message, however
// old, even when its session's history goes.
func TestPruneKeepsQueued(t *testing.T) {
	ctx := context.Background()
	s := open(t, dbPath(t), store.Options{Retention: keepDays})
	writeTurns(t, s, "a", 20, 0)
	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "q1", SessionKey: "s1", Text: "waiting", QueuedAt: t0}); err != nil {
		t.Fatal(err)
	}
	ps, err := s.Prune(ctx, time.Now().Add(365*24*time.Hour))
	if err != nil {
		t.Fatalf("Prune: %v", err)
	}
	if ps.Sessions == 0 || ps.Messages == 0 {
		t.Fatalf("Prune = %+v: the test needs it to delete the old history and sessions", ps)
	}
	eqStrings(t, "queued after prune", queuedTexts(t, s), []string{"q1=waiting"})
}

// Version 4 is the previous schema version since v5 (the queue): its rows
// survive the migration and the queue works on the migrated file.
func TestMigrateFromVersion4KeepsRowsAndQueues(t *testing.T) {
	s := openMigrated(t, 4)
	if err := s.AddQueued(context.Background(), store.QueuedMessage{RunID: "q", SessionKey: "telegram:42", Text: "next"}); err != nil {
		t.Fatalf("AddQueued on the migrated file: %v", err)
	}
	eqStrings(t, "queued", queuedTexts(t, s), []string{"q=next"})
}

// TestTurnStartedRemovesItsQueuedRows: the transaction that records a
// turn's TurnStarted deletes the queued rows of its run id and of the
// messages joined into it (Joined): across a crash a queued message is
// either still queued (its start not written) or its turn is recorded —
// never both, never neither. A row stored again for a started run id (a
// late write) is not listed: it must not run twice.
func TestTurnStartedRemovesItsQueuedRows(t *testing.T) {
	ctx := context.Background()
	s := open(t, dbPath(t), store.Options{})
	for _, id := range []string{"q1", "q2", "q3"} {
		if err := s.AddQueued(ctx, store.QueuedMessage{RunID: id, SessionKey: "ws:a", Text: "text " + id}); err != nil {
			t.Fatal(err)
		}
	}
	tr := newTurn("q1", "ws:a")
	s.Handle(tr.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "text q1\n\ntext q2"; e.Joined = []string{"q2"} }))
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	eqStrings(t, "queued after q1 started", queuedTexts(t, s), []string{"q3=text q3"})
	if got := mustTurn(t, s, "q1"); got.State != store.TurnRunning {
		t.Errorf("turn %+v, want running", got)
	}
	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "q1", SessionKey: "ws:a", Text: "text q1"}); err != nil {
		t.Fatal(err)
	}
	eqStrings(t, "queued after a late write of q1", queuedTexts(t, s), []string{"q3=text q3"})
}

// A queued message's per-request timeout survives a reopen.
func TestQueuedKeepsTimeout(t *testing.T) {
	ctx := context.Background()
	path := dbPath(t)
	s := open(t, path, store.Options{})
	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "q", SessionKey: "ws:a", Text: "x", Timeout: 42 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "bad", SessionKey: "ws:a", Text: "x", Timeout: -time.Second}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("negative timeout: %v, want ErrInvalid", err)
	}
	s.Close()
	s = open(t, path, store.Options{})
	q, err := s.Queued(ctx)
	if err != nil || len(q) != 1 || q[0].Timeout != 42*time.Second {
		t.Fatalf("Queued = %+v, %v; want q with timeout 42s", q, err)
	}
}
