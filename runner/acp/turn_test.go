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
