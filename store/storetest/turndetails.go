package storetest

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

func init() {
	cases = append(cases, testCase{"TurnDetails", testTurnDetails})
}

// testTurnDetails: a finished turn's steps (in order, completed or not,
// with their durations, at most MaxTurnSteps and a count of the rest) and
// its settled approvals — never a pending one, nor another run's — are
// what a reloaded history shows (issue 22).
func testTurnDetails(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	ctx := context.Background()
	a, b, c := NewTurn("run-a", "s"), NewTurn("run-b", "s"), NewTurn("run-c", "s")
	ap := Approval("ap_1")
	step := func(tr *Turn, k event.Kind, st event.Step, at time.Duration) event.Event {
		return tr.Ev(k, at, func(e *event.Event) { e.Step = st })
	}
	search, shell := Step("tool", "web_search", 1, time.Second), Step("tool", "shell", 2, 3*time.Second)
	HandleAll(s,
		a.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "deploy" }),
		step(a, event.StepStarted, search, time.Second), step(a, event.StepCompleted, search, 2*time.Second),
		a.Ev(event.ApprovalRequested, 2*time.Second, func(e *event.Event) { e.Approval = ap }),
		a.Ev(event.ApprovalResolved, 3*time.Second, func(e *event.Event) {
			e.Approval = Resolved(ap, event.ApprovalSelected, "allow", "web chat", 3*time.Second)
		}),
		step(a, event.StepStarted, shell, 3*time.Second),
		a.Ev(event.Aborted, 9*time.Second, func(e *event.Event) { e.StopReason, e.Message = event.ReasonUser, "⏹️ Stopped." }),
		b.Ev(event.TurnStarted, 10*time.Second, nil),
		b.Ev(event.ApprovalRequested, 11*time.Second, func(e *event.Event) { e.Approval = Approval("ap_2") }),
		c.Ev(event.TurnStarted, 20*time.Second, nil))
	for i := uint32(1); i <= store.MaxTurnSteps+3; i++ {
		st := Step("tool", "shell", i, 20*time.Second)
		HandleAll(s, step(c, event.StepStarted, st, 20*time.Second), step(c, event.StepCompleted, st, 21*time.Second))
	}
	Flush(t, s)

	got, err := s.TurnDetails(ctx, []string{"run-a", "run-b", "run-c", "run-none", ""})
	if err != nil {
		t.Fatalf("TurnDetails: %v", err)
	}
	da := got["run-a"]
	wantSteps := []event.TurnStep{
		{Kind: "tool", Name: "web_search", Seq: 1, Completed: true, Elapsed: time.Second},
		{Kind: "tool", Name: "shell", Seq: 2},
	}
	if !reflect.DeepEqual(da.Steps, wantSteps) || da.StepsOmitted != 0 {
		t.Errorf("run-a steps = %+v (%d omitted), want %+v", da.Steps, da.StepsOmitted, wantSteps)
	}
	if len(da.Approvals) != 1 || da.Approvals[0].ID != "ap_1" || da.Approvals[0].Outcome != event.ApprovalSelected ||
		da.Approvals[0].By != "web chat" || da.Approvals[0].Title != ap.Title || da.Approvals[0].Detail != "" {
		t.Errorf("run-a approvals = %+v, want ap_1 allowed by web chat, without its detail", da.Approvals)
	}
	// run-b's question is still pending: nothing to show of it yet.
	if d, ok := got["run-b"]; ok {
		t.Errorf("run-b = %+v, want absent (its only approval is pending)", d)
	}
	dc := got["run-c"]
	if len(dc.Steps) != store.MaxTurnSteps || dc.StepsOmitted != 3 || dc.Steps[0].Seq != 1 || !dc.Steps[store.MaxTurnSteps-1].Completed {
		t.Errorf("run-c = %d steps (%d omitted), want the first %d and 3 omitted, completed", len(dc.Steps), dc.StepsOmitted, store.MaxTurnSteps)
	}
	if _, ok := got["run-none"]; ok || len(got) != 2 {
		t.Errorf("TurnDetails = %d runs, want run-a and run-c only", len(got))
	}
	if none, err := s.TurnDetails(ctx, nil); err != nil || len(none) != 0 {
		t.Errorf("TurnDetails(nil) = %v, %v; want empty", none, err)
	}
}
