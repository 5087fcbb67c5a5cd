// Package store owns turnguard's persistence: sessions, the chat history that
// chat.history returns, one row per turn (its state, stop reason, steps and
// timestamps), a journal of turn events, and the outbox of terminal messages
// (final replies and timeout/stop notices) that a channel has not yet
// delivered.
//
// The default implementation, SQLite, keeps everything in one SQLite file
// (modernc.org/sqlite, pure Go, WAL mode) whose schema is versioned and
// migrated on Open. store/postgres keeps the same in a PostgreSQL database
// that several gateways can share. Both are Backends built on the
// EventRecorder of this package (recorder.go), which owns the asynchronous
// path below; a backend supplies only its SQL (BatchWriter). The
// conformance suite store/storetest checks that they behave alike.
//
// Two paths with different guarantees feed it:
//
//   - Turn events. The engine publishes every transition on the event bus;
//     Handle is subscribed there and copies the event into a queue without
//     blocking. One writer goroutine drains the queue in batches, one
//     transaction per batch. When the queue is full, events a turn can do
//     without (step and progress events) are shed and counted (Dropped),
//     so a slow disk never slows a turn; turn starts and endings are never
//     shed. A batch that fails for the state of the disk is retried until
//     written. Use Flush to wait for what was enqueued.
//   - Health. When writes fail for the state of the disk or the file (disk
//     full, I/O error, the file deleted), Health returns an error until
//     they succeed again; the gateway then fails readiness and refuses new
//     turns. A database file deleted under the process is recreated from
//     the open copy.
//   - Retention. Prune (and, with Options.Retention, a background pruner)
//     deletes old history, journal entries and delivered outbox rows in
//     small batches; a running turn's rows and an undelivered outbox row
//     are never pruned.
//   - Terminal messages. For the channels that deliver out of band
//     (Options.OutboxChannels, e.g. Telegram), the writer puts a turn's
//     terminal messages (messages.Ending: the reply, or the partial reply
//     and the notice) into the outbox in the same transaction that records
//     the turn's end, committed durably: the end is recorded if and only if
//     its messages are in the outbox, before any pacing or network call.
//     After the commit Options.OnOutbox tells the channel, which claims the
//     rows with Pending and then calls MarkDelivered, MarkAttempt or
//     MarkFailed. Enqueue writes a row synchronously and durably for
//     messages that are not a recorded ending (the restart's interrupted
//     notice). After a restart, Pending lists what still has to be sent, so
//     no final reply or notice is lost.
//   - Queued messages. AddQueued writes a message that waits behind its
//     session's running turn, synchronously and durably, before the sender
//     is told it is queued; RemoveQueued forgets it when its turn starts or
//     it is dropped; Queued lists them, oldest first, so a restart runs
//     them after the recovery notices. Retention never deletes them.
//   - Approvals. The questions runners ask the person (ApprovalRequested)
//     are recorded pending with the turn events, then with how they were
//     settled; a turn's end cancels what is still pending, and the
//     start-up recovery expires what the previous process left pending
//     (approval.go). Approval and Approvals read them.
//
// At start-up the gateway calls RunningTurns: every turn still "running" was
// cut off by the previous process. For each, MarkInterrupted (exactly once,
// even with concurrent callers) ends it with stop reason "interrupted",
// journals it and appends the notice to the history. The notice for the
// turn's channel and chat goes into the outbox too; enqueueing it before
// MarkInterrupted makes the pair crash-safe (a crash in between leaves the
// turn running, and the next start's Enqueue is deduplicated), where the
// other order can lose the notice.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/turnguard/turnguard/event"
)

