// Package event owns the vocabulary of a turn's life: the stop reasons, the
// step descriptions and the Event values that the engine publishes, plus the
// Bus that fans every event out to its subscribers.
//
// The engine emits events and never sends a message itself; channels (the
// WebSocket protocol, Telegram, the store) subscribe to the bus and turn
// events into messages. Event is a plain value: it is copied, never shared,
// so a subscriber may keep it — all but its Locals, a run's per-subscriber
// state that only handlers use (see Local).
package event

import "time"

// StopReason says why a turn ended. The zero value means the turn has not
// ended (or ended normally, see Finished events, whose reason is ReasonStop).
type StopReason string

// The stop reasons. They are machine-readable and stable: clients, metrics and
// the store key on them.
const (
	ReasonNone        StopReason = ""
	ReasonStop        StopReason = "stop" // finished normally
	ReasonTimeout     StopReason = "timeout"
	ReasonStepTimeout StopReason = "step_timeout"
	ReasonMaxTurnTime StopReason = "max_turn_time"
	ReasonUser        StopReason = "user"
	ReasonShutdown    StopReason = "shutdown"
	ReasonInterrupted StopReason = "interrupted"
	ReasonError       StopReason = "error"
	// ReasonSuperseded: the person sent a newer message while the turn ran
	// and the session's busy mode is interrupt; the newer message runs next.
	ReasonSuperseded StopReason = "superseded"
)

// Valid reports whether r is one of the defined stop reasons.
func (r StopReason) Valid() bool {
	switch r {
	case ReasonStop, ReasonTimeout, ReasonStepTimeout, ReasonMaxTurnTime, ReasonUser,
		ReasonShutdown, ReasonInterrupted, ReasonError, ReasonSuperseded:
		return true
	}
	return false
}

// IsTimeout reports whether r is one of the three deadline reasons.
func (r StopReason) IsTimeout() bool {
	return r == ReasonTimeout || r == ReasonStepTimeout || r == ReasonMaxTurnTime
}

// Step kinds reported by runners. Runners may use other kinds; these are the
// ones the gateway renders specially.
const (
	StepLLM  = "llm"
	StepTool = "tool"
)

// Step describes one step of a turn: an LLM call or a tool call. The zero
// Step means "no step".
type Step struct {
	Kind      string    `json:"kind,omitempty"`
	Name      string    `json:"name,omitempty"`
	Seq       uint32    `json:"seq,omitempty"` // 1-based index of the step within its turn
	StartedAt time.Time `json:"startedAt,omitzero"`
}

// IsZero reports whether s describes no step.
func (s Step) IsZero() bool { return s.Name == "" && s.Kind == "" }

// Label is the name a person reads: the tool name, or the kind for an
// unnamed step.
func (s Step) Label() string {
	if s.Name != "" {
		return s.Name
	}
	return s.Kind
}

// Kind enumerates event types.
type Kind uint8

// The event kinds, in the order they typically occur in a turn.
const (
	TurnStarted Kind = iota + 1
	StepStarted
	StepCompleted
	Delta
	Paused
	Resumed
	Progress       // a step has been running long: "⏳ Still working"
	Recovered      // progress after a Progress notice
	Aborted        // the turn was stopped; StopReason and Message say why
	ForceFinalized // the runner ignored an abort past the grace period
	Finished       // the runner returned a final answer (or an error)
	SessionReset   // not a turn event: the session's conversation starts afresh (/new)
	// ApprovalRequested: the runner asks the person a question (Approval);
	// the turn is paused until it is settled.
	ApprovalRequested
	// ApprovalResolved: a question was settled (Approval.Outcome says how).
	ApprovalResolved
	// BudgetWarning: the turn has used budgetWarningRatio of its time
	// limit; the runner is told to wrap up and the person that the turn
	// will be stopped. At most one per turn.
	BudgetWarning
	// Fallback: the runner moved the turn to another model provider
	// (agents.openai.fallbacks) after a failure before any reply.
	Fallback
)

var kindNames = [...]string{
	TurnStarted:       "turn_started",
	StepStarted:       "step_started",
	StepCompleted:     "step_completed",
	Delta:             "delta",
	Paused:            "paused",
	Resumed:           "resumed",
	Progress:          "progress",
	Recovered:         "recovered",
	Aborted:           "aborted",
	ForceFinalized:    "force_finalized",
	Finished:          "finished",
	SessionReset:      "session_reset",
	ApprovalRequested: "approval_requested",
	ApprovalResolved:  "approval_resolved",
	BudgetWarning:     "budget_warning",
	Fallback:          "fallback",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return "unknown"
}

// Terminal reports whether an event of kind k ends its turn for the user:
// after it no further reply text arrives. (ForceFinalized follows an Aborted
// and is terminal for the session, not for the user.)
func (k Kind) Terminal() bool { return k == Aborted || k == Finished }

