package messages

import (
	"strconv"
	"strings"

	"github.com/turnguard/turnguard/event"
)

// The words of resuming a turn cut off by a restart, a crash or a cluster
// takeover (agents.defaults.resume). A turn that is not resumed — resume
// off, its attempts used, too old — ends with the Interrupted template, as
// always.

// resumeStep words the step an attempt was cut off in: " while shell was
// running", or "" between steps.
func resumeStep(step event.Step) string {
	if step.IsZero() {
		return ""
	}
	return " while " + StepLabel(step) + " was running"
}

// Resuming is the notice that ends an interrupted attempt which is
// dispatched again at once (it was not in a tool call): "🔄 Your request
// was interrupted by a server problem while the model was running —
// resuming it (attempt 2 of 3)…".
func Resuming(step event.Step, attempt, maxAttempts int) string {
	return "🔄 Your request was interrupted by a server problem" + resumeStep(step) +
		" — resuming it (attempt " + strconv.Itoa(attempt) + " of " + strconv.Itoa(maxAttempts) + ")…"
}

// ResumeAsk is the notice that ends an interrupted attempt cut off in a
// tool call: the next attempt asks the person first (ResumeQuestion).
func ResumeAsk(step event.Step) string {
	return "⚠️ Your request was interrupted by a server problem" + resumeStep(step) +
		". That step may already have had an effect, so I will ask before resuming it."
}

// ResumeQuestion is the title of the question (Resume / Cancel) a resumed
// attempt asks before it runs when its predecessor was cut off in a tool
// call.
func ResumeQuestion(step event.Step) string {
	return "Resume your interrupted request? It stopped" + resumeStep(step) + ", which may already have had an effect."
}

// The options of ResumeQuestion.
const (
	ResumeOption = "Resume"
	CancelOption = "Cancel"
)

// ResumeCancelled is the reply of a resumed attempt the person cancelled
// (or did not answer in time).
const ResumeCancelled = "⏹️ Not resumed. Send it again if you still want it."

// GatewayNotePrefix starts a note the gateway puts before the person's
// message for the agent (ResumeNote); the note ends at the first "]\n\n".
const GatewayNotePrefix = "[Gateway note: "

// SplitGatewayNote returns the gateway's note at the start of msg (""
// when there is none) and the person's message after it.
func SplitGatewayNote(msg string) (note, rest string) {
	if !strings.HasPrefix(msg, GatewayNotePrefix) {
		return "", msg
	}
	note, rest, ok := strings.Cut(msg, "]\n\n")
	if !ok {
		return "", msg
	}
	return note + "]", rest
}

// ResumeNote is the note the agent reads before the person's message in a
// resumed attempt: that its previous attempt was interrupted, in which
// step, and that a tool's effect may already have happened.
func ResumeNote(step event.Step, attempt, maxAttempts int) string {
	s := GatewayNotePrefix + "this is attempt " + strconv.Itoa(attempt) + " of " + strconv.Itoa(maxAttempts) +
		" of the request below. The previous attempt was interrupted by a server restart"
	switch {
	case step.IsZero():
		s += " between steps."
	case step.Kind == event.StepTool:
		s += " while the tool " + strconv.Quote(step.Label()) + " was running; it may or may not have taken effect — check before repeating it."
	default:
		s += " while " + StepLabel(step) + " was running."
	}
	return s + " Its partial work was not kept; continue the request.]"
}
