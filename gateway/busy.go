package gateway

import (
	"context"
	"fmt"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/timeout"
)

// BusyMode says what Send does with a message for a session whose turn is
// running (agents.defaults.busy.mode, overridden per channel).
type BusyMode string

// The busy modes.
const (
	// BusyQueue: the message waits and runs as its own turn when the
	// running one ends, however it ends.
	BusyQueue BusyMode = "queue"
	// BusyCollect: messages that arrive while busy are joined into one
	// follow-up turn.
	BusyCollect BusyMode = "collect"
	// BusySteer: the message is handed to the running turn when its runner
	// can take it (runner.Steerer); otherwise it is queued (Ack.FellBack).
	BusySteer BusyMode = "steer"
	// BusyInterrupt: the running turn stops with reason superseded and the
	// message runs next.
	BusyInterrupt BusyMode = "interrupt"
	// BusyReject: Send answers *BusyError.
	BusyReject BusyMode = "reject"
)

// Valid reports whether m is one of the busy modes.
func (m BusyMode) Valid() bool {
	switch m {
	case BusyQueue, BusyCollect, BusySteer, BusyInterrupt, BusyReject:
		return true
	}
	return false
}

// The statuses of a message Send did not start at once.
const (
	// StatusQueued: the message waits behind the running turn (Ack.Ahead
	// messages before it). Its turn will start with Ack.RunID as its run id
	// (for collect: the run id of the follow-up turn it joined).
	StatusQueued Status = "queued"
	// StatusSteered: the message was handed to the running turn, whose run
	// id is Ack.RunID.
	StatusSteered Status = "steered"
)

// QueueFullError is returned by Send when the session already has
// busy.maxQueued messages waiting.
type QueueFullError struct {
	SessionKey string
	Limit      int
}

func (e *QueueFullError) Error() string {
	return fmt.Sprintf("session %s: %d messages already queued (busy.maxQueued)", e.SessionKey, e.Limit)
}
func (e *QueueFullError) Unwrap() error { return ErrBusy }

// UserText is what a channel shows a person whose message was refused.
func (e *QueueFullError) UserText() string {
	return fmt.Sprintf("📥 %d messages are already waiting — wait for an answer, or send /stop to stop the request and drop them.", e.Limit)
}

// QueuedMessage is a message waiting for its session's running turn to end.
type QueuedMessage struct {
	RunID      string    `json:"runId"` // the run id its turn will have
	SessionKey string    `json:"sessionKey"`
	Channel    string    `json:"channel"`
	ChatRef    string    `json:"chatRef,omitempty"`
	Owner      string    `json:"-"`
	Text       string    `json:"text"`
	QueuedAt   time.Time `json:"queuedAt"`
}

// QueueStore keeps queued messages across restarts. Send returns
// StatusQueued only after Add committed durably; the engine removes a
// message when its turn starts or it is dropped. Implemented by the store
// (adapted in cmd/gateway); optional (nil: queued messages live in memory).
type QueueStore interface {
	AddQueued(ctx context.Context, m QueuedMessage) error
	// RemoveQueued forgets the messages with these run ids (started,
	// joined into a collect turn or dropped). Unknown ids are ignored.
	RemoveQueued(ctx context.Context, runIDs ...string) error
	// Queued lists every stored queued message, oldest first.
	Queued(ctx context.Context) ([]QueuedMessage, error)
}

// TurnStatus is a value snapshot of a session: its running turn (if any),
// that turn's limits, and the messages queued behind it. Channels see turns
// only through it.
type TurnStatus struct {
	SessionKey string
	Running    bool           // a turn is active (running, or stopping: Turn.State says)
	Turn       abort.Snapshot // valid when Running
	Limits     timeout.Settings
	Queue      []QueuedMessage // oldest first
}

// Status returns a snapshot of the session's running turn and queue.
func (e *Engine) Status(sessionKey string) TurnStatus {
	e.mu.Lock()
	s, ok := e.sessions[sessionKey]
	var run *abort.Run
	if ok {
		run = s.active
	}
	e.mu.Unlock()
	st := TurnStatus{SessionKey: sessionKey}
	if run != nil {
		st.Running, st.Turn, st.Limits = true, run.Snapshot(), run.Settings
	}
	return st
}

// StopResult reports what Stop did.
type StopResult struct {
	AbortResult
	// Stopping: the running turn was already being stopped.
	Stopping bool
	// Dropped counts the queued messages discarded.
	Dropped int
}

// Stop is /stop: it aborts the session's running turn with reason user and
// discards the session's queued messages, on behalf of requester (the
// turn's owner, or anyone when operator; otherwise ErrNotOwner and nothing
// changes).
func (e *Engine) Stop(ctx context.Context, sessionKey, requester string, operator bool) (StopResult, error) {
	st := e.Status(sessionKey)
	res, err := e.Abort(ctx, sessionKey, "", event.ReasonUser, requester, operator)
	if err != nil {
		return StopResult{}, err
	}
	return StopResult{AbortResult: res, Stopping: !res.Aborted && st.Running}, nil
}