// Event is one transition of one turn.
//
// Field use by kind:
//   - TurnStarted: Text = the user's message; Deadline, Ceiling, StepTimeout =
//     the turn's limits (zero Ceiling/StepTimeout: none); Runner; Queued.
//   - StepStarted, StepCompleted: Step.
//   - Delta: Text = the new chunk, FullText = all reply text so far.
//   - Paused: Text = the reason. Resumed: nothing extra.
//   - Progress: Step (the long step), LastStep, Elapsed (how long the step
//     has run), StepTimeout, Limit (the wall clock), Message (the notice).
//   - Recovered: Step (the step that had the notice).
//   - Aborted: StopReason, Elapsed (turn age), Step (current step, may be zero),
//     LastStep (last completed), Limit (the limit that was hit, for the
//     timeout reasons), StepTimeout, Message (the user text), FullText
//     (partial reply).
//   - ForceFinalized: StopReason (of the abort), Elapsed (since the abort), Step.
//   - Finished: StopReason (ReasonStop or ReasonError), FullText (the reply).
//     With ReasonError also Elapsed, Step, LastStep, ErrorID (under which
//     operators find the failure) and Message (the user text).
//
// Message is rendered from the facts (StopReason, Elapsed, Limit,
// StepTimeout, Step, LastStep, ErrorID) at one point, the engine's single
// exit of events (messages.Render), so every subscriber sees the same words;
// the producers of events (the abort registry, the scheduler) leave it empty.
// A runner's message written for the user (runner.UserError) is set as is.
//   - BudgetWarning: Elapsed (turn age), Limit (the time left before the
//     turn is stopped), Deadline (when: the earlier of the wall clock and
//     the ceiling), Step (the running step, may be zero), Message (the
//     notice to the person), Text (the note given to the runner; "" when
//     its runner takes none).
//   - SessionReset: SessionKey only (no RunID): earlier history is no longer
//     part of the conversation.
//   - ApprovalRequested: Approval (the question, its options, ExpiresAt),
//     Step (the running step), Message (the question in words).
//   - ApprovalResolved: Approval (as requested, plus Outcome, OptionID,
//     OptionKind, By), Message (the settlement in words).
//   - Fallback: Step (the step whose provider failed, named by its model),
//     Text (the model the turn goes on with). The person reads the switch
//     in the reply text (the runner's notice), not from this event.
type Event struct {
	Kind       Kind
	RunID      string
	SessionKey string
	Channel    string // the channel the turn came from: "ws", "telegram", …
	ChatRef    string // the channel's own reference for the conversation (e.g. a Telegram chat id)
	Seq        uint64 // per-run sequence, 1-based, increasing
	Time       time.Time

	Step       Step
	LastStep   Step
	StopReason StopReason
	Elapsed    time.Duration
	Text       string
	FullText   string
	Message    string

	Deadline    time.Time     // TurnStarted: the wall clock deadline; BudgetWarning: when the turn will be stopped
	Ceiling     time.Time     // TurnStarted: the hard ceiling (zero = none)
	StepTimeout time.Duration // TurnStarted, Progress, Aborted: the liveness window (0 = disabled)
	Limit       time.Duration // Aborted: the limit hit (wall clock, liveness window or ceiling); Progress: the wall clock
	ErrorID     string        // Finished with ReasonError: the id of the failure's details, for operators
	// Joined (TurnStarted): the run ids of the queued messages collected
	// into this turn besides its own; the store forgets them with the
	// turn's own queued row, in the same transaction.
	Joined []string
	// Runner (TurnStarted): the name of the runner the turn runs on.
	Runner string
	// Sender (TurnStarted): who sent the turn's message, as its channel
	// names them (the turn's owner, e.g. "telegram-user:42"); "" when the
	// channel did not say. The store keeps it with the turn, so a Retry
	// button offered after a restart is still bound to its sender.
	Sender string
	// Queued (TurnStarted): how long the turn's message waited in its
	// session's queue before the turn started (0: it started at once).
	Queued time.Duration
	// Approval is the question of ApprovalRequested and ApprovalResolved;
	// nil for other kinds. It is never changed after it is published.
	Approval *Approval

	// Locals is the run's storage for subscribers (see Local); nil for an
	// event of no run. It is a reference, not part of the value: a
	// subscriber that keeps the event beyond its handler (a queue) should
	// clear it, and must never read it later.
	Locals *Locals
}

// Approval outcomes (Approval.Outcome of ApprovalResolved).
const (
	ApprovalSelected  = "selected"  // someone chose OptionID
	ApprovalTimeout   = "timeout"   // nobody answered in time: denied
	ApprovalCancelled = "cancelled" // the turn ended while it waited
	ApprovalExpired   = "expired"   // the gateway restarted while it waited
)

// ApprovalOption is one answer a person may give.
type ApprovalOption struct {
	ID    string `json:"id"`
	Label string `json:"label"`
	Kind  string `json:"kind"` // allow_once | allow_always | reject_once | reject_always
}

// Allows reports whether choosing o lets the action run.
func (o ApprovalOption) Allows() bool { return o.Kind == "allow_once" || o.Kind == "allow_always" }

// Approval is a question a runner asks the person a turn belongs to
// (ApprovalRequested), and how it was settled (ApprovalResolved).
type Approval struct {
	ID        string           `json:"id"` // unique in the gateway: "ap_" + random
	Title     string           `json:"title"`
	Detail    string           `json:"detail,omitempty"`
	Tool      string           `json:"tool,omitempty"`
	Options   []ApprovalOption `json:"options"`
	CreatedAt time.Time        `json:"createdAt"`
	ExpiresAt time.Time        `json:"expiresAt"` // when it is denied unanswered

	// Set in ApprovalResolved only.
	Outcome    string    `json:"outcome,omitempty"`    // ApprovalSelected, ApprovalTimeout, ApprovalCancelled, ApprovalExpired
	OptionID   string    `json:"optionId,omitempty"`   // the chosen option (a timeout: the first reject option)
	OptionKind string    `json:"optionKind,omitempty"` // its kind
	By         string    `json:"by,omitempty"`         // who answered, as the channel names them
	ResolvedAt time.Time `json:"resolvedAt,omitzero"`
}

// Option returns the option with the given id.
func (a *Approval) Option(id string) (ApprovalOption, bool) {
	for _, o := range a.Options {
		if o.ID == id {
			return o, true
		}
	}
	return ApprovalOption{}, false
}

// Allowed reports whether a settled approval lets the action run.
func (a *Approval) Allowed() bool {
	return a.Outcome == ApprovalSelected && (a.OptionKind == "allow_once" || a.OptionKind == "allow_always")
}
