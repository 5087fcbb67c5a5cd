package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// testQueueResumeHeadsTheQueueOnce: a resumed attempt is recorded with its
// number and the step its predecessor was cut off in, and its message is
// queued ahead of the messages already waiting; a second call (a crash
// between QueueResume and MarkInterrupted) changes nothing; Resumed names
// the attempt replaced, not the new one; both survive a
// reopen; a first attempt has no record; a resume without what it needs
// is refused and stores nothing.
func testQueueResumeHeadsTheQueueOnce(t *testing.T, h *H) {
	ctx := context.Background()
	path := h.New(t)
	s, err := h.OpenErr(t, path, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddQueued(ctx, store.QueuedMessage{RunID: "behind", SessionKey: "ws:a", Text: "later", QueuedAt: T0.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	id := store.ResumeRunID("run-1", 2)
	r := store.Resume{RunID: id, PrevRunID: "run-1", OriginRunID: "run-1", SessionKey: "ws:a", Attempt: 2,
		Step: event.Step{Kind: event.StepTool, Name: "shell"}, Confirm: true, OriginStartedAt: T0, CreatedAt: T0.Add(time.Minute)}
	m := store.QueuedMessage{RunID: id, SessionKey: "ws:a", Channel: "ws", Owner: "alice", Text: "do it", QueuedAt: T0}
	for i := range 2 {
		if err := s.QueueResume(ctx, r, m); err != nil {
			t.Fatalf("QueueResume #%d: %v", i+1, err)
		}
	}
	EqStrings(t, "queued", QueuedTexts(t, s), []string{id + "=do it", "behind=later"})
	for run, want := range map[string]bool{"run-1": true, id: false, "other": false} {
		if got, err := s.Resumed(ctx, run); err != nil || got != want {
			t.Errorf("Resumed(%s) = %v, %v; want %v", run, got, err, want)
		}
	}
	if _, err := s.Resume(ctx, "run-1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Resume of a first attempt = %v, want ErrNotFound", err)
	}
	bad := r
	bad.RunID, bad.Attempt = store.ResumeRunID("run-1", 3), 1
	if err := s.QueueResume(ctx, bad, store.QueuedMessage{RunID: bad.RunID, SessionKey: "ws:a", Text: "x"}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("QueueResume of attempt 1 = %v, want ErrInvalid", err)
	}
	if err := s.QueueResume(ctx, r, store.QueuedMessage{RunID: "other", SessionKey: "ws:a", Text: "x"}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("QueueResume with another run's message = %v, want ErrInvalid", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := h.Open(t, path, Config{})
	got, err := s2.Resume(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !got.OriginStartedAt.Equal(T0) || !got.CreatedAt.Equal(r.CreatedAt) {
		t.Errorf("Resume times = %v, %v; want %v, %v", got.OriginStartedAt, got.CreatedAt, T0, r.CreatedAt)
	}
	got.OriginStartedAt, got.CreatedAt = r.OriginStartedAt, r.CreatedAt
	if got != r {
		t.Errorf("Resume = %+v, want %+v", got, r)
	}
	EqStrings(t, "queued after reopen", QueuedTexts(t, s2), []string{id + "=do it", "behind=later"})
}
