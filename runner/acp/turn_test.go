package acp

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/turnguard/turnguard/internal/cbrec"
)

// TestOpenToolCallsAreCapped: a turn follows at most maxOpenTools open
// tool calls; those past it are counted, and once one completes a new one
// is followed again; completing the newest reopens the one before.
func TestOpenToolCallsAreCapped(t *testing.T) {
	rec := cbrec.New()
	ts := newTurnState("r", rec)
	ts.begin("agent")
	call := func(kind, id string) {
		ts.update(json.RawMessage(fmt.Sprintf(`{"sessionUpdate":%q,"toolCallId":%q,"title":%q,"status":"pending"}`, kind, id, "t "+id)))
	}
	done := func(id string) {
		ts.update(json.RawMessage(fmt.Sprintf(`{"sessionUpdate":"tool_call_update","toolCallId":%q,"status":"completed"}`, id)))
	}
	for i := range 5_000 { // TestToolCallsAreBounded sends 40,000 through a real agent
		call("tool_call", fmt.Sprint(i))
	}
	if len(ts.calls) != maxOpenTools || ts.open.Len() != maxOpenTools || ts.ignored() != 5_000-maxOpenTools {
		t.Fatalf("%d calls, %d open, %d ignored; want %d, %d, %d", len(ts.calls), ts.open.Len(), ts.ignored(),
			maxOpenTools, maxOpenTools, 5_000-maxOpenTools)
	}
	done("5000") // never followed: nothing happens
	done("999")  // the newest: its step ends and the one before is current again
	call("tool_call", "new")
	evs := rec.Events()
	want := []string{"done tool t 999", "start tool t 998", "start tool t new"}
	if got := evs[len(evs)-3:]; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("last events %q, want %q", got, want)
	}
}

// TestPlanNamesTheLLMStep: the plan's entry in progress, counted among all
// entries, names the llm step — at once when the llm step is current, from
// the next llm step while a tool runs — and a plan with none in progress
// gives the step the agent's name back; the same step again renames
// nothing.
func TestPlanNamesTheLLMStep(t *testing.T) {
	plan := func(statuses ...string) string {
		var es []map[string]string
		for i, st := range statuses {
			es = append(es, map[string]string{"content": fmt.Sprintf("Task %d", i+1), "priority": "low", "status": st})
		}
		b, _ := json.Marshal(map[string]any{"sessionUpdate": "plan", "entries": es})
		return string(b)
	}
	tests := []struct {
		name    string
		updates []string
		want    []string // the callbacks after begin
	}{{
		name:    "while the llm step runs",
		updates: []string{plan("completed", "in_progress", "pending")},
		want:    []string{"start llm 📋 2/3: Task 2"},
	}, {
		name:    "the same entry again",
		updates: []string{plan("in_progress", "pending"), plan("in_progress", "pending")},
		want:    []string{"start llm 📋 1/2: Task 1"},
	}, {
		name: "while a tool runs",
		updates: []string{`{"sessionUpdate":"tool_call","toolCallId":"1","title":"Run make","status":"in_progress"}`,
			plan("completed", "in_progress"),
			`{"sessionUpdate":"tool_call_update","toolCallId":"1","status":"completed"}`},
		want: []string{"done llm agent", "start tool Run make", "done tool Run make", "start llm 📋 2/2: Task 2"},
	}, {
		name:    "no entry in progress",
		updates: []string{plan("in_progress", "pending"), plan("completed", "completed")},
		want:    []string{"start llm 📋 1/2: Task 1", "start llm agent"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := cbrec.New()
			ts := newTurnState("r", rec)
			ts.begin("agent")
			for _, u := range tc.updates {
				ts.update(json.RawMessage(u))
			}
			var got []string // after begin's "start llm agent"; activity aside
			for _, e := range rec.Events()[1:] {
				if e != "activity" {
					got = append(got, e)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("callbacks %q, want %q", got, tc.want)
			}
		})
	}
}
