// Package runner owns the contract between the gateway and whatever does a
// turn's work: the Runner interface and the Callbacks a runner uses to report
// step boundaries, streamed text and liveness. Runners live in the
// sub-packages (demo, openai, exec); the engine in package gateway calls them.
package runner

import (
	"context"
	"errors"
)

// Message is one earlier message of the conversation.
type Message struct {
	Role string // "user" or "assistant"
	Text string
}

// Turn is the input of one run.
type Turn struct {
	RunID      string
	SessionKey string
	// SessionID names the conversation: the same for every turn of a
	// session until it is reset (/new), then a new one. A runner that keeps
	// state per conversation (an agent session) keys it on SessionID.
	SessionID string
	Channel   string
	Message   string    // the user's message
	History   []Message // earlier messages of the session, oldest first (not including Message)
	// Inbox, set when the runner is a Steerer, receives the messages the
	// person sends while this turn runs (busy mode steer).
	Inbox *Inbox
	// Approver asks the person a question and waits for the answer
	// (approvals: a permission request, a tool marked requireApproval).
	// The engine always sets it; nil (tests, tools) means deny everything,
	// see Ask.
	Approver Approver
}

// Ask asks t's person q through t.Approver, or denies it at once when the
// turn has no Approver.
func (t Turn) Ask(ctx context.Context, q Question) (Answer, error) {
	if t.Approver == nil {
		return Deny{}.Ask(ctx, q)
	}
	return t.Approver.Ask(ctx, q)
}

// Result is what a runner returns. After its context is cancelled a runner
// returns promptly with whatever text it had (partial text) and the
// context's error.
type Result struct {
	Text string
}

// Callbacks are how a runner reports progress. They are safe to call from
// any goroutine, never block for long, and may be called after the turn was
// aborted (they are then ignored for the user, but still recorded).
//
//   - StepStarted/StepCompleted bracket each LLM call (kind "llm", name = the
//     model) and each tool call (kind "tool", name = the tool). A completed
//     step resets the turn's liveness deadline.
//   - Delta streams reply text; it counts as activity (resets liveness only
//     when livenessResetOn is "activity").
//   - Heartbeat says "alive" explicitly and always resets liveness.
//   - Pause/Resume bracket a wait for a human: the liveness clock stops, the
//     wall clock and ceiling do not.
type Callbacks interface {
	StepStarted(kind, name string)
	StepCompleted(kind, name string)
	Delta(text string)
	Heartbeat()
	Pause(reason string)
	Resume()
}

// ActivityReporter is implemented by Callbacks that take signs of life
// which are neither reply text nor a step: an agent's thoughts, its plan.
// Activity counts as activity — it resets the liveness window only under
// livenessResetOn: activity, like streamed text — and shows the person
// nothing. The engine's Callbacks implement it; a runner type-asserts.
type ActivityReporter interface {
	Activity()
}

// FallbackReporter is implemented by Callbacks that record a runner's move
// to another model provider within a turn (the openai runner's
// agents.openai.fallbacks): Fallback(from, to) names the model that failed
// and the one the turn goes on with. It is for the trace and the journal;
// the runner tells the person itself (reply text). The engine's Callbacks
// implement it; a runner type-asserts.
type FallbackReporter interface {
	Fallback(from, to string)
}

// Runner does the work of one turn. Run blocks until the turn is done or
// ctx is cancelled; it must not keep using cb after it returns.
type Runner interface {
	Run(ctx context.Context, turn Turn, cb Callbacks) (Result, error)
}

// Wrapper is implemented by a runner that stands for another: the gateway
// binary's slot, which runs each turn on the runner built last from the
// configuration. Unwrap returns that runner (nil before one is built), so
// that what a runner knows beyond turns — an ACP agent's commands, modes,
// settings and sessions — can be asked of it (gateway.Engine.RunnerOf).
type Wrapper interface {
	Unwrap() Runner
}

// Prober is implemented by a runner that can tell, without running a turn,
// whether it can work at all — the openai runner: whether its model
// provider answers. The gateway probes at start-up and after a rebuild,
// aside (a slow or failed probe never delays start), logs a failure and
// shows it in /api/diagnose. Probe returns within ctx; its error is words
// for operators naming what failed, never a secret.
type Prober interface {
	Probe(ctx context.Context) error
}

// Func adapts a function to Runner.
type Func func(ctx context.Context, turn Turn, cb Callbacks) (Result, error)

// Run calls f.
func (f Func) Run(ctx context.Context, turn Turn, cb Callbacks) (Result, error) {
	return f(ctx, turn, cb)
}

// UserError is an error whose message is meant for the user as-is (for
// example a bad /steps script). The engine shows Message instead of a
// generic failure text.
type UserError struct{ Message string }

func (e *UserError) Error() string { return e.Message }

// AsUserError reports whether err carries a message for the user.
func AsUserError(err error) (*UserError, bool) {
	var u *UserError
	ok := errors.As(err, &u)
	return u, ok
}

// Nop is Callbacks that ignores everything (for tests and tools).
type Nop struct{}

func (Nop) StepStarted(kind, name string)   {}
func (Nop) StepCompleted(kind, name string) {}
func (Nop) Delta(text string)               {}
func (Nop) Heartbeat()                      {}
func (Nop) Pause(reason string)             {}
func (Nop) Resume()                         {}
