package messages

import (
	"strings"

	"github.com/turnguard/turnguard/event"
)

// Render returns the words a person reads for ev, rendered with set (nil:
// the built-in texts) from the facts the event carries, or "" for an event
// that has none: a Progress notice, a BudgetWarning, an Aborted turn's notice (by stop
// reason), a failed turn's (Finished with ReasonError). It is the one place
// user texts are made; the engine calls it at its single exit of events, so
// history, store and every channel show the same words.
//
// A stop reason with no template of its own — one added to the vocabulary
// later — is rendered with the template named like it if there is one,
// otherwise as a stop (User).
func Render(set *Set, ev event.Event) string {
	if set == nil {
		set = defaultSet
	}
	f := Fields{
		Elapsed: Duration(ev.Elapsed), CurrentStep: StepLabel(ev.Step), LastStep: StepLabel(ev.LastStep),
		StepTimeout: Duration(ev.StepTimeout), Limit: Duration(ev.Limit), Model: ev.Step.Kind == event.StepLLM,
	}
	switch {
	case ev.Kind == event.ApprovalRequested && ev.Approval != nil:
		return ApprovalAsked(ev.Approval)
	case ev.Kind == event.ApprovalResolved && ev.Approval != nil:
		return ApprovalSettled(ev.Approval)
	case ev.Kind == event.Progress:
		return set.Render(Progress, f)
	case ev.Kind == event.BudgetWarning:
		f.Left = Duration(ev.Limit)
		return set.Render(BudgetWarning, f)
	case ev.Kind == event.Aborted:
		return set.Render(ForReason(ev.StopReason), f)
	case ev.Kind == event.Finished && ev.StopReason == event.ReasonError:
		f.ErrorID, f.Error = ev.ErrorID, ev.ErrorID
		return set.Render(Error, f)
	}
	return ""
}

// ForReason is the template of a turn's notice for stop reason r.
func ForReason(r event.StopReason) Name {
	switch r {
	case event.ReasonTimeout:
		return Timeout
	case event.ReasonStepTimeout:
		return StepTimeout
	case event.ReasonMaxTurnTime:
		return MaxTurnTime
	}
	if _, ok := Defaults[Name(r)]; ok && Name(r) != Progress && Name(r) != BudgetWarning {
		return Name(r) // shutdown, interrupted, user, error, and reasons added with their template
	}
	return User
}

// Wordy reports whether Render has words for an event of this kind and
// stop reason: callers on a hot path test it before looking anything up.
func Wordy(ev *event.Event) bool {
	return ev.Kind == event.Progress || ev.Kind == event.Aborted || ev.Kind == event.BudgetWarning ||
		ev.Kind == event.ApprovalRequested || ev.Kind == event.ApprovalResolved ||
		(ev.Kind == event.Finished && ev.StopReason == event.ReasonError)
}

var defaultSet = MustDefault()

// StepLabel is the name of a step in a user text: a call to the model is
// "the model" (its name, "llama3.2", is not something the person did or
// asked for) unless the agent's plan named it (AgentPlanStep), any other
// step its Label (the tool name).
func StepLabel(s event.Step) string {
	if s.Kind == event.StepLLM && !strings.HasPrefix(s.Name, planMark) {
		return "the model"
	}
	return s.Label()
}
