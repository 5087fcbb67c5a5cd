package runner

import (
	"context"
	"errors"
)

// OptionKind says what choosing an Option means. The kinds are those of the
// Agent Client Protocol's permission options; channels render allow kinds
// and reject kinds differently, and a timeout always picks a reject.
type OptionKind string

// The option kinds.
const (
	AllowOnce    OptionKind = "allow_once"
	AllowAlways  OptionKind = "allow_always"
	RejectOnce   OptionKind = "reject_once"
	RejectAlways OptionKind = "reject_always"
)

// Allows reports whether choosing an option of kind k lets the action run.
func (k OptionKind) Allows() bool { return k == AllowOnce || k == AllowAlways }

// Option is one answer a person may give to a Question.
type Option struct {
	ID    string     // the runner's own id for the option, returned in Answer.OptionID
	Label string     // what the button says ("Allow once")
	Kind  OptionKind // allow_once, allow_always, reject_once or reject_always
}

// Question is what a runner asks the person before it goes on, typically
// whether a tool call may run.
type Question struct {
	// Title says what the agent wants to do, in words ("Run `rm -rf
	// build/`", "Edit src/main.go"). Required.
	Title string
	// Detail is optional extra text (the command line, a diff summary).
	Detail string
	// Tool names the step the question is about (the tool call's kind or
	// name), when there is one.
	Tool string
	// Options are the possible answers, in display order. Empty means the
	// default pair: "Allow" (allow_once) and "Deny" (reject_once).
	Options []Option
}

// DefaultOptions are the options of a Question that gives none.
var DefaultOptions = []Option{
	{ID: "allow", Label: "Allow", Kind: AllowOnce},
	{ID: "deny", Label: "Deny", Kind: RejectOnce},
}

// Outcome says how a question was settled.
type Outcome string

// The outcomes.
const (
	// Selected: the person (or an operator) chose Answer.OptionID.
	Selected Outcome = "selected"
	// TimedOut: nobody answered within approvalTimeoutSeconds; the
	// question is denied (Answer.OptionID is the first reject option, or
	// "" when the question had none).
	TimedOut Outcome = "timeout"
)

// Answer is how a Question was settled.
type Answer struct {
	Outcome  Outcome
	OptionID string     // the chosen option's id ("" when none applies)
	Kind     OptionKind // the chosen option's kind; a timeout is a reject
	By       string     // who answered, as the channel names them ("" on a timeout)
}

// Allowed reports whether the action the question was about may run.
func (a Answer) Allowed() bool { return a.Outcome == Selected && a.Kind.Allows() }

// Approver asks the person a turn belongs to a question and waits for the
// answer. The engine gives every turn one (Turn.Approver). While a question
// is open the turn is paused: its liveness clock stops, the wall clock and
// the ceiling do not.
//
// Ask blocks until the person answers (Outcome Selected), nobody answers
// within approvalTimeoutSeconds (Outcome TimedOut: deny), or ctx is done
// (the turn was stopped: Ask returns ctx's error and the runner should
// return promptly). Ask is safe to call from several goroutines at once;
// each call is its own question. It returns ErrNoApprover-wrapped errors
// only for a question it cannot ask (no Title).
type Approver interface {
	Ask(ctx context.Context, q Question) (Answer, error)
}

// ErrNoApprover is returned by Ask of a question that cannot be asked (an
// empty Title, or an Approver that cannot reach a person).
var ErrNoApprover = errors.New("runner: no one can answer this question")

// Deny is an Approver that answers every question with its first reject
// option at once, for tests and tools that run a runner with no person
// behind it.
type Deny struct{}

// Ask denies q.
func (Deny) Ask(ctx context.Context, q Question) (Answer, error) {
	if err := ctx.Err(); err != nil {
		return Answer{}, err
	}
	opts := q.Options
	if len(opts) == 0 {
		opts = DefaultOptions
	}
	for _, o := range opts {
		if !o.Kind.Allows() {
			return Answer{Outcome: TimedOut, OptionID: o.ID, Kind: o.Kind}, nil
		}
	}
	return Answer{Outcome: TimedOut, Kind: RejectOnce}, nil
}
