// Resumed turns (agents.defaults.resume): the attempt of a turn that a
// restart, a crash or a cluster takeover cut off, dispatched again by the
// recovery as a queued message. The runner reads a note before the
// person's message; an attempt whose predecessor was cut off in a tool
// call first asks the person (Resume / Cancel) through the approvals.

package gateway

import (
	"context"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
)

// Resume marks a queued message (QueuedMessage.Resume, SendRequest.Resume)
// as a resumed attempt of a turn cut off by a restart or a takeover.
type Resume struct {
	Attempt     int        // this attempt's number: 2 for the first resume
	MaxAttempts int        // agents.defaults.resume.maxAttempts when it was dispatched
	Step        event.Step // the step the previous attempt was cut off in (zero: between steps)
	// Confirm: the previous attempt was cut off in a tool call (a possible
	// side effect), so the person is asked before the runner runs.
	Confirm bool
}

// attempt is r's attempt number: 1 for a first attempt (r nil).
func (r *Resume) attempt() int {
	if r == nil {
		return 1
	}
	return r.Attempt
}

// resumed returns the runner and the turn of a resumed attempt: the note
// (messages.ResumeNote) before the person's message, and rn behind the
// Resume / Cancel question when r.Confirm. The history keeps the person's
// message as they wrote it.
func resumed(rn runner.Runner, rt runner.Turn, r *Resume) (runner.Runner, runner.Turn) {
	if r == nil {
		return rn, rt
	}
	rt.Message = messages.ResumeNote(r.Step, r.Attempt, r.MaxAttempts) + "\n\n" + rt.Message
	if r.Confirm {
		rn = askFirst{Runner: rn, q: runner.Question{Title: messages.ResumeQuestion(r.Step), Tool: r.Step.Label(),
			Options: []runner.Option{
				{ID: "resume", Label: messages.ResumeOption, Kind: runner.AllowOnce},
				{ID: "cancel", Label: messages.CancelOption, Kind: runner.RejectOnce},
			}}}
	}
	return rn, rt
}

// askFirst runs its Runner only once the person chose an allowing option of
// q; otherwise (Cancel, no answer in approvalTimeoutSeconds) the turn
// finishes with messages.ResumeCancelled and the runner never runs. The
// question is an approval like a runner's own: buttons on Telegram and in
// the web chat, the liveness clock paused while it waits, settled once.
type askFirst struct {
	runner.Runner
	q runner.Question
}

func (a askFirst) Run(ctx context.Context, t runner.Turn, cb runner.Callbacks) (runner.Result, error) {
	ans, err := t.Ask(ctx, a.q)
	if err != nil {
		return runner.Result{}, err
	}
	if !ans.Kind.Allows() {
		return runner.Result{Text: messages.ResumeCancelled}, nil
	}
	return a.Runner.Run(ctx, t, cb)
}
