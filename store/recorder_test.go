package store_test

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

func TestRecordFinishedTurn(t *testing.T) {
	path := dbPath(t)
	s := open(t, path, store.Options{})
	tr := newTurn("run-1", "telegram:42")
	llm := step(event.StepLLM, "gpt-4o", 1, time.Second)
	tool := step(event.StepTool, "web_search", 2, 3*time.Second)
	handleAll(s,
		tr.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "What's the weather in Paris?" }),
		tr.ev(event.StepStarted, time.Second, func(e *event.Event) { e.Step = llm }),
		tr.ev(event.StepCompleted, 3*time.Second, func(e *event.Event) { e.Step = llm }),
		tr.ev(event.StepStarted, 3*time.Second, func(e *event.Event) { e.Step = tool }),
		tr.ev(event.Delta, 4*time.Second, func(e *event.Event) { e.Text, e.FullText = "Sun", "Sun" }),
		tr.ev(event.StepCompleted, 10*time.Second, func(e *event.Event) { e.Step = tool }),
		tr.ev(event.Finished, 12*time.Second, func(e *event.Event) {
			e.StopReason, e.FullText = event.ReasonStop, "Sunny, 21°C."
		}),
	)
	flush(t, s)

	wantHistory := []msg{
		{store.RoleUser, "What's the weather in Paris?", ""},
		{store.RoleAssistant, "Sunny, 21°C.", event.ReasonStop},
	}
	h := mustHistory(t, s, "telegram:42")
	if got := msgs(h); !slices.Equal(got, wantHistory) {
		t.Errorf("history = %+v, want %+v", got, wantHistory)
	}
	if !h[0].Time.Equal(t0) || !h[1].Time.Equal(t0.Add(12*time.Second)) || h[1].RunID != "run-1" {
		t.Errorf("history times/run = %v %v %q", h[0].Time, h[1].Time, h[1].RunID)
	}

	got := mustTurn(t, s, "run-1")
	want := store.Turn{
		RunID: "run-1", SessionKey: "telegram:42", Channel: "telegram", ChatRef: "42",
		State: store.TurnFinished, StopReason: event.ReasonStop,
		StartedAt: t0, UpdatedAt: t0.Add(12 * time.Second), EndedAt: t0.Add(12 * time.Second),
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
	wantSessions := []store.Session{{Key: "telegram:42", CreatedAt: t0, UpdatedAt: t0.Add(12 * time.Second), Messages: 2}}
	if !slices.Equal(ss, wantSessions) {
		t.Errorf("sessions = %+v, want %+v", ss, wantSessions)
	}

	// Everything is still there after a restart.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, path, store.Options{})
	if got := msgs(mustHistory(t, s2, "telegram:42")); !slices.Equal(got, wantHistory) {
		t.Errorf("history after reopen = %+v, want %+v", got, wantHistory)
	}
	if got := mustTurn(t, s2, "run-1"); got != want {
		t.Errorf("turn after reopen = %+v, want %+v", got, want)
	}
}