// Errors callers branch on. They are returned wrapped; test with errors.Is.
var (
	// ErrNotFound: no turn or outbox message has that id.
	ErrNotFound = errors.New("not found")
	// ErrDuplicate: Enqueue found the run's message of that kind already in
	// the outbox; the returned id is the existing row's.
	ErrDuplicate = errors.New("already in the outbox")
	// ErrInvalid: an argument is missing or malformed.
	ErrInvalid = errors.New("invalid argument")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("store closed")
	// ErrSchemaTooNew: the database was written by a newer turnguard whose
	// schema this build does not know; it is left untouched.
	ErrSchemaTooNew = errors.New("database schema is newer than this build")
	// ErrNotHeld: a replica about to send an outbox row no longer holds it
	// (its lease was lost, a survivor took its claims over, or the row was
	// delivered or failed meanwhile): it must not send it.
	ErrNotHeld = errors.New("outbox message not held by this replica")
	// ErrBehind: an earlier outbox message of the same chat is still
	// pending; this one waits for it (a chat's messages go in order).
	ErrBehind = errors.New("an earlier outbox message of the chat is pending")
)

// Limits on the number of rows a query returns.
const (
	DefaultLimit = 200   // used when a limit is 0 or negative
	MaxLimit     = 10000 // larger limits are lowered to this
)

// Store is what the engine's side asks of persistence. SQLite is the
// default implementation, store/postgres the shared one for several
// replicas; consumers should depend on the smallest of Recorder, Reader and
// Outbox they need.
type Store interface {
	Recorder
	Reader
	Outbox
	Close() error
}

// Recorder records turn events. Handle is an event.Handler: subscribe it to
// the bus for all sessions.
type Recorder interface {
	// Handle enqueues ev for writing. It never blocks and never fails: when
	// the queue is full, step and progress events are shed and counted;
	// turn starts and endings are kept.
	Handle(ev event.Event)
	// Flush returns once every event enqueued before the call has been
	// written (or has failed and been counted), or when ctx is done.
	Flush(ctx context.Context) error
	// Stats returns the recorder's counters.
	Stats() Stats
}

// Reader answers questions about the recorded past.
type Reader interface {
	History(ctx context.Context, sessionKey string, limit int) ([]Message, error)
	Sessions(ctx context.Context, limit int) ([]Session, error)
	Turn(ctx context.Context, runID string) (Turn, error)
	RunningTurns(ctx context.Context) ([]Turn, error)
	MarkInterrupted(ctx context.Context, runID, message string) (bool, error)
	Journal(ctx context.Context, f Filter) ([]JournalEntry, error)
	StallHistory(ctx context.Context, f Filter) ([]Episode, error)
}

// Outbox holds terminal messages until their channel has delivered them.
type Outbox interface {
	Enqueue(ctx context.Context, m OutboxMessage) (int64, error)
	MarkDelivered(ctx context.Context, id int64) error
	MarkAttempt(ctx context.Context, id int64, err error) error
	MarkFailed(ctx context.Context, id int64, reason string) error
	Pending(ctx context.Context, channel string, limit int) ([]OutboxMessage, error)
	MarkPartsSent(ctx context.Context, id int64, n int) error
	IsPending(ctx context.Context, id int64) (bool, error)
	Counts(ctx context.Context) (OutboxCounts, error)
}

var _ Store = (*SQLite)(nil)

// Backend is everything the gateway (cmd/gateway) asks of its store: a
// Store, the queued messages, the approvals, write health, retention and
// the user text of a run (Telegram's Retry). SQLite and the PostgreSQL
// store (store/postgres) implement it, with the same semantics: the
// conformance suite store/storetest checks both.
type Backend interface {
	Store
	Queue
	ApprovalStore
	RetryTokens
	AgentSessions
	SessionSettings
	TurnDetails
	Resumes
	Health() error
	Prune(ctx context.Context, now time.Time) (PruneStats, error)
	UserText(ctx context.Context, runID string) (string, error)
}

var _ Backend = (*SQLite)(nil)

// Role is who wrote a history message.
type Role string

// The roles.
const (
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
)

