package messages

import "time"

// RunnerBudgetNote is what the gateway tells a runner (and through it the
// model) when its turn reaches budgetWarningRatio of its time limit: how
// long is left, and to wrap up. It goes to the runner, not the person; the
// person reads the BudgetWarning notice.
func RunnerBudgetNote(left time.Duration) string {
	return "Note from the gateway: " + FormatDuration(left) + " left before this turn is stopped. " +
		"Wrap up now: start no new long task and give your best answer with what you have."
}

// TurnClass is the /status line that says what a running turn is doing:
// its stall class (maintenance.Class's names: working, long_running,
// stalled, stuck), "" for none or an unknown one.
func TurnClass(class string) string {
	switch class {
	case "working":
		return "🟢 Steps are completing."
	case "long_running":
		return "🟡 One step is taking long, but it still shows signs of life."
	case "stalled":
		return "🟠 No sign of progress lately; it will be stopped if none comes before the no-progress limit."
	case "stuck":
		return "🔴 Stuck: it is past its limit and the work has not stopped yet."
	}
	return ""
}
