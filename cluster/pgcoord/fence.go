package pgcoord

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// renewer is the database side of keeping a lease, as the fencing loop
// sees it (a fake in the synctest tests).
type renewer interface {
	// renew sets the lease's expiry to the database's now() plus the
	// lease. It returns an error wrapping ErrLeaseLost when the lease row
	// is gone, expired or superseded; any other error is transient.
	renew(ctx context.Context) error
}

// fencing is when the loop renews and when it gives up.
type fencing struct {
	every time.Duration // between successful renewals
	retry time.Duration // after a failed renewal
	limit time.Duration // fence once the last successful renewal was sent this long ago
}

// fencingFor is the policy for a lease: renew every lease/3, retry every
// lease/12, fence at 2/3 of the lease.
func fencingFor(lease time.Duration) fencing {
	return fencing{every: lease / 3, retry: lease / 12, limit: lease * 2 / 3}
}

// keepAlive renews the lease until ctx is done (it returns nil) or the
// replica must consider itself fenced (it returns why, wrapping ErrFenced).
// lastOK is when the last successful renewal (or the join) was sent. Every
// time is read from the monotonic clock (time.Now's reading, compared with
// Sub), never from the wall clock. A renewal that hangs is abandoned at the
// fencing deadline: the fence is reported on time whatever the database
// does.
func keepAlive(ctx context.Context, r renewer, f fencing, lastOK time.Time) error {
	next := lastOK.Add(f.every)
	for {
		deadline := lastOK.Add(f.limit)
		if err := sleepUntil(ctx, next); err != nil {
			return nil
		}
		sent := time.Now()
		if !sent.Before(deadline) {
			return notRenewed(sent.Sub(lastOK), f)
		}
		late, err := renewBy(ctx, r, deadline)
		switch {
		case ctx.Err() != nil:
			return nil
		case late:
			return notRenewed(time.Since(lastOK), f)
		case err == nil:
			lastOK, next = sent, sent.Add(f.every)
		case errors.Is(err, ErrLeaseLost):
			return fmt.Errorf("%w: %w", ErrFenced, err)
		default:
			next = time.Now().Add(f.retry)
			if next.After(deadline) {
				next = deadline
			}
		}
	}
}

// renewBy runs one renewal that must succeed before deadline; late is true
// when the deadline came first (the renewal is cancelled and left to end
// on its own).
func renewBy(ctx context.Context, r renewer, deadline time.Time) (late bool, err error) {
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.renew(rctx) }()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil && !time.Now().Before(deadline) {
			return true, err
		}
		return false, err
	case <-t.C:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

func notRenewed(since time.Duration, f fencing) error {
	return fmt.Errorf("%w: no successful lease renewal for %s (fencing at %s, before the lease can expire)",
		ErrFenced, since.Round(time.Millisecond), f.limit)
}

// sleepUntil waits until t (on the monotonic clock) or ctx is done.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