// Message is one entry of a session's chat history.
//
// A turn contributes the user's message when it starts and, when it ends,
// one assistant message whose StopReason is the turn's:
//   - finished normally ("stop"): the reply;
//   - finished with an error ("error"), aborted (timeout, step_timeout,
//     max_turn_time, user, shutdown) or interrupted by a restart: the partial
//     reply if there was one, a blank line, then the notice the user was
//     shown. An empty ending adds no message.
type Message struct {
	RunID      string           `json:"runId,omitempty"`
	Role       Role             `json:"role"`
	Text       string           `json:"text"`
	StopReason event.StopReason `json:"stopReason,omitempty"`
	Time       time.Time        `json:"time"`
}

// Session is one conversation.
type Session struct {
	Key       string    `json:"key"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"` // last turn start or end (a shared PostgreSQL store's: up to 1 s earlier, see docs/scaling.md)
	Messages  int       `json:"messages"`  // history length
}

// TurnState is where a turn is in its life. The values match abort.State's
// names.
type TurnState string

// The turn states. Running is the only non-terminal one. A turn cut off by a
// restart is Aborted with stop reason "interrupted".
const (
	TurnRunning  TurnState = "running"
	TurnFinished TurnState = "finished"
	TurnAborted  TurnState = "aborted"
)

// Turn is one run as recorded.
type Turn struct {
	RunID      string `json:"runId"`
	SessionKey string `json:"sessionKey"`
	Channel    string `json:"channel"`
	ChatRef    string `json:"chatRef,omitempty"`
	// Sender is who sent the turn's message, as its channel names them
	// (event.Event.Sender of its TurnStarted); "" when unknown.
	Sender     string           `json:"sender,omitempty"`
	State      TurnState        `json:"state"`
	StopReason event.StopReason `json:"stopReason,omitempty"`
	StartedAt  time.Time        `json:"startedAt"`
	UpdatedAt  time.Time        `json:"updatedAt"`
	EndedAt    time.Time        `json:"endedAt,omitzero"` // zero while running
	// CurrentStep is the step running at the last recorded event: zero once
	// it completed or the turn finished; for an aborted turn, the step that
	// was running when it was stopped. StartedAt is not kept.
	CurrentStep event.Step `json:"currentStep,omitzero"`
	// LastStep is the last completed step. StartedAt is not kept.
	LastStep event.Step `json:"lastStep,omitzero"`
	// Deadline (wall clock), Ceiling (max turn time) and StepTimeout are
	// zero when unknown: the turn events do not carry them yet.
	Deadline    time.Time     `json:"deadline,omitzero"`
	Ceiling     time.Time     `json:"ceiling,omitzero"`
	StepTimeout time.Duration `json:"stepTimeoutNs,omitempty"`
}

// JournalEntry is one recorded turn event. Delta events are not journaled;
// TurnStarted entries do not repeat the user's text (it is in the history)
// and Finished entries do not repeat the reply.
type JournalEntry struct {
	ID         int64            `json:"id"`
	RunID      string           `json:"runId"`
	SessionKey string           `json:"sessionKey"`
	Seq        uint64           `json:"seq,omitempty"` // the event's per-run sequence; 0 for store-made entries
	Kind       event.Kind       `json:"-"`
	KindName   string           `json:"kind"` // Kind.String()
	StopReason event.StopReason `json:"stopReason,omitempty"`
	Step       event.Step       `json:"step,omitzero"` // StartedAt is not kept
	LastStep   string           `json:"lastStep,omitempty"`
	// Elapsed: for Progress how long the step had run, for Aborted the
	// turn's age, for ForceFinalized the time since the abort, for
	// StepCompleted the step's duration.
	Elapsed time.Duration `json:"elapsedNs,omitempty"`
	// Message is the rendered notice (Progress, Aborted, Finished with an
	// error) or the pause reason (Paused).
	Message string    `json:"message,omitempty"`
	Time    time.Time `json:"time"`
}

