package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

func testRecordFinishedTurn(t *testing.T, h *H) {
	path := h.New(t)
	s := h.Open(t, path, Config{})
	tr := NewTurn("run-1", "telegram:42")
	llm := Step(event.StepLLM, "gpt-4o", 1, time.Second)
	tool := Step(event.StepTool, "web_search", 2, 3*time.Second)
	HandleAll(s,
		tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "What's the weather in Paris?" }),
		tr.Ev(event.StepStarted, time.Second, func(e *event.Event) { e.Step = llm }),
		tr.Ev(event.StepCompleted, 3*time.Second, func(e *event.Event) { e.Step = llm }),
		tr.Ev(event.StepStarted, 3*time.Second, func(e *event.Event) { e.Step = tool }),
		tr.Ev(event.Delta, 4*time.Second, func(e *event.Event) { e.Text, e.FullText = "Sun", "Sun" }),
		tr.Ev(event.StepCompleted, 10*time.Second, func(e *event.Event) { e.Step = tool }),
		tr.Ev(event.Finished, 12*time.Second, func(e *event.Event) {
			e.StopReason, e.FullText = event.ReasonStop, "Sunny, 21°C."
		}),
	)
	Flush(t, s)

	wantHistory := []Msg{
		{store.RoleUser, "What's the weather in Paris?", ""},
		{store.RoleAssistant, "Sunny, 21°C.", event.ReasonStop},
	}
	hist := MustHistory(t, s, "telegram:42")
	if got := Msgs(hist); !slices.Equal(got, wantHistory) {
		t.Errorf("history = %+v, want %+v", got, wantHistory)
	}
	if !hist[0].Time.Equal(T0) || !hist[1].Time.Equal(T0.Add(12*time.Second)) || hist[1].RunID != "run-1" {
		t.Errorf("history times/run = %v %v %q", hist[0].Time, hist[1].Time, hist[1].RunID)
	}

	got := MustTurn(t, s, "run-1")
	want := store.Turn{
		RunID: "run-1", SessionKey: "telegram:42", Channel: "telegram", ChatRef: "42",
		State: store.TurnFinished, StopReason: event.ReasonStop,
		StartedAt: T0, UpdatedAt: T0.Add(12 * time.Second), EndedAt: T0.Add(12 * time.Second),
		LastStep: event.Step{Kind: event.StepTool, Name: "web_search", Seq: 2},
	}
	if got != want {
		t.Errorf("turn =\n%+v\nwant\n%+v", got, want)
	}

	j, err := s.Journal(context.Background(), store.Filter{RunID: "run-1"})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []event.Kind
	for _, e := range j {
		kinds = append(kinds, e.Kind)
	}
	wantKinds := []event.Kind{event.TurnStarted, event.StepStarted, event.StepCompleted, event.StepStarted,
		event.StepCompleted, event.Finished} // no Delta
	if !slices.Equal(kinds, wantKinds) {
		t.Errorf("journal kinds = %v, want %v", kinds, wantKinds)
	}
	if e := j[4]; e.Step.Name != "web_search" || e.Elapsed != 7*time.Second || e.Seq != 6 {
		t.Errorf("tool completion entry = %+v, want web_search, 7s, seq 6", e)
	}
	if e := j[5]; e.Message != "" || e.StopReason != event.ReasonStop || e.KindName != "finished" {
		t.Errorf("finished entry = %+v: the reply is in the history, not the journal", e)
	}

	ss, err := s.Sessions(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	wantSessions := []store.Session{{Key: "telegram:42", CreatedAt: T0, UpdatedAt: T0.Add(12 * time.Second), Messages: 2}}
	if !slices.Equal(ss, wantSessions) {
		t.Errorf("sessions = %+v, want %+v", ss, wantSessions)
	}

	// Everything is still there after a restart.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := h.Open(t, path, Config{})
	if got := Msgs(MustHistory(t, s2, "telegram:42")); !slices.Equal(got, wantHistory) {
		t.Errorf("history after reopen = %+v, want %+v", got, wantHistory)
	}
	if got := MustTurn(t, s2, "run-1"); got != want {
		t.Errorf("turn after reopen = %+v, want %+v", got, want)
	}
}

