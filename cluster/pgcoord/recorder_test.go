package pgcoord

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"
	"github.com/turnguard/turnguard/store/storetest"
)

// The store's event recorder and the claims agree on a claimed turn,
// whatever order they write in: the user's message and the ending are in
// the history once, the outbox has one row of each kind, the turn keeps
// the limits its TurnStarted carried, and no event batch fails.
func TestRecorderAndClaimsWriteEachTurnOnce(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	s, err := postgres.Open(ctx, url, postgres.Options{Shared: true, Logger: quiet, OutboxChannels: []string{"telegram"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, b := join(t, url, "a", 30*time.Second), join(t, url, "b", 30*time.Second)
	p := db(t, url)
	deadline := storetest.T0.Add(time.Minute)
	started := func(tr *storetest.Turn) event.Event {
		return tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text, e.Deadline = "hi", deadline })
	}
	aborted := func(tr *storetest.Turn) event.Event {
		return tr.Ev(event.Aborted, 5*time.Second, func(e *event.Event) {
			e.StopReason, e.FullText, e.Message, e.Elapsed = event.ReasonTimeout, "partial", "⏱️ timed out", 5*time.Second
			e.Step = storetest.Step("tool", "shell", 1, time.Second)
		})
	}
	claim := func(r *Replica, run, session string) {
		t.Helper()
		if err := r.Claim(ctx, Claim{RunID: run, SessionKey: session, Channel: "telegram", ChatRef: "42", Text: "hi"}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(run string, wantState store.TurnState, wantReason event.StopReason, wantAssistant string, wantOutbox int) {
		t.Helper()
		turn, err := s.Turn(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		if turn.State != wantState || turn.StopReason != wantReason {
			t.Errorf("%s: %s (%s), want %s (%s)", run, turn.State, turn.StopReason, wantState, wantReason)
		}
		if n := count(t, p, `SELECT count(*) FROM messages WHERE run_id = $1 AND role = 'user'`, run); n != 1 {
			t.Errorf("%s: %d user messages, want 1", run, n)
		}
		got := texts(t, p, `SELECT text FROM messages WHERE run_id = $1 AND role = 'assistant' ORDER BY id`, run)
		if fmt.Sprint(got) != fmt.Sprint([]string{wantAssistant}) {
			t.Errorf("%s: assistant messages %q, want [%q]", run, got, wantAssistant)
		}
		if n := count(t, p, `SELECT count(*) FROM outbox WHERE run_id = $1`, run); n != wantOutbox {
			t.Errorf("%s: %d outbox rows, want %d", run, n, wantOutbox)
		}
	}
	ending := store.EndingOf(&event.Event{Kind: event.Aborted, FullText: "partial", Message: "⏱️ timed out"}, time.Time{})
	outboxRows := len(store.EndingOutbox(&event.Event{Kind: event.Aborted, StopReason: event.ReasonTimeout, RunID: "x",
		FullText: "partial", Message: "⏱️ timed out"}))

	// The engine's order: claim, TurnStarted recorded, Finish, the
	// terminal event recorded.
	tr1 := storetest.NewTurn("run-1", "telegram:1")
	claim(a, "run-1", "telegram:1")
	s.Handle(started(tr1))
	s.Handle(tr1.Ev(event.StepStarted, time.Second, func(e *event.Event) { e.Step = storetest.Step("tool", "shell", 1, time.Second) }))
	storetest.Flush(t, s)
	end := aborted(tr1)
	if err := a.Finish(ctx, end); err != nil {
		t.Fatal(err)
	}
	s.Handle(end)
	storetest.Flush(t, s)
	check("run-1", store.TurnAborted, event.ReasonTimeout, ending.Text, outboxRows)
	if turn, _ := s.Turn(ctx, "run-1"); !turn.Deadline.Equal(deadline) || turn.CurrentStep.Name != "shell" {
		t.Errorf("run-1: deadline %v, step %+v; want the TurnStarted's deadline and the step Finish recorded", turn.Deadline, turn.CurrentStep)
	}

	// The recorder lagging: Finish commits before the recorder writes the
	// turn's TurnStarted, which must not start it again.
	tr2 := storetest.NewTurn("run-2", "telegram:2")
	claim(a, "run-2", "telegram:2")
	end = aborted(tr2)
	if err := a.Finish(ctx, end); err != nil {
		t.Fatal(err)
	}
	s.Handle(started(tr2))
	s.Handle(end)
	storetest.Flush(t, s)
	check("run-2", store.TurnAborted, event.ReasonTimeout, ending.Text, outboxRows)

	// A stale owner's recorder: the turn was taken over; the events its
	// replica had published before its fence change nothing.
	tr3 := storetest.NewTurn("run-3", "telegram:3")
	claim(a, "run-3", "telegram:3")
	expire(t, p, a)
	if _, err := b.Survey(ctx); err != nil {
		t.Fatal(err)
	}
	s.Handle(started(tr3))
	s.Handle(aborted(tr3))
	storetest.Flush(t, s)
	check("run-3", store.TurnAborted, event.ReasonInterrupted, "⚠️ interrupted: run-3", 1)

	// The one-process recovery leaves a claimed turn to its replica.
	claim(b, "run-4", "telegram:4")
	running, err := s.RunningTurns(ctx)
	if err != nil || len(running) != 0 {
		t.Errorf("RunningTurns = %d turns, %v; want none (run-4 is b's claim)", len(running), err)
	}
	if won, err := s.MarkInterrupted(ctx, "run-4", "interrupted"); won || err != nil {
		t.Errorf("MarkInterrupted of a claimed turn = %v, %v; want false", won, err)
	}
	if st := s.Stats(); st.Failed != 0 {
		t.Errorf("%d events failed to be written", st.Failed)
	}
	if err := s.Health(); err != nil {
		t.Errorf("store health: %v", err)
	}
	if errors.Is(b.Err(), ErrFenced) {
		t.Errorf("b fenced: %v", b.Err())
	}
}