// Filter selects journal entries or stall episodes. Empty fields do not
// filter. Since is inclusive, Until exclusive. When more than Limit rows
// match, the most recent Limit are returned, oldest first.
type Filter struct {
	SessionKey string
	RunID      string
	Since      time.Time
	Until      time.Time
	Limit      int // 0: DefaultLimit; capped at MaxLimit
}

// Outcome is how a stall episode ended.
type Outcome string

// The outcomes.
const (
	OutcomeRecovered      Outcome = "recovered"       // the slow step made progress again
	OutcomeFinished       Outcome = "finished"        // the turn finished while the notice was open
	OutcomeAborted        Outcome = "aborted"         // the turn was stopped (and its runner returned)
	OutcomeForceFinalized Outcome = "force_finalized" // stopped, and the runner ignored the abort
	OutcomeOpen           Outcome = "open"            // nothing has ended it (yet)
)

// Episode is one stall of a turn: from its first progress notice (or, if
// none came first, its abort) to what ended it.
type Episode struct {
	RunID      string           `json:"runId"`
	SessionKey string           `json:"sessionKey"`
	Step       event.Step       `json:"step,omitzero"` // the slow step, or the step running at the abort
	Started    time.Time        `json:"started"`
	Ended      time.Time        `json:"ended,omitzero"` // zero when Outcome is OutcomeOpen
	Outcome    Outcome          `json:"outcome"`
	StopReason event.StopReason `json:"stopReason,omitempty"` // of the abort or finish that ended it
	Notices    int              `json:"notices"`              // progress notices sent during the episode
}

// Duration is how long the episode lasted, 0 while open.
func (e Episode) Duration() time.Duration {
	if e.Ended.IsZero() {
		return 0
	}
	return e.Ended.Sub(e.Started)
}

// OutboxKind says which terminal message of a run an outbox row is. A run
// has at most one of each.
type OutboxKind string

// The outbox kinds.
const (
	OutboxFinal  OutboxKind = "final"  // the reply of a finished turn
	OutboxNotice OutboxKind = "notice" // the notice of an aborted or interrupted turn
)

// OutboxMessage is a terminal message for a channel to deliver. Enqueue
// reads Channel, ChatRef, RunID, Kind and Text; the other fields are
// reported by Pending.
type OutboxMessage struct {
	ID            int64      `json:"id"`
	Channel       string     `json:"channel"`
	ChatRef       string     `json:"chatRef,omitempty"`
	RunID         string     `json:"runId"`
	Kind          OutboxKind `json:"kind"`
	Text          string     `json:"text"`
	CreatedAt     time.Time  `json:"createdAt"`
	Attempts      int        `json:"attempts"`
	LastError     string     `json:"lastError,omitempty"`
	LastAttemptAt time.Time  `json:"lastAttemptAt,omitzero"`
	// PartsSent is how many parts of a message sent in several (a long
	// reply split) reached the chat (MarkPartsSent); a resend starts after
	// them.
	PartsSent int `json:"partsSent,omitempty"`
}

// OutboxCounts counts outbox rows by status.
type OutboxCounts struct {
	Pending   int `json:"pending"`
	Delivered int `json:"delivered"`
	Failed    int `json:"failed"`
}

// Stats are the recorder's counters, for metrics.
type Stats struct {
	Enqueued   uint64 // events accepted by Handle
	Written    uint64 // events committed
	Dropped    uint64 // progress-type events shed because the queue was full, or refused after Close
	Spilled    uint64 // turn starts and endings kept beyond the queue size (never shed)
	Failed     uint64 // events accepted but not written (invalid, or the write failed)
	QueueDepth int    // events waiting now
}

// ClampLimit is the number of rows a query returns for limit n: DefaultLimit
// for 0 or less, at most MaxLimit.
func ClampLimit(n int) int {
	switch {
	case n <= 0:
		return DefaultLimit
	case n > MaxLimit:
		return MaxLimit
	}
	return n
}