func testTurnEndingsInHistory(t *testing.T, h *H) {
	cur := Step(event.StepTool, "web_search", 2, time.Second)
	last := Step(event.StepLLM, "gpt-4o", 1, 0)
	tests := []struct {
		name      string
		end       func(*event.Event)
		kind      event.Kind
		wantState store.TurnState
		wantMsg   []Msg // after the user's message
		wantCur   event.Step
	}{
		{
			name: "timeout with partial reply: partial, blank line, notice",
			kind: event.Aborted,
			end: func(e *event.Event) {
				e.StopReason, e.Elapsed, e.Step, e.LastStep = event.ReasonTimeout, 10*time.Minute, cur, last
				e.FullText, e.Message = "I found three fl", "⚠️ This request was stopped at its time limit of 10m0s."
			},
			wantState: store.TurnAborted,
			wantMsg: []Msg{{store.RoleAssistant, "I found three fl\n\n⚠️ This request was stopped at its time limit of 10m0s.",
				event.ReasonTimeout}},
			wantCur: event.Step{Kind: event.StepTool, Name: "web_search", Seq: 2},
		},
		{
			name: "user stop without partial reply: the notice",
			kind: event.Aborted,
			end: func(e *event.Event) {
				e.StopReason, e.Elapsed, e.Message = event.ReasonUser, 5*time.Second, "⏹️ Stopped after 5s."
			},
			wantState: store.TurnAborted,
			wantMsg:   []Msg{{store.RoleAssistant, "⏹️ Stopped after 5s.", event.ReasonUser}},
		},
		{
			name: "runner error: the error notice",
			kind: event.Finished,
			end: func(e *event.Event) {
				e.StopReason, e.Message = event.ReasonError, "⚠️ Something went wrong: upstream 502"
			},
			wantState: store.TurnFinished,
			wantMsg:   []Msg{{store.RoleAssistant, "⚠️ Something went wrong: upstream 502", event.ReasonError}},
		},
		{
			name:      "empty reply adds no message",
			kind:      event.Finished,
			end:       func(e *event.Event) { e.StopReason = event.ReasonStop },
			wantState: store.TurnFinished,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := h.New(t)
			s := h.Open(t, path, Config{})
			tr := NewTurn("run-1", "s")
			HandleAll(s,
				tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "book a flight" }),
				tr.Ev(tc.kind, 10*time.Minute, tc.end))
			Flush(t, s)
			s.Close()

			// As chat.history shows it after a restart.
			s = h.Open(t, path, Config{})
			want := append([]Msg{{store.RoleUser, "book a flight", ""}}, tc.wantMsg...)
			if got := Msgs(MustHistory(t, s, "s")); !slices.Equal(got, want) {
				t.Errorf("history = %q, want %q", got, want)
			}
			got := MustTurn(t, s, "run-1")
			if got.State != tc.wantState || got.CurrentStep != tc.wantCur || !got.EndedAt.Equal(T0.Add(10*time.Minute)) {
				t.Errorf("turn = %+v, want state %s, current step %+v, ended at +10m", got, tc.wantState, tc.wantCur)
			}
		})
	}
}

func testTurnEndsOnce(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	tr := NewTurn("run-1", "s")
	HandleAll(s,
		tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "hi" }),
		tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "hi" }), // duplicate
		tr.Ev(event.Aborted, time.Minute, func(e *event.Event) {
			e.StopReason, e.Message = event.ReasonStepTimeout, "⚠️ No progress for 1m."
		}),
		tr.Ev(event.ForceFinalized, 2*time.Minute, func(e *event.Event) { e.StopReason = event.ReasonStepTimeout }),
		// A runner that returned late cannot overturn the abort.
		tr.Ev(event.Finished, 3*time.Minute, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "late" }),
		// Nor can its late steps move the step the turn was stopped in.
		tr.Ev(event.StepStarted, 3*time.Minute, func(e *event.Event) { e.Step = Step("llm", "late", 9, 3*time.Minute) }),
	)
	Flush(t, s)
	want := []Msg{{store.RoleUser, "hi", ""}, {store.RoleAssistant, "⚠️ No progress for 1m.", event.ReasonStepTimeout}}
	if got := Msgs(MustHistory(t, s, "s")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
	got := MustTurn(t, s, "run-1")
	if got.State != store.TurnAborted || got.StopReason != event.ReasonStepTimeout || !got.CurrentStep.IsZero() ||
		!got.EndedAt.Equal(T0.Add(time.Minute)) {
		t.Errorf("turn = %+v, want aborted step_timeout at +1m with no step", got)
	}
}

