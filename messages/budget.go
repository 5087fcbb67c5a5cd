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