func TestTurnEndingsInHistory(t *testing.T) {
	cur := step(event.StepTool, "web_search", 2, time.Second)
	last := step(event.StepLLM, "gpt-4o", 1, 0)
	tests := []struct {
		name      string
		end       func(*event.Event)
		kind      event.Kind
		wantState store.TurnState
		wantMsg   []msg // after the user's message
		wantCur   event.Step
	}{
		{
			name: "timeout with partial reply: partial, blank line, notice",
			kind: event.Aborted,
			end: func(e *event.Event) {
				e.StopReason, e.Elapsed, e.Step, e.LastStep = event.ReasonTimeout, 10*time.Minute, cur, last
				e.FullText, e.Message = "I found three fl", "⚠️ This request hit its time limit of 10m0s."
			},
			wantState: store.TurnAborted,
			wantMsg: []msg{{store.RoleAssistant, "I found three fl\n\n⚠️ This request hit its time limit of 10m0s.",
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
			wantMsg:   []msg{{store.RoleAssistant, "⏹️ Stopped after 5s.", event.ReasonUser}},
		},
		{
			name: "runner error: the error notice",
			kind: event.Finished,
			end: func(e *event.Event) {
				e.StopReason, e.Message = event.ReasonError, "⚠️ Something went wrong: upstream 502"
			},
			wantState: store.TurnFinished,
			wantMsg:   []msg{{store.RoleAssistant, "⚠️ Something went wrong: upstream 502", event.ReasonError}},
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
			path := dbPath(t)
			s := open(t, path, store.Options{})
			tr := newTurn("run-1", "s")
			handleAll(s,
				tr.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "book a flight" }),
				tr.ev(tc.kind, 10*time.Minute, tc.end))
			flush(t, s)
			s.Close()

			// As chat.history shows it after a restart.
			s = open(t, path, store.Options{})
			want := append([]msg{{store.RoleUser, "book a flight", ""}}, tc.wantMsg...)
			if got := msgs(mustHistory(t, s, "s")); !slices.Equal(got, want) {
				t.Errorf("history = %q, want %q", got, want)
			}
			got := mustTurn(t, s, "run-1")
			if got.State != tc.wantState || got.CurrentStep != tc.wantCur || !got.EndedAt.Equal(t0.Add(10*time.Minute)) {
				t.Errorf("turn = %+v, want state %s, current step %+v, ended at +10m", got, tc.wantState, tc.wantCur)
			}
		})
	}
}

func TestTurnEndsOnce(t *testing.T) {
	s := open(t, dbPath(t), store.Options{})
	tr := newTurn("run-1", "s")
	handleAll(s,
		tr.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "hi" }),
		tr.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "hi" }), // duplicate
		tr.ev(event.Aborted, time.Minute, func(e *event.Event) {
			e.StopReason, e.Message = event.ReasonStepTimeout, "⚠️ No progress for 1m."
		}),
		tr.ev(event.ForceFinalized, 2*time.Minute, func(e *event.Event) { e.StopReason = event.ReasonStepTimeout }),
		// A runner that returned late cannot overturn the abort.
		tr.ev(event.Finished, 3*time.Minute, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "late" }),
		// Nor can its late steps move the step the turn was stopped in.
		tr.ev(event.StepStarted, 3*time.Minute, func(e *event.Event) { e.Step = step("llm", "late", 9, 3*time.Minute) }),
	)
	flush(t, s)
	want := []msg{{store.RoleUser, "hi", ""}, {store.RoleAssistant, "⚠️ No progress for 1m.", event.ReasonStepTimeout}}
	if got := msgs(mustHistory(t, s, "s")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
	got := mustTurn(t, s, "run-1")
	if got.State != store.TurnAborted || got.StopReason != event.ReasonStepTimeout || !got.CurrentStep.IsZero() ||
		!got.EndedAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("turn = %+v, want aborted step_timeout at +1m with no step", got)
	}
}

