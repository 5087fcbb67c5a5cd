package pgcoord

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/internal/faketime"
)

// fakeRenewer is the database as the fencing loop sees it: each call asks
// answer, given the call's number (from 1) and when it was sent.
type fakeRenewer struct {
	mu     sync.Mutex
	sent   []time.Time
	answer func(ctx context.Context, n int) error
}

func (f *fakeRenewer) renew(ctx context.Context) error {
	f.mu.Lock()
	f.sent = append(f.sent, time.Now())
	n := len(f.sent)
	f.mu.Unlock()
	return f.answer(ctx, n)
}

func (f *fakeRenewer) calls() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.sent...)
}

var errDown = errors.New("connection refused")

// runKeepAlive runs keepAlive in the bubble with a 3 s lease from now and
// returns its result and how long after the start it returned.
func runKeepAlive(t *testing.T, f *fakeRenewer, stopAfter time.Duration) (error, time.Duration) {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), stopAfter)
	defer cancel()
	err := keepAlive(ctx, f, fencingFor(3*time.Second), start)
	return err, time.Since(start)
}

// A replica whose renewals succeed renews every lease/3 and is never fenced.
func TestKeepAliveRenewsEveryThirdOfTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRenewer{answer: func(context.Context, int) error { return nil }}
		err, took := runKeepAlive(t, f, 30*time.Second+time.Millisecond)
		if err != nil || took != 30*time.Second+time.Millisecond {
			t.Fatalf("keepAlive = %v after %s, want nil when stopped at 30.001s", err, took)
		}
		calls := f.calls()
		if len(calls) != 30 {
			t.Fatalf("%d renewals in 30 s, want 30 (one a second)", len(calls))
		}
		for i := 1; i < len(calls); i++ {
			if d := calls[i].Sub(calls[i-1]); d != time.Second {
				t.Fatalf("renewal %d came %s after the previous, want 1s", i+1, d)
			}
		}
	})
}

// Renewals that fail are retried every lease/12; the replica fences itself
// exactly 2/3 of the lease after the last successful renewal was sent —
// a third of the lease before the database can see it expired.
func TestFencedAtTwoThirdsOfTheLeaseWithoutARenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRenewer{answer: func(_ context.Context, n int) error {
			if n <= 2 {
				return nil // at 1 s and 2 s
			}
			return errDown
		}}
		err, took := runKeepAlive(t, f, time.Minute)
		if !errors.Is(err, ErrFenced) || errors.Is(err, ErrLeaseLost) {
			t.Fatalf("keepAlive = %v, want ErrFenced (not renewed), not ErrLeaseLost", err)
		}
		if took != 4*time.Second {
			t.Fatalf("fenced %s after the start, want 4s (last renewal sent at 2s + 2/3 of the 3 s lease)", took)
		}
		// Retries at 3, 3.25, 3.5, 3.75 s after the failure at 3 s.
		if n := len(f.calls()); n != 6 {
			t.Errorf("%d renewal calls, want 6 (2 successes, the failure at 3 s, retries at 3.25, 3.5, 3.75 s)", n)
		}
	})
}

// A renewal that hangs (a server that accepts the connection and never
// answers) does not delay the fence: it is abandoned at the deadline.
func TestFencedOnTimeWhenARenewalHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRenewer{answer: func(ctx context.Context, n int) error {
			if n == 1 {
				return nil // at 1 s
			}
			<-ctx.Done() // hangs until abandoned
			return ctx.Err()
		}}
		err, took := runKeepAlive(t, f, time.Minute)
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("keepAlive = %v, want ErrFenced", err)
		}
		if took != 3*time.Second {
			t.Fatalf("fenced %s after the start, want 3s (renewal sent at 1s + 2s)", took)
		}
	})
}

// The database saying the lease is gone (expired, deleted, superseded by a
// newer epoch) fences at once, for good.
func TestLeaseLostFencesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRenewer{answer: func(context.Context, int) error {
			return fmt.Errorf("renew: %w", ErrLeaseLost)
		}}
		err, took := runKeepAlive(t, f, time.Minute)
		if !errors.Is(err, ErrFenced) || !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("keepAlive = %v, want ErrFenced and ErrLeaseLost", err)
		}
		if took != time.Second {
			t.Fatalf("fenced %s after the start, want 1s (the first renewal)", took)
		}
	})
}

// A renewal that succeeds slowly counts from when it was sent (the
// server's now() that set the expiry is no earlier than that), not from
// when its answer came.
func TestSlowRenewalCountsFromItsSending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRenewer{answer: func(ctx context.Context, n int) error {
			if n == 1 {
				faketime.Advance(900 * time.Millisecond) // the answer takes 0.9 s
				return nil
			}
			return errDown
		}}
		err, took := runKeepAlive(t, f, time.Minute)
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("keepAlive = %v, want ErrFenced", err)
		}
		if took != 3*time.Second {
			t.Fatalf("fenced %s after the start, want 3s (sent at 1s + 2s), not 3.9s", took)
		}
		if calls := f.calls(); calls[1].Sub(calls[0]) != time.Second {
			t.Errorf("second renewal %s after the first, want 1s (from the first's sending)", calls[1].Sub(calls[0]))
		}
	})
}

// A process that did not run for longer than the fencing limit (a SIGSTOP,
// a paused VM: its timers fire late) fences as soon as it runs again,
// without renewing first: by then a survivor may own its turns.
func TestLateWakeUpFencesWithoutRenewing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRenewer{answer: func(context.Context, int) error { return nil }}
		start := time.Now()
		// The join was sent 5 s ago: the loop finds its first renewal due
		// long past the fencing limit, as after a pause.
		err := keepAlive(context.Background(), f, fencingFor(3*time.Second), start.Add(-5*time.Second))
		if !errors.Is(err, ErrFenced) || time.Since(start) != 0 {
			t.Fatalf("keepAlive = %v after %s, want ErrFenced at once", err, time.Since(start))
		}
		if n := len(f.calls()); n != 0 {
			t.Errorf("%d renewals, want none", n)
		}
	})
}