func testTurnEndWithoutStartIsRecorded(t *testing.T, h *H) {
	// TurnStarted was dropped (queue full): the ending still lands.
	s := h.Open(t, h.New(t), Config{})
	tr := NewTurn("run-1", "s")
	tr.Seq = 7
	s.Handle(tr.Ev(event.Aborted, time.Hour, func(e *event.Event) {
		e.StopReason, e.Elapsed, e.Message = event.ReasonMaxTurnTime, 30*time.Minute, "⚠️ maximum time"
		e.LastStep = Step("llm", "gpt-4o", 3, 0)
	}))
	Flush(t, s)
	want := []Msg{{store.RoleAssistant, "⚠️ maximum time", event.ReasonMaxTurnTime}}
	if got := Msgs(MustHistory(t, s, "s")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
	got := MustTurn(t, s, "run-1")
	if got.State != store.TurnAborted || !got.StartedAt.Equal(T0.Add(30*time.Minute)) || got.LastStep.Name != "gpt-4o" {
		t.Errorf("turn = %+v, want aborted, started 30m before the abort, last step gpt-4o", got)
	}
}

func testReusedRunIDStartsAfresh(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	for i, text := range []string{"first", "second"} {
		tr := NewTurn("same-key", "s")
		at := time.Duration(i) * time.Hour
		HandleAll(s,
			tr.Ev(event.TurnStarted, at, func(e *event.Event) { e.Text = text }),
			tr.Ev(event.Finished, at+time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "re: "+text }))
	}
	Flush(t, s)
	want := []Msg{
		{store.RoleUser, "first", ""}, {store.RoleAssistant, "re: first", event.ReasonStop},
		{store.RoleUser, "second", ""}, {store.RoleAssistant, "re: second", event.ReasonStop},
	}
	if got := Msgs(MustHistory(t, s, "s")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
	if got := MustTurn(t, s, "same-key"); !got.StartedAt.Equal(T0.Add(time.Hour)) {
		t.Errorf("turn started %v, want the second turn's start", got.StartedAt)
	}
}

func testStepTracking(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	tr := NewTurn("run-1", "s")
	a := Step("llm", "gpt-4o", 1, 0)
	b := Step("tool", "http_get", 2, time.Second)
	HandleAll(s,
		tr.Ev(event.TurnStarted, 0, nil),
		tr.Ev(event.StepStarted, 0, func(e *event.Event) { e.Step = a }),
		tr.Ev(event.StepCompleted, time.Second, func(e *event.Event) { e.Step = a }),
		tr.Ev(event.StepStarted, time.Second, func(e *event.Event) { e.Step = b }),
	)
	Flush(t, s)
	got := MustTurn(t, s, "run-1")
	wantCur, wantLast := event.Step{Kind: "tool", Name: "http_get", Seq: 2}, event.Step{Kind: "llm", Name: "gpt-4o", Seq: 1}
	if got.State != store.TurnRunning || got.CurrentStep != wantCur || got.LastStep != wantLast || !got.EndedAt.IsZero() {
		t.Errorf("turn = %+v, want running in %+v after %+v", got, wantCur, wantLast)
	}
}

func testInvalidEventsAreCountedNotWritten(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	tr := NewTurn("run-1", "s")
	HandleAll(s,
		tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "ok" }),
		event.Event{Kind: event.TurnStarted, SessionKey: "s", Text: "no run id"},
		event.Event{Kind: event.Finished, RunID: "run-x", Text: "no session"},
		event.Event{Kind: event.Kind(200), RunID: "run-y", SessionKey: "s"},
		tr.Ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "fine" }),
	)
	Flush(t, s)
	st := s.Stats()
	if st.Enqueued != 5 || st.Written != 2 || st.Failed != 3 || st.Dropped != 0 {
		t.Errorf("stats = %+v, want 5 enqueued, 2 written, 3 failed", st)
	}
	want := []Msg{{store.RoleUser, "ok", ""}, {store.RoleAssistant, "fine", event.ReasonStop}}
	if got := Msgs(MustHistory(t, s, "s")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
}