func TestTurnEndWithoutStartIsRecorded(t *testing.T) {
	// TurnStarted was dropped (queue full): the ending still lands.
	s := open(t, dbPath(t), store.Options{})
	tr := newTurn("run-1", "s")
	tr.seq = 7
	s.Handle(tr.ev(event.Aborted, time.Hour, func(e *event.Event) {
		e.StopReason, e.Elapsed, e.Message = event.ReasonMaxTurnTime, 30*time.Minute, "⚠️ maximum time"
		e.LastStep = step("llm", "gpt-4o", 3, 0)
	}))
	flush(t, s)
	want := []msg{{store.RoleAssistant, "⚠️ maximum time", event.ReasonMaxTurnTime}}
	if got := msgs(mustHistory(t, s, "s")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
	got := mustTurn(t, s, "run-1")
	if got.State != store.TurnAborted || !got.StartedAt.Equal(t0.Add(30*time.Minute)) || got.LastStep.Name != "gpt-4o" {
		t.Errorf("turn = %+v, want aborted, started 30m before the abort, last step gpt-4o", got)
	}
}

func TestReusedRunIDStartsAfresh(t *testing.T) {
	s := open(t, dbPath(t), store.Options{})
	for i, text := range []string{"first", "second"} {
		tr := newTurn("same-key", "s")
		at := time.Duration(i) * time.Hour
		handleAll(s,
			tr.ev(event.TurnStarted, at, func(e *event.Event) { e.Text = text }),
			tr.ev(event.Finished, at+time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "re: "+text }))
	}
	flush(t, s)
	want := []msg{
		{store.RoleUser, "first", ""}, {store.RoleAssistant, "re: first", event.ReasonStop},
		{store.RoleUser, "second", ""}, {store.RoleAssistant, "re: second", event.ReasonStop},
	}
	if got := msgs(mustHistory(t, s, "s")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
	if got := mustTurn(t, s, "same-key"); !got.StartedAt.Equal(t0.Add(time.Hour)) {
		t.Errorf("turn started %v, want the second turn's start", got.StartedAt)
	}
}

func TestStepTracking(t *testing.T) {
	s := open(t, dbPath(t), store.Options{})
	tr := newTurn("run-1", "s")
	a := step("llm", "gpt-4o", 1, 0)
	b := step("tool", "http_get", 2, time.Second)
	handleAll(s,
		tr.ev(event.TurnStarted, 0, nil),
		tr.ev(event.StepStarted, 0, func(e *event.Event) { e.Step = a }),
		tr.ev(event.StepCompleted, time.Second, func(e *event.Event) { e.Step = a }),
		tr.ev(event.StepStarted, time.Second, func(e *event.Event) { e.Step = b }),
	)
	flush(t, s)
	got := mustTurn(t, s, "run-1")
	wantCur, wantLast := event.Step{Kind: "tool", Name: "http_get", Seq: 2}, event.Step{Kind: "llm", Name: "gpt-4o", Seq: 1}
	if got.State != store.TurnRunning || got.CurrentStep != wantCur || got.LastStep != wantLast || !got.EndedAt.IsZero() {
		t.Errorf("turn = %+v, want running in %+v after %+v", got, wantCur, wantLast)
	}
}

func TestInvalidEventsAreCountedNotWritten(t *testing.T) {
	s := open(t, dbPath(t), store.Options{})
	tr := newTurn("run-1", "s")
	handleAll(s,
		tr.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "ok" }),
		event.Event{Kind: event.TurnStarted, SessionKey: "s", Text: "no run id"},
		event.Event{Kind: event.Finished, RunID: "run-x", Text: "no session"},
		event.Event{Kind: event.Kind(200), RunID: "run-y", SessionKey: "s"},
		tr.ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "fine" }),
	)
	flush(t, s)
	st := s.Stats()
	if st.Enqueued != 5 || st.Written != 2 || st.Failed != 3 || st.Dropped != 0 {
		t.Errorf("stats = %+v, want 5 enqueued, 2 written, 3 failed", st)
	}
	want := []msg{{store.RoleUser, "ok", ""}, {store.RoleAssistant, "fine", event.ReasonStop}}
	if got := msgs(mustHistory(t, s, "s")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
}

// heldWriter opens a store whose writer blocks before each batch until the
// test lets it go; entered reports each time it is held.
func heldWriter(t *testing.T, opts store.Options) (s *store.SQLite, entered <-chan struct{}, release func()) {
	t.Helper()
	in := make(chan struct{})
	gate := make(chan struct{})
	var once sync.Once
	s = open(t, dbPath(t), store.WithBeforeBatch(opts, func() {
		select {
		case in <- struct{}{}: // the test is watching: hold until released
			<-gate
		case <-gate: // released: run freely
		}
	}))
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release) // before Close (cleanups run last-in first-out)
	return s, in, release
}

