package messages_test

import (
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
)

// TestRenderFromFacts: the words a person reads for each event come from
// the facts it carries, with the template its kind and stop reason name
// (the same words the registry, the scheduler and the engine rendered
// before they carried facts); events without words render "".
func TestRenderFromFacts(t *testing.T) {
	shell := event.Step{Kind: "tool", Name: "shell"}
	search := event.Step{Kind: "tool", Name: "web_search"}
	for _, tc := range []struct {
		name string
		ev   event.Event
		want string
	}{
		{"timeout", event.Event{Kind: event.Aborted, StopReason: event.ReasonTimeout, Elapsed: 30 * time.Minute,
			Limit: 30 * time.Minute, Step: shell, LastStep: search},
			"⚠️ This request was stopped at its time limit of 30 min while shell was running. Try again, or ask for something smaller."},
		{"step timeout", event.Event{Kind: event.Aborted, StopReason: event.ReasonStepTimeout, Elapsed: 7 * time.Minute,
			Limit: 5 * time.Minute, StepTimeout: 5 * time.Minute, Step: shell, LastStep: search},
			"⚠️ No progress for 5 min — shell never finished (last completed: web_search). The task may be stuck. Retry or ask for a simpler approach."},
		{"max turn time", event.Event{Kind: event.Aborted, StopReason: event.ReasonMaxTurnTime, Elapsed: 2 * time.Hour,
			Limit: 2 * time.Hour, LastStep: search},
			"⚠️ This request reached the maximum time of 2 h — last action was web_search. It was stopped; please split it into smaller requests."},
		{"user", event.Event{Kind: event.Aborted, StopReason: event.ReasonUser, Elapsed: 1500 * time.Millisecond, Step: shell},
			"⏹️ Stopped while shell was running after 1.5 s."},
		{"shutdown", event.Event{Kind: event.Aborted, StopReason: event.ReasonShutdown, Elapsed: 4 * time.Second},
			"⚠️ The gateway is shutting down, so your request was stopped after 4 s. Please send it again in a minute."},
		{"interrupted", event.Event{Kind: event.Aborted, StopReason: event.ReasonInterrupted, Step: shell},
			"⚠️ Your request was interrupted by a server problem — last action was shell. Please send it again."},
		{"superseded", event.Event{Kind: event.Aborted, StopReason: event.ReasonSuperseded, Step: shell},
			"⏭️ I stopped this request while shell was running because your newer message replaced it — working on that one now."},
		{"a reason with no template stops", event.Event{Kind: event.Aborted, StopReason: "brand_new", Elapsed: time.Second},
			"⏹️ Stopped after 1 s."},
		{"progress", event.Event{Kind: event.Progress, Step: shell, Elapsed: 30 * time.Second, Limit: time.Hour},
			"⏳ Still working — shell has been running for 30 s…"},
		{"error", event.Event{Kind: event.Finished, StopReason: event.ReasonError, Step: shell, ErrorID: "E7K2QX"},
			"❌ Something went wrong on my side during shell (error id E7K2QX) — try again, or tell the operator this id."},
		{"an error while the model answers", event.Event{Kind: event.Finished, StopReason: event.ReasonError,
			Step: event.Step{Kind: event.StepLLM, Name: "llama3.2"}, ErrorID: "E7K2QX"},
			"❌ Something went wrong on my side while waiting for the model (error id E7K2QX) — try again, or tell the operator this id."},
		{"a model that never answers", event.Event{Kind: event.Aborted, StopReason: event.ReasonStepTimeout,
			StepTimeout: 10 * time.Minute, Step: event.Step{Kind: event.StepLLM, Name: "llama3.2"}},
			"⚠️ No progress for 10 min — the model never finished. The task may be stuck. Retry or ask for a simpler approach."},
		{"a reply has no words", event.Event{Kind: event.Finished, StopReason: event.ReasonStop, FullText: "hi"}, ""},
		{"a step has no words", event.Event{Kind: event.StepCompleted, Step: shell}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := messages.Render(nil, tc.ev); got != tc.want {
				t.Errorf("Render\n got  %q\n want %q", got, tc.want)
			}
			if got := messages.Wordy(&tc.ev); got != (tc.want != "") {
				t.Errorf("Wordy = %v, want %v", got, tc.want != "")
			}
		})
	}
}

// TestRenderUsesTheSet: the configured texts are used, not the built-in ones.
func TestRenderUsesTheSet(t *testing.T) {
	set, err := messages.Parse(map[string]string{"user": "halted at {{.CurrentStep}}"})
	if err != nil {
		t.Fatal(err)
	}
	ev := event.Event{Kind: event.Aborted, StopReason: event.ReasonUser, Step: event.Step{Name: "shell"}}
	if got := messages.Render(set, ev); got != "halted at shell" {
		t.Errorf("Render = %q", got)
	}
}