func testCloseWritesQueuedEventsThenDrops(t *testing.T, h *H) {
	path := h.New(t)
	s, err := h.OpenErr(t, path, Config{BatchSize: 7})
	if err != nil {
		t.Fatal(err)
	}
	const turns = 50
	for i := range turns {
		tr := NewTurn(fmt.Sprintf("run-%02d", i), "s")
		HandleAll(s,
			tr.Ev(event.TurnStarted, time.Duration(i)*time.Second, func(e *event.Event) { e.Text = "q" }),
			tr.Ev(event.Finished, time.Duration(i)*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "a" }))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.Handle(NewTurn("late", "s").Ev(event.TurnStarted, 0, nil))
	if got := s.Stats().Dropped; got != 1 {
		t.Errorf("Handle after Close: Dropped() = %d, want 1", got)
	}
	if err := s.Flush(context.Background()); err != nil {
		t.Errorf("Flush after Close with nothing pending = %v, want nil", err)
	}
	if _, err := s.History(context.Background(), "s", 0); !errors.Is(err, store.ErrClosed) {
		t.Errorf("History after Close = %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}

	s = h.Open(t, path, Config{})
	if got := len(MustHistory(t, s, "s")); got != 2*turns {
		t.Errorf("history after Close and reopen has %d messages, want %d", got, 2*turns)
	}
}

func testHistoryLimitKeepsTheMostRecent(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	for i := range 5 {
		tr := NewTurn(fmt.Sprintf("run-%d", i), "s")
		s.Handle(tr.Ev(event.TurnStarted, time.Duration(i)*time.Second, func(e *event.Event) { e.Text = fmt.Sprint("m", i) }))
	}
	Flush(t, s)
	hist, err := s.History(context.Background(), "s", 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []Msg{{store.RoleUser, "m3", ""}, {store.RoleUser, "m4", ""}}
	if got := Msgs(hist); !slices.Equal(got, want) {
		t.Errorf("History(limit 2) = %q, want %q", got, want)
	}
	if hist, err := s.History(context.Background(), "nobody", 0); err != nil || len(hist) != 0 {
		t.Errorf("History of an unknown session = %v, %v; want empty", hist, err)
	}
}

func testSessionsMostRecentFirst(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	for i, key := range []string{"a", "b", "c"} {
		tr := NewTurn("run-"+key, key)
		s.Handle(tr.Ev(event.TurnStarted, time.Duration(i)*time.Minute, func(e *event.Event) { e.Text = "x" }))
	}
	Flush(t, s)
	ss, err := s.Sessions(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, x := range ss {
		keys = append(keys, x.Key)
	}
	if want := []string{"c", "b"}; !slices.Equal(keys, want) {
		t.Errorf("Sessions(2) = %v, want %v", keys, want)
	}
}

func testRunningTurnsAndMarkInterrupted(t *testing.T, h *H) {
	path := h.New(t)
	s := h.Open(t, path, Config{})
	a, b, c := NewTurn("run-a", "s1"), NewTurn("run-b", "s2"), NewTurn("run-c", "s1")
	HandleAll(s,
		a.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "a?" }),
		b.Ev(event.TurnStarted, time.Second, func(e *event.Event) { e.Text = "b?" }),
		c.Ev(event.TurnStarted, 2*time.Second, func(e *event.Event) { e.Text = "c?" }),
		b.Ev(event.Finished, 3*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "b." }),
		a.Ev(event.StepStarted, 4*time.Second, func(e *event.Event) { e.Step = Step("tool", "exec", 1, 4*time.Second) }),
	)
	Flush(t, s)
	s.Close() // the process stops with run-a and run-c running

	s = h.Open(t, path, Config{})
	running, err := s.RunningTurns(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range running {
		ids = append(ids, r.RunID)
	}
	if want := []string{"run-a", "run-c"}; !slices.Equal(ids, want) {
		t.Fatalf("RunningTurns = %v, want %v", ids, want)
	}
	if running[0].Channel != "telegram" || running[0].ChatRef != "42" {
		t.Errorf("running turn %+v lacks the channel and chat to notify", running[0])
	}

	const notice = "⚠️ Your request was interrupted by a server problem. Please send it again."
	ok, err := s.MarkInterrupted(context.Background(), "run-a", notice)
	if err != nil || !ok {
		t.Fatalf("MarkInterrupted(run-a) = %v, %v; want true", ok, err)
	}
	if ok, err := s.MarkInterrupted(context.Background(), "run-a", notice); err != nil || ok {
		t.Errorf("second MarkInterrupted(run-a) = %v, %v; want false", ok, err)
	}
	if ok, err := s.MarkInterrupted(context.Background(), "run-b", notice); err != nil || ok {
		t.Errorf("MarkInterrupted of a finished turn = %v, %v; want false", ok, err)
	}
	if _, err := s.MarkInterrupted(context.Background(), "nope", notice); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("MarkInterrupted of an unknown turn = %v, want ErrNotFound", err)
	}

	want := []Msg{
		{store.RoleUser, "a?", ""}, {store.RoleUser, "c?", ""},
		{store.RoleAssistant, notice, event.ReasonInterrupted},
	}
	if got := Msgs(MustHistory(t, s, "s1")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
	got := MustTurn(t, s, "run-a")
	if got.State != store.TurnAborted || got.StopReason != event.ReasonInterrupted || got.EndedAt.IsZero() ||
		got.CurrentStep.Name != "exec" {
		t.Errorf("interrupted turn = %+v", got)
	}
	j, err := s.Journal(context.Background(), store.Filter{RunID: "run-a"})
	if err != nil {
		t.Fatal(err)
	}
	if e := j[len(j)-1]; e.Kind != event.Aborted || e.StopReason != event.ReasonInterrupted || e.Message != notice ||
		e.Step.Name != "exec" {
		t.Errorf("last journal entry = %+v, want the interruption", e)
	}
	running, _ = s.RunningTurns(context.Background())
	if len(running) != 1 || running[0].RunID != "run-c" {
		t.Errorf("RunningTurns after = %+v, want only run-c", running)
	}
}

func testMarkInterruptedExactlyOnceUnderConcurrency(t *testing.T, h *H) {
	path := h.New(t)
	s1 := h.Open(t, path, Config{})
	s1.Handle(NewTurn("run-1", "s").Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "q" }))
	Flush(t, s1)
	// Two stores on one file stand in for two processes racing at start-up
	// (the lock file would refuse the second).
	s2 := h.Open(t, path, Config{SecondProcess: true})

	const callers = 50
	var wg sync.WaitGroup
	results := make(chan bool, callers)
	errs := make(chan error, callers)
	for i := range callers {
		s := s1
		if i%2 == 1 {
			s = s2
		}
		wg.Go(func() {
			ok, err := s.MarkInterrupted(context.Background(), "run-1", "restarted")
			if err != nil {
				errs <- err
			}
			results <- ok
		})
	}
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		t.Errorf("MarkInterrupted: %v", err)
	}
	wins := 0
	for ok := range results {
		if ok {
			wins++
		}
	}
	if wins != 1 {
		t.Errorf("%d of %d callers won, want exactly 1", wins, callers)
	}
	want := []Msg{{store.RoleUser, "q", ""}, {store.RoleAssistant, "restarted", event.ReasonInterrupted}}
	if got := Msgs(MustHistory(t, s1, "s")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
}

