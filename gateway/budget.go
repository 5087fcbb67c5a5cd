// Budget warnings: when a turn has used budgetWarningRatio of its time
// limit the scheduler publishes a BudgetWarning (gateway/maintenance);
// at the publish exit the runner gets a note through its inbox, and every
// subscriber the notice in words.

package gateway

import (
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
)

// warnRunner hands budget warning ev to its turn's runner as a note
// (runner.Inbox.Note: the runners that steer — openai, demo — take it
// before their next step; exec with permissions on writes it to the
// agent's stdin) and sets ev.Text to the note; ev.Text stays "" when the
// runner takes none (acp, exec without permissions: there is no way to
// tell a running agent) or the turn is gone.
//
// Lock contract: called without e.mu; it takes it once.
func (e *Engine) warnRunner(ev *event.Event) {
	e.mu.Lock()
	t := e.turns[ev.RunID]
	e.mu.Unlock()
	if t == nil || t.inbox == nil {
		return
	}
	if note := messages.RunnerBudgetNote(ev.Limit); t.inbox.Note(note) {
		ev.Text = note
	}
}