func TestHandleDropsWhenQueueFull(t *testing.T) {
	s, entered, release := heldWriter(t, store.Options{QueueSize: 4})
	tr := newTurn("run-1", "s")
	s.Handle(tr.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "go" }))
	<-entered // the writer has taken the first event and is held

	// 4 fill the queue, 10 overflow. None may block: a blocked Handle hangs
	// the test (and the engine).
	for i := range 14 {
		s.Handle(tr.ev(event.Progress, time.Duration(i+1)*time.Second, func(e *event.Event) {
			e.Step = step("tool", "slow", 1, 0)
		}))
	}
	if got := s.Dropped(); got != 10 {
		t.Errorf("Dropped() = %d, want 10", got)
	}
	if got := s.QueueDepth(); got != 4 {
		t.Errorf("QueueDepth() = %d, want 4", got)
	}
	s.Handle(event.Event{Kind: event.Delta, RunID: "run-1", SessionKey: "s"}) // ignored, not dropped
	if got := s.Dropped(); got != 10 {
		t.Errorf("after a Delta, Dropped() = %d, want 10", got)
	}

	release()
	flush(t, s)
	j, err := s.Journal(context.Background(), store.Filter{RunID: "run-1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(j) != 5 {
		t.Errorf("journal has %d entries, want the 5 accepted events", len(j))
	}
	st := s.Stats()
	if st.Enqueued != 5 || st.Written != 5 || st.Dropped != 10 || st.QueueDepth != 0 {
		t.Errorf("stats = %+v", st)
	}
}

func TestFlushHonoursContext(t *testing.T) {
	s, entered, release := heldWriter(t, store.Options{})
	s.Handle(newTurn("run-1", "s").ev(event.TurnStarted, 0, nil))
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Flush(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Flush with a held writer and a cancelled context = %v, want context.Canceled", err)
	}
	release()
	flush(t, s)
}

func TestCloseWritesQueuedEventsThenDrops(t *testing.T) {
	path := dbPath(t)
	s, err := store.Open(context.Background(), path, store.Options{Logger: quiet, BatchSize: 7})
	if err != nil {
		t.Fatal(err)
	}
	const turns = 50
	for i := range turns {
		tr := newTurn(fmt.Sprintf("run-%02d", i), "s")
		handleAll(s,
			tr.ev(event.TurnStarted, time.Duration(i)*time.Second, func(e *event.Event) { e.Text = "q" }),
			tr.ev(event.Finished, time.Duration(i)*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "a" }))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.Handle(newTurn("late", "s").ev(event.TurnStarted, 0, nil))
	if got := s.Dropped(); got != 1 {
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

	s = open(t, path, store.Options{})
	if got := len(mustHistory(t, s, "s")); got != 2*turns {
		t.Errorf("history after Close and reopen has %d messages, want %d", got, 2*turns)
	}
}

func TestHistoryLimitKeepsTheMostRecent(t *testing.T) {
	s := open(t, dbPath(t), store.Options{})
	for i := range 5 {
		tr := newTurn(fmt.Sprintf("run-%d", i), "s")
		s.Handle(tr.ev(event.TurnStarted, time.Duration(i)*time.Second, func(e *event.Event) { e.Text = fmt.Sprint("m", i) }))
	}
	flush(t, s)
	h, err := s.History(context.Background(), "s", 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []msg{{store.RoleUser, "m3", ""}, {store.RoleUser, "m4", ""}}
	if got := msgs(h); !slices.Equal(got, want) {
		t.Errorf("History(limit 2) = %q, want %q", got, want)
	}
	if h, err := s.History(context.Background(), "nobody", 0); err != nil || len(h) != 0 {
		t.Errorf("History of an unknown session = %v, %v; want empty", h, err)
	}
}

func TestSessionsMostRecentFirst(t *testing.T) {
	s := open(t, dbPath(t), store.Options{})
	for i, key := range []string{"a", "b", "c"} {
		tr := newTurn("run-"+key, key)
		s.Handle(tr.ev(event.TurnStarted, time.Duration(i)*time.Minute, func(e *event.Event) { e.Text = "x" }))
	}
	flush(t, s)
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

func TestMemoryStore(t *testing.T) {
	s := open(t, ":memory:", store.Options{})
	tr := newTurn("run-1", "s")
	handleAll(s,
		tr.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "hi" }),
		tr.ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "hello" }))
	flush(t, s)
	want := []msg{{store.RoleUser, "hi", ""}, {store.RoleAssistant, "hello", event.ReasonStop}}
	if got := msgs(mustHistory(t, s, "s")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
	if _, err := s.Enqueue(context.Background(), store.OutboxMessage{Channel: "ws", RunID: "run-1",
		Kind: store.OutboxFinal, Text: "hello"}); err != nil {
		t.Errorf("Enqueue in memory: %v", err)
	}
}