func testQueriesAfterCloseReturnErrClosed(t *testing.T, h *H) {
	s, err := h.OpenErr(t, h.New(t), Config{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"Sessions":        func() error { _, err := s.Sessions(ctx, 0); return err },
		"Turn":            func() error { _, err := s.Turn(ctx, "x"); return err },
		"RunningTurns":    func() error { _, err := s.RunningTurns(ctx); return err },
		"MarkInterrupted": func() error { _, err := s.MarkInterrupted(ctx, "x", ""); return err },
		"Journal":         func() error { _, err := s.Journal(ctx, store.Filter{}); return err },
		"StallHistory":    func() error { _, err := s.StallHistory(ctx, store.Filter{}); return err },
		"Enqueue": func() error {
			_, err := s.Enqueue(ctx, store.OutboxMessage{Channel: "ws", RunID: "r", Kind: store.OutboxFinal, Text: "t"})
			return err
		},
		"MarkDelivered": func() error { return s.MarkDelivered(ctx, 1) },
		"Pending":       func() error { _, err := s.Pending(ctx, "", 0); return err },
		"Counts":        func() error { _, err := s.Counts(ctx); return err },
	} {
		if err := call(); !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		}
	}
}

func testTurnDeadlinesRecorded(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	tr := NewTurn("run-d", "s")
	noCeiling := NewTurn("run-n", "s2")
	HandleAll(s,
		tr.Ev(event.TurnStarted, 0, func(e *event.Event) {
			e.Deadline, e.Ceiling, e.StepTimeout = T0.Add(30*time.Minute), T0.Add(time.Hour), 5*time.Minute
		}),
		noCeiling.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Deadline = T0.Add(time.Minute) }),
	)
	Flush(t, s)
	got := MustTurn(t, s, "run-d")
	if !got.Deadline.Equal(T0.Add(30*time.Minute)) || !got.Ceiling.Equal(T0.Add(time.Hour)) || got.StepTimeout != 5*time.Minute {
		t.Errorf("turn limits = deadline %v ceiling %v step %v", got.Deadline, got.Ceiling, got.StepTimeout)
	}
	got = MustTurn(t, s, "run-n")
	if !got.Deadline.Equal(T0.Add(time.Minute)) || !got.Ceiling.IsZero() || got.StepTimeout != 0 {
		t.Errorf("turn without ceiling or step timeout = %+v", got)
	}
}

