package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// testBudgetWarningJournaled: a turn's budget warning is in its journal,
// under its own kind, with the words the person read, the turn's age and
// the step that ran; it adds nothing to the conversation's history.
func testBudgetWarningJournaled(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	tr := NewTurn("run-1", "telegram:42")
	tool := Step(event.StepTool, "build", 1, time.Second)
	const words = "⏳ Your request will be stopped in 20 s unless it finishes."
	HandleAll(s,
		tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "build it" }),
		tr.Ev(event.StepStarted, time.Second, func(e *event.Event) { e.Step = tool }),
		tr.Ev(event.BudgetWarning, 80*time.Second, func(e *event.Event) {
			e.Step, e.Elapsed, e.Limit, e.Message = tool, 80*time.Second, 20*time.Second, words
		}),
		tr.Ev(event.Finished, 90*time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "Built" }),
	)
	Flush(t, s)
	j, err := s.Journal(context.Background(), store.Filter{RunID: "run-1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(j) != 4 {
		t.Fatalf("journal has %d entries, want 4: %+v", len(j), j)
	}
	if e := j[2]; e.Kind != event.BudgetWarning || e.KindName != "budget_warning" || e.Message != words ||
		e.Elapsed != 80*time.Second || e.Step.Name != "build" {
		t.Errorf("warning entry = %+v, want budget_warning with the words, 80 s, step build", e)
	}
	if got := Msgs(MustHistory(t, s, "telegram:42")); len(got) != 2 {
		t.Errorf("history = %+v, want the message and the reply only", got)
	}
}
