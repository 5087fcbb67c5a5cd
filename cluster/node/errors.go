package node

import (
	"context"
	"errors"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
)

// wireError is an error of the engine on its way back from a forward: its
// kind and the fields its type has, and its words (Msg, err.Error()).
type wireError struct {
	Kind       string           `json:"kind"`
	Msg        string           `json:"msg"`
	SessionKey string           `json:"sessionKey,omitempty"`
	RunID      string           `json:"runId,omitempty"`
	Replica    string           `json:"replica,omitempty"`
	Runner     string           `json:"runner,omitempty"`
	Cause      string           `json:"cause,omitempty"`
	Stopping   bool             `json:"stopping,omitempty"`
	Running    bool             `json:"running,omitempty"`
	Limit      int              `json:"limit,omitempty"`
	Bytes      int              `json:"bytes,omitempty"`
	Stuck      int              `json:"stuck,omitempty"`
	StopReason event.StopReason `json:"stopReason,omitempty"`
	Outcome    *gateway.Outcome `json:"outcome,omitempty"`
}

// sentinels are the errors callers compare with errors.Is, by kind. The
// typed errors that unwrap to some of them are encoded first.
var sentinels = []struct {
	kind string
	err  error
}{
	{"busy", gateway.ErrBusy},
	{"empty", gateway.ErrEmpty},
	{"too_long", gateway.ErrTooLong},
	{"no_runner", gateway.ErrNoRunner},
	{"not_owner", gateway.ErrNotOwner},
	{"wrong_session", gateway.ErrWrongSession},
	{"shutdown", gateway.ErrShutdown},
	{"runner_stuck", gateway.ErrRunnerStuck},
	{"unavailable", gateway.ErrUnavailable},
	{"cluster_unavailable", gateway.ErrClusterUnavailable},
	{"not_turn_owner", gateway.ErrNotTurnOwner},
	{"approval_not_found", gateway.ErrApprovalNotFound},
	{"approval_forbidden", gateway.ErrApprovalForbidden},
	{"approval_option", gateway.ErrApprovalOption},
	{"canceled", context.Canceled},
	{"deadline", context.DeadlineExceeded},
}

// encodeError describes err for the wire; nil for nil.
func encodeError(err error) *wireError {
	if err == nil {
		return nil
	}
	w := &wireError{Msg: err.Error()}
	if e, ok := errors.AsType[*gateway.BusyError](err); ok {
		w.Kind, w.SessionKey, w.RunID, w.Stopping = "busy_error", e.SessionKey, e.RunID, e.Stopping
	} else if e, ok := errors.AsType[*gateway.QueueFullError](err); ok {
		w.Kind, w.SessionKey, w.Limit, w.Bytes = "queue_full_error", e.SessionKey, e.Limit, e.Bytes
	} else if e, ok := errors.AsType[*gateway.RunnerStuckError](err); ok {
		w.Kind, w.Runner, w.Stuck, w.Limit = "runner_stuck_error", e.Runner, e.Stuck, e.Limit
	} else if e, ok := errors.AsType[*gateway.UnavailableError](err); ok {
		w.Kind = "unavailable_error"
		if e.Cause != nil {
			w.Cause = e.Cause.Error()
		}
	} else if e, ok := errors.AsType[*gateway.HeldError](err); ok {
		w.Kind, w.SessionKey, w.RunID, w.Replica = "held_error", e.SessionKey, e.RunID, e.Replica
	} else if e, ok := errors.AsType[*gateway.RunExistsError](err); ok {
		w.Kind, w.SessionKey, w.RunID, w.Replica = "run_exists_error", e.SessionKey, e.RunID, e.Replica
		w.Running, w.StopReason, w.Outcome = e.Running, e.StopReason, e.Outcome
	} else {
		for _, s := range sentinels {
			if errors.Is(err, s.err) {
				w.Kind = s.kind
				break
			}
		}
	}
	return w
}

// decode is the error encodeError described: the same type with the same
// fields, or the sentinel, behind the same words; an unknown kind is a
// plain error with the words.
func (w *wireError) decode() error {
	var typed error
	switch w.Kind {
	case "busy_error":
		typed = &gateway.BusyError{SessionKey: w.SessionKey, RunID: w.RunID, Stopping: w.Stopping}
	case "queue_full_error":
		typed = &gateway.QueueFullError{SessionKey: w.SessionKey, Limit: w.Limit, Bytes: w.Bytes}
	case "runner_stuck_error":
		typed = &gateway.RunnerStuckError{Runner: w.Runner, Stuck: w.Stuck, Limit: w.Limit}
	case "unavailable_error":
		e := &gateway.UnavailableError{}
		if w.Cause != "" {
			e.Cause = errors.New(w.Cause)
		}
		typed = e
	case "held_error":
		typed = &gateway.HeldError{SessionKey: w.SessionKey, RunID: w.RunID, Replica: w.Replica}
	case "run_exists_error":
		typed = &gateway.RunExistsError{SessionKey: w.SessionKey, RunID: w.RunID, Replica: w.Replica,
			Running: w.Running, StopReason: w.StopReason, Outcome: w.Outcome}
	default:
		for _, s := range sentinels {
			if s.kind == w.Kind {
				typed = s.err
				break
			}
		}
	}
	switch {
	case typed == nil:
		return errors.New(w.Msg)
	case typed.Error() == w.Msg:
		return typed
	}
	return &remoteError{msg: w.Msg, err: typed}
}

// remoteError is an engine's error that wrapped a typed or sentinel error
// in words of its own: it says the words and unwraps to the error.
type remoteError struct {
	msg string
	err error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.err }