// testResetDuringTurnKeepsItsReplyOut: /new while a turn runs (issue 20,
// defect 4): the turn ends after the reset point, yet its reply is the old
// conversation's — a history read from the store (after an eviction, on
// another replica) must not show it, in this process and after reopening.
func testResetDuringTurnKeepsItsReplyOut(t *testing.T, h *H) {
	path := h.New(t)
	s, err := h.OpenErr(t, path, Config{})
	if err != nil {
		t.Fatal(err)
	}
	old := NewTurn("run-old", "telegram:42")
	fresh := NewTurn("run-new", "telegram:42")
	HandleAll(s,
		old.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "before" }),
		event.Event{Kind: event.SessionReset, SessionKey: "telegram:42", Time: T0.Add(time.Second)},
		old.Ev(event.Aborted, 2*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonUser, "old reply" }),
		fresh.Ev(event.TurnStarted, 3*time.Second, func(e *event.Event) { e.Text = "after" }),
		fresh.Ev(event.Finished, 4*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "new reply" }),
	)
	Flush(t, s)
	texts := func(h []store.Message) string {
		var out []string
		for _, m := range h {
			out = append(out, m.Text)
		}
		return strings.Join(out, "|")
	}
	if got := texts(MustHistory(t, s, "telegram:42")); got != "after|new reply" {
		t.Fatalf("history after /new during a turn = %q; want the old turn's reply left out", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := h.Open(t, path, Config{})
	if got := texts(MustHistory(t, s2, "telegram:42")); got != "after|new reply" {
		t.Fatalf("history after reopening = %q", got)
	}
}

// testSessionResetSurvivesRestart: after /new the history starts afresh, in
// this process and after the file is opened again.
func testSessionResetSurvivesRestart(t *testing.T, h *H) {
	path := h.New(t)
	s, err := h.OpenErr(t, path, Config{})
	if err != nil {
		t.Fatal(err)
	}
	old := NewTurn("run-old", "telegram:42")
	HandleAll(s,
		old.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "before" }),
		old.Ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "old reply" }),
		event.Event{Kind: event.SessionReset, SessionKey: "telegram:42", Time: T0.Add(2 * time.Second)},
	)
	fresh := NewTurn("run-new", "telegram:42")
	HandleAll(s,
		fresh.Ev(event.TurnStarted, 3*time.Second, func(e *event.Event) { e.Text = "after" }),
		fresh.Ev(event.Finished, 4*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "new reply" }),
	)
	Flush(t, s)
	texts := func(h []store.Message) (out []string) {
		for _, m := range h {
			out = append(out, m.Text)
		}
		return out
	}
	if got := texts(MustHistory(t, s, "telegram:42")); strings.Join(got, "|") != "after|new reply" {
		t.Fatalf("history after reset = %q", got)
	}
	if st := s.Stats(); st.Failed != 0 {
		t.Fatalf("reset counted as failed: %+v", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := h.Open(t, path, Config{})
	if got := texts(MustHistory(t, s2, "telegram:42")); strings.Join(got, "|") != "after|new reply" {
		t.Fatalf("history after reopening = %q", got)
	}
}
