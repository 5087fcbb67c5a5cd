// The engine's public errors: the sentinels callers branch on with
// errors.Is and the typed refusals Send, History and the busy modes return.
// Each typed error carries UserText, the sentence (from messages/) a
// channel shows a person; Error() is for logs only.

package gateway

import (
	"errors"
	"fmt"

	"github.com/turnguard/turnguard/messages"
)

// Errors callers branch on.
var (
	ErrBusy         = errors.New("session busy")
	ErrEmpty        = errors.New("empty message")
	ErrTooLong      = errors.New("message too long")
	ErrNoRunner     = errors.New("no such runner")
	ErrNotOwner     = errors.New("not allowed to abort this run")
	ErrWrongSession = errors.New("runId does not match sessionKey")
	ErrShutdown     = errors.New("gateway is shutting down")
	ErrRunnerStuck  = errors.New("runner refuses new turns: too many of its runs ignore cancellation")
	ErrUnavailable  = errors.New("gateway cannot start new turns right now")
	// ErrInvalidBusyMode: SetBusyMode was given a mode that is not one.
	ErrInvalidBusyMode = errors.New("not a busy mode")

	// ErrReservedRunID: the run id lies in another channel's namespace
	// (config.RunIDReserved).
	ErrReservedRunID = errors.New("run id is reserved for another channel")
)

// RunnerStuckError is returned by Send when the channel's runner has
// server.maxStuckRuns force-finalized runs that still run (they ignored
// cancellation): a new turn would only add one more.
type RunnerStuckError struct {
	Runner string
	Stuck  int // force-finalized runs of Runner still running
	Limit  int // server.maxStuckRuns
}

func (e *RunnerStuckError) Error() string {
	return fmt.Sprintf("runner %s: %d force-finalized runs still running (server.maxStuckRuns %d): %v", e.Runner, e.Stuck, e.Limit, ErrRunnerStuck)
}
func (e *RunnerStuckError) Unwrap() error { return ErrRunnerStuck }

// UserText is what a channel shows a person whose message was refused.
func (e *RunnerStuckError) UserText() string {
	return messages.RunnerStuck
}

// UnavailableError is returned by Send when Options.Admit refuses new turns
// (the store cannot write). It is temporary: the client should retry
// shortly.
type UnavailableError struct{ Cause error }

func (e *UnavailableError) Error() string { return fmt.Sprintf("%s: %v", ErrUnavailable, e.Cause) }
func (e *UnavailableError) Unwrap() error { return ErrUnavailable }

// UserText is what a channel shows a person; it never names the cause.
func (e *UnavailableError) UserText() string {
	return messages.Unavailable
}

// BusyError is returned by Send when the session already has an active turn.
type BusyError struct {
	SessionKey string
	RunID      string // the active run
	Stopping   bool   // the active run was aborted and is being stopped
}

func (e *BusyError) Error() string {
	if e.Stopping {
		return fmt.Sprintf("session %s busy: still stopping run %s", e.SessionKey, e.RunID)
	}
	return fmt.Sprintf("session %s busy with run %s", e.SessionKey, e.RunID)
}
func (e *BusyError) Unwrap() error { return ErrBusy }

// UserText is what a channel shows a person for a busy session.
func (e *BusyError) UserText() string {
	if e.Stopping {
		return messages.BusyStopping
	}
	return messages.Busy
}

// HistoryUnavailableError is History's answer when the session's stored
// history could not be loaded (the store does not answer) or ctx ended
// while it loaded: the history is unknown, not empty (issue 20, defect 7).
type HistoryUnavailableError struct {
	SessionKey string
	Cause      error
}

func (e *HistoryUnavailableError) Error() string {
	return fmt.Sprintf("history of session %s: %v", e.SessionKey, e.Cause)
}
func (e *HistoryUnavailableError) Unwrap() error { return e.Cause }

// UserText is what a client shows; it never names the cause.
func (e *HistoryUnavailableError) UserText() string { return messages.HistoryUnavailable }

// QueueFullError is returned by Send when the session already has
// busy.maxQueued messages waiting (Limit), or when the message would bring
// the text waiting past busy.maxQueuedBytes (Bytes, the budget; 0 when it
// was the count). Waiting are the queued messages and those steered into
// the running turn that its runner has not taken yet, in every busy mode.
type QueueFullError struct {
	SessionKey string
	Limit      int
	Bytes      int
}

func (e *QueueFullError) Error() string {
	if e.Bytes > 0 {
		return fmt.Sprintf("session %s: the text waiting would pass %d bytes (busy.maxQueuedBytes)", e.SessionKey, e.Bytes)
	}
	return fmt.Sprintf("session %s: %d messages already queued (busy.maxQueued)", e.SessionKey, e.Limit)
}
func (e *QueueFullError) Unwrap() error { return ErrBusy }

// UserText is what a channel shows a person whose message was refused.
func (e *QueueFullError) UserText() string {
	switch {
	case e.Bytes > 0:
		return messages.QueueBytesFull(e.Bytes)
	case e.Limit == 0: // busy.maxQueued 0: nothing may wait
		return (&BusyError{}).UserText()
	}
	return messages.QueueFull(e.Limit)
}
