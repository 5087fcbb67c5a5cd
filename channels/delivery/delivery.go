// Package delivery is what every channel that sends messages out of band
// shares: per-destination pacing under a global rate (Limiter, Pacer), the
// retry policy of one message (Policy: a 429's retry-after honored, 5xx and
// network errors retried with backoff, a refusal final), the recording of
// the outcome in the outbox (Record), and a FIFO per destination with its
// worker (Deliverer) for a channel that has nothing else to send.
//
// A channel supplies a Sender that sends one message to one destination and
// says what went wrong with typed errors: *RetryAfterError (rate limited:
// try again after a while), *TemporaryError (the server or the network
// failed: try again with backoff); any other error is a permanent refusal.
// Telegram keeps only what is Telegram's: rendering, splitting, the inline
// keyboard and its live progress message (which shares the chat's pacing
// through the same Pacer and Limiter).
package delivery

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Message is one message to deliver to a destination.
type Message struct {
	// ID is the message's outbox row; 0 for a message that is not in the
	// outbox (a direct answer): its outcome is not recorded.
	ID int64
	// RunID is the turn the message ends ("" for a direct answer).
	RunID string
	// Kind is the outbox kind ("final", "notice"), "" for a direct answer.
	Kind string
	// Text is what the destination reads; the Sender renders it.
	Text string
}

// Sender sends one message to one destination. Its error says what to do:
// *RetryAfterError or *TemporaryError (see Classify); anything else is a
// permanent refusal (the chat is gone, the bot was blocked).
type Sender interface {
	Send(ctx context.Context, dest string, m Message) error
}

// RetryAfterError is a rate limit: the destination (or the whole service)
// takes nothing more for After.
type RetryAfterError struct {
	After time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("rate limited, retry after %s: %v", e.After, e.Err)
}
func (e *RetryAfterError) Unwrap() error { return e.Err }

// TemporaryError is a failure that may pass (a 5xx, a network error, an
// answer that could not be read): the message is tried again with backoff.
type TemporaryError struct{ Err error }

func (e *TemporaryError) Error() string { return e.Err.Error() }
func (e *TemporaryError) Unwrap() error { return e.Err }

// Temporary wraps err (nil stays nil) as a *TemporaryError.
func Temporary(err error) error {
	if err == nil {
		return nil
	}
	return &TemporaryError{Err: err}
}

// Class says what to do about a failed send.
type Class int

// The classes.
const (
	OK        Class = iota
	RateLimit       // wait the retry-after, then try again
	Transient       // try again with backoff
	Permanent       // do not try again: MarkFailed
	Canceled        // our own context ended: the message stays pending
)

// Classify sorts err. retryAfter is set for RateLimit.
func Classify(ctx context.Context, err error) (c Class, retryAfter time.Duration) {
	if err == nil {
		return OK, 0
	}
	var ra *RetryAfterError
	if errors.As(err, &ra) {
		return RateLimit, max(ra.After, 0)
	}
	if ctx.Err() != nil {
		return Canceled, 0
	}
	var te *TemporaryError
	if errors.As(err, &te) {
		return Transient, 0
	}
	return Permanent, 0
}