func TestRunningTurnsAndMarkInterrupted(t *testing.T) {
	path := dbPath(t)
	s := open(t, path, store.Options{})
	a, b, c := newTurn("run-a", "s1"), newTurn("run-b", "s2"), newTurn("run-c", "s1")
	handleAll(s,
		a.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "a?" }),
		b.ev(event.TurnStarted, time.Second, func(e *event.Event) { e.Text = "b?" }),
		c.ev(event.TurnStarted, 2*time.Second, func(e *event.Event) { e.Text = "c?" }),
		b.ev(event.Finished, 3*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "b." }),
		a.ev(event.StepStarted, 4*time.Second, func(e *event.Event) { e.Step = step("tool", "exec", 1, 4*time.Second) }),
	)
	flush(t, s)
	s.Close() // the process stops with run-a and run-c running

	s = open(t, path, store.Options{})
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

	const notice = "⚠️ The gateway restarted while working on your request. Please send it again."
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

	want := []msg{
		{store.RoleUser, "a?", ""}, {store.RoleUser, "c?", ""},
		{store.RoleAssistant, notice, event.ReasonInterrupted},
	}
	if got := msgs(mustHistory(t, s, "s1")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
	got := mustTurn(t, s, "run-a")
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

func TestMarkInterruptedExactlyOnceUnderConcurrency(t *testing.T) {
	path := dbPath(t)
	s1 := open(t, path, store.Options{})
	s1.Handle(newTurn("run-1", "s").ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "q" }))
	flush(t, s1)
	// Two stores on one file stand in for two processes racing at start-up
	// (the lock file would refuse the second).
	s2 := open(t, path, store.Options{Unlocked: true})

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
	want := []msg{{store.RoleUser, "q", ""}, {store.RoleAssistant, "restarted", event.ReasonInterrupted}}
	if got := msgs(mustHistory(t, s1, "s")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
}

func TestOpenRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	if _, err := store.Open(ctx, "", store.Options{}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Open(\"\") = %v, want ErrInvalid", err)
	}
	missing := t.TempDir() + "/no/such/dir/x.db"
	if s, err := store.Open(ctx, missing, store.Options{}); err == nil {
		s.Close()
		t.Errorf("Open in a missing directory succeeded")
	}
}

