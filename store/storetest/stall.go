package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

func testStallHistoryPairsEpisodes(t *testing.T, h *H) {
	slow := Step("tool", "web_search", 2, 0)
	other := Step("tool", "http_get", 3, 0)
	progress := func(st event.Step) func(*event.Event) {
		return func(e *event.Event) { e.Step, e.Message = st, "⏳ Still working" }
	}
	withStep := func(st event.Step) func(*event.Event) { return func(e *event.Event) { e.Step = st } }
	abort := func(r event.StopReason, st event.Step) func(*event.Event) {
		return func(e *event.Event) { e.StopReason, e.Step = r, st }
	}
	s2 := event.Step{Kind: "tool", Name: "web_search", Seq: 2}
	s3 := event.Step{Kind: "tool", Name: "http_get", Seq: 3}
	sec := time.Second

	type at struct {
		kind event.Kind
		t    time.Duration
		f    func(*event.Event)
	}
	tests := []struct {
		name   string
		events []at
		want   []store.Episode // RunID and SessionKey are filled in
	}{
		{
			name: "progress then recovered",
			events: []at{
				{event.Progress, 30 * sec, progress(slow)},
				{event.Progress, 60 * sec, progress(slow)}, // repeat notice, same episode
				{event.Recovered, 70 * sec, withStep(slow)},
				{event.Finished, 80 * sec, func(e *event.Event) { e.StopReason = event.ReasonStop }},
			},
			want: []store.Episode{{Step: s2, Started: T0.Add(30 * sec), Ended: T0.Add(70 * sec),
				Outcome: store.OutcomeRecovered, Notices: 2}},
		},
		{
			name: "progress, abort, force-finalize",
			events: []at{
				{event.Progress, 30 * sec, progress(slow)},
				{event.Aborted, 120 * sec, abort(event.ReasonStepTimeout, slow)},
				{event.ForceFinalized, 135 * sec, abort(event.ReasonStepTimeout, slow)},
			},
			want: []store.Episode{{Step: s2, Started: T0.Add(30 * sec), Ended: T0.Add(135 * sec),
				Outcome: store.OutcomeForceFinalized, StopReason: event.ReasonStepTimeout, Notices: 1}},
		},
		{
			name: "progress then aborted, runner returned",
			events: []at{
				{event.Progress, 30 * sec, progress(slow)},
				{event.Aborted, 40 * sec, abort(event.ReasonUser, slow)},
			},
			want: []store.Episode{{Step: s2, Started: T0.Add(30 * sec), Ended: T0.Add(40 * sec),
				Outcome: store.OutcomeAborted, StopReason: event.ReasonUser, Notices: 1}},
		},
		{
			name: "abort without progress",
			events: []at{
				{event.Aborted, 600 * sec, abort(event.ReasonTimeout, other)},
			},
			want: []store.Episode{{Step: s3, Started: T0.Add(600 * sec), Ended: T0.Add(600 * sec),
				Outcome: store.OutcomeAborted, StopReason: event.ReasonTimeout}},
		},
		{
			name: "finished while the notice was open",
			events: []at{
				{event.Progress, 30 * sec, progress(slow)},
				{event.Finished, 50 * sec, func(e *event.Event) { e.StopReason = event.ReasonError }},
			},
			want: []store.Episode{{Step: s2, Started: T0.Add(30 * sec), Ended: T0.Add(50 * sec),
				Outcome: store.OutcomeFinished, StopReason: event.ReasonError, Notices: 1}},
		},
		{
			name: "a notice for another step closes the first",
			events: []at{
				{event.Progress, 30 * sec, progress(slow)},
				{event.Progress, 90 * sec, progress(other)},
			},
			want: []store.Episode{
				{Step: s2, Started: T0.Add(30 * sec), Ended: T0.Add(90 * sec), Outcome: store.OutcomeRecovered, Notices: 1},
				{Step: s3, Started: T0.Add(90 * sec), Outcome: store.OutcomeOpen, Notices: 1},
			},
		},
		{
			name: "two stalls in one turn",
			events: []at{
				{event.Progress, 30 * sec, progress(slow)},
				{event.Recovered, 40 * sec, withStep(slow)},
				{event.Progress, 100 * sec, progress(other)},
				{event.Aborted, 200 * sec, abort(event.ReasonTimeout, other)},
			},
			want: []store.Episode{
				{Step: s2, Started: T0.Add(30 * sec), Ended: T0.Add(40 * sec), Outcome: store.OutcomeRecovered, Notices: 1},
				{Step: s3, Started: T0.Add(100 * sec), Ended: T0.Add(200 * sec), Outcome: store.OutcomeAborted,
					StopReason: event.ReasonTimeout, Notices: 1},
			},
		},
		{
			name: "no stall",
			events: []at{
				{event.StepStarted, sec, withStep(slow)},
				{event.StepCompleted, 2 * sec, withStep(slow)},
				{event.Finished, 3 * sec, func(e *event.Event) { e.StopReason = event.ReasonStop }},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := h.Open(t, h.New(t), Config{})
			tr := NewTurn("run-1", "s")
			s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "q" }))
			for _, e := range tc.events {
				s.Handle(tr.Ev(e.kind, e.t, e.f))
			}
			Flush(t, s)
			got, err := s.StallHistory(context.Background(), store.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			want := slices.Clone(tc.want)
			for i := range want {
				want[i].RunID, want[i].SessionKey = "run-1", "s"
			}
			if !slices.Equal(got, want) {
				t.Errorf("episodes =\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

func testStallHistoryOfAnInterruptedTurn(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	tr := NewTurn("run-1", "s")
	HandleAll(s,
		tr.Ev(event.TurnStarted, 0, nil),
		tr.Ev(event.Progress, 30*time.Second, func(e *event.Event) { e.Step = Step("tool", "exec", 1, 0) }))
	Flush(t, s)
	if ok, err := s.MarkInterrupted(context.Background(), "run-1", "restarted"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	eps, err := s.StallHistory(context.Background(), store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 1 || eps[0].Outcome != store.OutcomeAborted || eps[0].StopReason != event.ReasonInterrupted ||
		!eps[0].Started.Equal(T0.Add(30*time.Second)) || eps[0].Duration() <= 0 {
		t.Errorf("episodes = %+v, want one ended by the interruption", eps)
	}
}

func testStallHistoryAndJournalFilters(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	// Three turns, an hour apart, each stalling 30s in and recovering 10s later.
	for i, sess := range []string{"a", "b", "a"} {
		tr := NewTurn("run-"+string(rune('1'+i)), sess)
		base := time.Duration(i) * time.Hour
		st := Step("tool", "exec", 1, base)
		HandleAll(s,
			tr.Ev(event.TurnStarted, base, nil),
			tr.Ev(event.Progress, base+30*time.Second, func(e *event.Event) { e.Step = st }),
			tr.Ev(event.Recovered, base+40*time.Second, func(e *event.Event) { e.Step = st }),
		)
	}
	Flush(t, s)
	runs := func(eps []store.Episode) []string {
		var out []string
		for _, e := range eps {
			out = append(out, e.RunID)
		}
		return out
	}
	tests := []struct {
		name        string
		f           store.Filter
		wantEpisode []string
		wantJournal int
	}{
		{"all", store.Filter{}, []string{"run-1", "run-2", "run-3"}, 9},
		{"session", store.Filter{SessionKey: "a"}, []string{"run-1", "run-3"}, 6},
		{"run", store.Filter{RunID: "run-2"}, []string{"run-2"}, 3},
		{"since is inclusive", store.Filter{Since: T0.Add(time.Hour + 30*time.Second)}, []string{"run-2", "run-3"}, 5},
		// The episode starting before Until counts even though its recovery
		// is after it.
		{"until is exclusive", store.Filter{Until: T0.Add(time.Hour + 35*time.Second)}, []string{"run-1", "run-2"}, 5},
		{"limit keeps the most recent", store.Filter{Limit: 2}, []string{"run-2", "run-3"}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps, err := s.StallHistory(context.Background(), tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if got := runs(eps); !slices.Equal(got, tc.wantEpisode) {
				t.Errorf("episodes of %v, want %v", got, tc.wantEpisode)
			}
			j, err := s.Journal(context.Background(), tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if len(j) != tc.wantJournal {
				t.Errorf("journal has %d entries, want %d", len(j), tc.wantJournal)
			}
			for i := 1; i < len(j); i++ {
				if j[i].ID <= j[i-1].ID {
					t.Errorf("journal not oldest first: %d after %d", j[i].ID, j[i-1].ID)
				}
			}
		})
	}
}
