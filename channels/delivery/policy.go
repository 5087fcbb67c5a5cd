package delivery

import (
	"context"
	"fmt"
	"time"
)

// Policy is how one message is tried: pacing before every attempt, a
// rate limit's retry-after honored (the destination is blocked meanwhile),
// transient failures retried with exponential backoff, a permanent refusal
// returned at once. The zero value uses the defaults.
type Policy struct {
	MaxAttempts   int           // tries on transient failures (default 5)
	MaxRateLimits int           // rate-limit answers tolerated for one message (default 8)
	FirstBackoff  time.Duration // the first wait after a transient failure (default 500ms), doubling …
	MaxBackoff    time.Duration // … up to this (default 8s)
}

// The defaults of Policy.
const (
	DefaultMaxAttempts   = 5
	DefaultMaxRateLimits = 8
	DefaultFirstBackoff  = 500 * time.Millisecond
	DefaultMaxBackoff    = 8 * time.Second
)

func (p Policy) withDefaults() Policy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.MaxRateLimits <= 0 {
		p.MaxRateLimits = DefaultMaxRateLimits
	}
	if p.FirstBackoff <= 0 {
		p.FirstBackoff = DefaultFirstBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = DefaultMaxBackoff
	}
	return p
}

// Pace is how an attempt waits for its slot.
type Pace interface {
	// Wait returns once the destination may receive a message (its
	// spacing, any block, and the global limiter), having taken the slot,
	// or with ctx's error.
	Wait(ctx context.Context) error
	// Block holds every message to the destination for d (a retry-after).
	Block(d time.Duration)
}

// Retry describes an attempt that failed and will be tried again, for a
// channel's log.
type Retry struct {
	Class Class         // RateLimit or Transient
	Wait  time.Duration // the retry-after, or the backoff
	Err   error
}

// Do sends with send until it succeeds, fails permanently, exhausts the
// policy or ctx ends; it returns send's last error (nil on success).
// onRetry, if set, is told about each failure that is tried again.
func (p Policy) Do(ctx context.Context, pace Pace, send func(context.Context) error, onRetry func(Retry)) error {
	p = p.withDefaults()
	backoff := p.FirstBackoff
	var failures, limited int
	for {
		if err := pace.Wait(ctx); err != nil {
			return err
		}
		err := send(ctx)
		class, after := Classify(ctx, err)
		switch class {
		case OK:
			return nil
		case RateLimit:
			pace.Block(after)
			if limited++; limited > p.MaxRateLimits {
				return err
			}
			if onRetry != nil {
				onRetry(Retry{Class: class, Wait: after, Err: err})
			}
		case Transient:
			if failures++; failures >= p.MaxAttempts {
				return err
			}
			if onRetry != nil {
				onRetry(Retry{Class: class, Wait: backoff, Err: err})
			}
			if err := Sleep(ctx, backoff); err != nil {
				return err
			}
			backoff = min(backoff*2, p.MaxBackoff)
		default:
			return err
		}
	}
}

// Outbox is where the outcome of a durable message is recorded
// (*store.SQLite implements it).
type Outbox interface {
	MarkDelivered(ctx context.Context, id int64) error
	MarkAttempt(ctx context.Context, id int64, err error) error
	MarkFailed(ctx context.Context, id int64, reason string) error
}

// Record writes the outcome of delivering outbox message id, whose last
// error was sendErr: delivered (nil); failed for good (a permanent
// refusal: MarkFailed, never sent again); one more attempt (a failure that
// may pass: MarkAttempt, it stays pending and is resent later); nothing
// when ctx ended first (it stays pending for the next start). ctx is the
// one the delivery ran under; the update itself is bounded on its own.
// A delivery is recorded until the outbox takes it (see markDelivered):
// an error then means ctx ended or MarkWait ran out first.
func Record(ctx context.Context, o Outbox, id int64, sendErr error) (Class, error) {
	class, _ := Classify(ctx, sendErr)
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var err error
	switch class {
	case OK:
		err = markDelivered(ctx, o, id)
	case Canceled:
		return class, nil
	case Permanent:
		err = o.MarkFailed(octx, id, sendErr.Error())
	default:
		err = o.MarkAttempt(octx, id, sendErr)
	}
	if err != nil {
		return class, fmt.Errorf("record delivery of outbox message %d: %w", id, err)
	}
	return class, nil
}

// MarkWait bounds how long Record keeps trying to record a delivery.
const MarkWait = 10 * time.Minute

// markDelivered records that message id was delivered, trying again
// (backing off up to 5 s) until the outbox says so, ctx ends or MarkWait
// runs out. The message reached its destination: a failed mark — which
// may even have committed, its answer lost (the database restarted) — must
// not leave it pending, to be sent again as if it were not; marking twice
// is harmless. Each try is bounded on its own.
func markDelivered(ctx context.Context, o Outbox, id int64) error {
	end := time.Now().Add(MarkWait)
	wait := 100 * time.Millisecond
	for {
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		err := o.MarkDelivered(octx, id)
		cancel()
		if err == nil {
			return nil
		}
		if !time.Now().Add(wait).Before(end) || Sleep(ctx, wait) != nil {
			return err
		}
		wait = min(2*wait, 5*time.Second)
	}
}