func TestQueriesAfterCloseReturnErrClosed(t *testing.T) {
	s, err := store.Open(context.Background(), dbPath(t), store.Options{Logger: quiet})
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

func TestTurnDeadlinesRecorded(t *testing.T) {
	s := open(t, dbPath(t), store.Options{})
	tr := newTurn("run-d", "s")
	noCeiling := newTurn("run-n", "s2")
	handleAll(s,
		tr.ev(event.TurnStarted, 0, func(e *event.Event) {
			e.Deadline, e.Ceiling, e.StepTimeout = t0.Add(30*time.Minute), t0.Add(time.Hour), 5*time.Minute
		}),
		noCeiling.ev(event.TurnStarted, 0, func(e *event.Event) { e.Deadline = t0.Add(time.Minute) }),
	)
	flush(t, s)
	got := mustTurn(t, s, "run-d")
	if !got.Deadline.Equal(t0.Add(30*time.Minute)) || !got.Ceiling.Equal(t0.Add(time.Hour)) || got.StepTimeout != 5*time.Minute {
		t.Errorf("turn limits = deadline %v ceiling %v step %v", got.Deadline, got.Ceiling, got.StepTimeout)
	}
	got = mustTurn(t, s, "run-n")
	if !got.Deadline.Equal(t0.Add(time.Minute)) || !got.Ceiling.IsZero() || got.StepTimeout != 0 {
		t.Errorf("turn without ceiling or step timeout = %+v", got)
	}
}

// TestSessionResetSurvivesRestart: after /new the history starts afresh, in
// this process and after the file is opened again.
func TestSessionResetSurvivesRestart(t *testing.T) {
	path := dbPath(t)
	s, err := store.Open(context.Background(), path, store.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	old := newTurn("run-old", "telegram:42")
	handleAll(s,
		old.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "before" }),
		old.ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "old reply" }),
		event.Event{Kind: event.SessionReset, SessionKey: "telegram:42", Time: t0.Add(2 * time.Second)},
	)
	fresh := newTurn("run-new", "telegram:42")
	handleAll(s,
		fresh.ev(event.TurnStarted, 3*time.Second, func(e *event.Event) { e.Text = "after" }),
		fresh.ev(event.Finished, 4*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "new reply" }),
	)
	flush(t, s)
	texts := func(h []store.Message) (out []string) {
		for _, m := range h {
			out = append(out, m.Text)
		}
		return out
	}
	if got := texts(mustHistory(t, s, "telegram:42")); strings.Join(got, "|") != "after|new reply" {
		t.Fatalf("history after reset = %q", got)
	}
	if st := s.Stats(); st.Failed != 0 {
		t.Fatalf("reset counted as failed: %+v", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, path, store.Options{})
	if got := texts(mustHistory(t, s2, "telegram:42")); strings.Join(got, "|") != "after|new reply" {
		t.Fatalf("history after reopening = %q", got)
	}
}

// TestEndingsNeverDroppedWhenQueueFull: a full queue sheds progress-type
// events but keeps every turn's start and ending, in order, so no ended turn
// is left "running" (which the next start would report as interrupted).
func TestEndingsNeverDroppedWhenQueueFull(t *testing.T) {
	s, entered, release := heldWriter(t, store.Options{QueueSize: 3})
	s.Handle(newTurn("warm", "w").ev(event.TurnStarted, 0, nil))
	<-entered // the writer is held; everything below waits in the queue

	const turns = 20
	for i := range turns {
		tr := newTurn(fmt.Sprintf("run-%02d", i), fmt.Sprintf("s%02d", i))
		at := time.Duration(i) * time.Second
		handleAll(s,
			tr.ev(event.TurnStarted, at, func(e *event.Event) { e.Text = "q" }),
			tr.ev(event.StepStarted, at, func(e *event.Event) { e.Step = step("tool", "t", 1, at) }),
			tr.ev(event.Progress, at, func(e *event.Event) { e.Step = step("tool", "t", 1, at) }),
		)
		if i%2 == 0 {
			s.Handle(tr.ev(event.Finished, at, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "a" }))
		} else {
			s.Handle(tr.ev(event.Aborted, at, func(e *event.Event) {
				e.StopReason, e.Message = event.ReasonTimeout, "⏱️ stopped"
			}))
		}
	}
	if s.Dropped() == 0 {
		t.Errorf("Dropped() = 0: the overflow of progress events should be shed and counted")
	}
	release()
	flush(t, s)
	running, err := s.RunningTurns(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range running {
		if r.RunID != "warm" {
			t.Errorf("turn %s is still recorded as running: the next start would tell its user it was interrupted", r.RunID)
		}
	}
	for i := range turns {
		h := mustHistory(t, s, fmt.Sprintf("s%02d", i))
		if len(h) != 2 || h[1].Role != store.RoleAssistant {
			t.Errorf("session s%02d history = %+v, want the question and the ending", i, msgs(h))
		}
	}
	if st := s.Stats(); st.Failed != 0 || st.Spilled == 0 {
		t.Errorf("stats = %+v, want nothing failed and the kept starts and endings counted as spilled", st)
	}

	// The next start: only the turn that really never ended is cut off.
	release()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, s.Path(), store.Options{})
	running, err = s2.RunningTurns(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(running) != 1 || running[0].RunID != "warm" {
		t.Errorf("after a restart, running turns = %+v: only \"warm\" may get an interrupted notice", running)
	}
}
