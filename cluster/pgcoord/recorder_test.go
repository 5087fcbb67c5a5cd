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

// A claim writes its turn's limits and sender with the turn's row, so they
// are there before the recorder writes anything of the turn; the store's
// recorder then writes nothing for a TurnStarted of a claim of its own
// process (postgres.Claims) that carries the same limits — the row keeps
// what the claim wrote, even if changed meanwhile (a sentinel here) — and
// writes the limits as before when they differ, when the claim is another
// process's (not in the store's Claims), and never restarts a turn whose
// Finish came first.
func TestClaimWritesTheLimits(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	s := sharedStore(t, url)
	mine := join(t, url, "mine", 30*time.Second, func(o *Options) { o.Claims = s.Claims() })
	other := join(t, url, "other", 30*time.Second)
	p := db(t, url)
	claimed := postgres.Limits{Deadline: storetest.T0.Add(time.Minute), Ceiling: storetest.T0.Add(time.Hour),
		StepTimeout: 30 * time.Second, Sender: "ann"}
	reloaded := postgres.Limits{Deadline: storetest.T0.Add(2 * time.Minute), StepTimeout: time.Minute, Sender: "ann"}
	sentinel := storetest.T0.Add(24 * time.Hour)
	limitsOf := func(run string) postgres.Limits {
		t.Helper()
		turn, err := s.Turn(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		return postgres.Limits{Deadline: turn.Deadline, Ceiling: turn.Ceiling, StepTimeout: turn.StepTimeout, Sender: turn.Sender}
	}
	for i, c := range []struct {
		name        string
		by          *Replica
		claim       postgres.Limits // what the claim writes
		started     postgres.Limits // what the TurnStarted carries
		finishFirst bool
		want        postgres.Limits // the row's after the recorder's batch
	}{
		{name: "this process's claim, same limits: nothing written", by: mine, claim: claimed, started: claimed,
			want: postgres.Limits{Deadline: sentinel, Ceiling: claimed.Ceiling, StepTimeout: claimed.StepTimeout, Sender: claimed.Sender}},
		{name: "this process's claim, the limits changed before the start", by: mine, claim: claimed, started: reloaded, want: reloaded},
		{name: "another process's claim", by: other, started: claimed, want: claimed},
		{name: "started after its Finish", by: mine, claim: claimed, started: reloaded, finishFirst: true,
			want: postgres.Limits{Deadline: sentinel, Ceiling: claimed.Ceiling, StepTimeout: claimed.StepTimeout, Sender: claimed.Sender}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := storetest.NewTurn(fmt.Sprintf("run-%d", i), fmt.Sprintf("telegram:%d", i))
			if err := c.by.Claim(ctx, Claim{RunID: tr.Run, SessionKey: tr.Session, Channel: tr.Channel, ChatRef: tr.Chat,
				Text: "hi", Limits: c.claim}); err != nil {
				t.Fatal(err)
			}
			// Right after the claim, before any batch of the recorder.
			if got := limitsOf(tr.Run); !sameLimits(got, c.claim) {
				t.Errorf("after the claim: %+v, want the claim's %+v", got, c.claim)
			}
			if _, err := p.Exec(ctx, `UPDATE turns SET deadline_at = $2 WHERE run_id = $1`, tr.Run, sentinel); err != nil {
				t.Fatal(err)
			}
			end := tr.Ev(event.Finished, 2*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "done" })
			if c.finishFirst {
				if err := c.by.Finish(ctx, end); err != nil {
					t.Fatal(err)
				}
			}
			s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) {
				e.Text, e.Deadline, e.Ceiling, e.StepTimeout, e.Sender = "hi", c.started.Deadline, c.started.Ceiling,
					c.started.StepTimeout, c.started.Sender
			}))
			storetest.Flush(t, s)
			if got := limitsOf(tr.Run); !sameLimits(got, c.want) {
				t.Errorf("after the recorder's batch: %+v, want %+v", got, c.want)
			}
			wantState := store.TurnRunning
			if c.finishFirst {
				wantState = store.TurnFinished
			}
			if turn, _ := s.Turn(ctx, tr.Run); turn.State != wantState {
				t.Errorf("state %s, want %s", turn.State, wantState)
			}
			if n := count(t, p, `SELECT count(*) FROM messages WHERE run_id = $1 AND role = 'user'`, tr.Run); n != 1 {
				t.Errorf("%d user messages, want 1", n)
			}
		})
	}
	if st := s.Stats(); st.Failed != 0 {
		t.Errorf("%d events failed to be written", st.Failed)
	}
}

// sameLimits compares limits as the row stores them (microseconds).
func sameLimits(a, b postgres.Limits) bool {
	return a.Deadline.Truncate(time.Microsecond).Equal(b.Deadline.Truncate(time.Microsecond)) &&
		a.Ceiling.Truncate(time.Microsecond).Equal(b.Ceiling.Truncate(time.Microsecond)) &&
		a.StepTimeout == b.StepTimeout && a.Sender == b.Sender
}

// sharedStore is a replica's store (shared mode) on url, closed at the
// test's end.
func sharedStore(t *testing.T, url string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), url, postgres.Options{Shared: true, Logger: quiet, OutboxChannels: []string{"telegram"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
