package maintenance

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnguard/turnguard/event"
)

// sweepRegistry is a port of the design turnguard replaces (OpenClaw's chat
// abort maintenance): a map of controllers behind one mutex, and a ticker
// that every interval walks every entry and aborts the expired ones. It is
// here only as the baseline the benchmarks measure the scheduler against.
type sweepRegistry struct {
	mu      sync.Mutex
	entries map[string]*sweepEntry
	epoch   time.Time
	onAbort func(id string, deadline time.Duration, now time.Duration)
	sweeps  int
}

type sweepEntry struct {
	cancel       context.CancelCauseFunc
	deadline     time.Duration // wall clock, since epoch
	stepTimeout  time.Duration // 0 = none
	lastProgress atomic.Int64  // since epoch; the progress reset is one store
	reason       event.StopReason
}

func newSweepRegistry(onAbort func(id string, deadline, now time.Duration)) *sweepRegistry {
	return &sweepRegistry{entries: map[string]*sweepEntry{}, epoch: time.Now(), onAbort: onAbort}
}

func (s *sweepRegistry) now() time.Duration { return time.Since(s.epoch) }

func (s *sweepRegistry) register(id string, timeout time.Duration) *sweepEntry {
	return s.registerStep(id, timeout, 0)
}

// registerStep registers a turn with a step (liveness) timeout too.
func (s *sweepRegistry) registerStep(id string, timeout, stepTimeout time.Duration) *sweepEntry {
	_, cancel := context.WithCancelCause(context.Background())
	now := s.now()
	e := &sweepEntry{cancel: cancel, deadline: now + timeout, stepTimeout: stepTimeout, reason: event.ReasonTimeout}
	e.lastProgress.Store(int64(now))
	s.mu.Lock()
	s.entries[id] = e
	s.mu.Unlock()
	return e
}

// stepCompleted is the progress reset: one atomic store, found at the next pass.
func (s *sweepRegistry) stepCompleted(e *sweepEntry) { e.lastProgress.Store(int64(s.now())) }

// sweep is one pass: O(n) under the lock, whatever is due.
func (s *sweepRegistry) sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweeps++
	now := s.now()
	for id, e := range s.entries {
		due := e.deadline
		if e.stepTimeout > 0 {
			due = min(due, time.Duration(e.lastProgress.Load())+e.stepTimeout)
		}
		if now >= due {
			e.cancel(nil)
			delete(s.entries, id)
			if s.onAbort != nil {
				s.onAbort(id, due, s.now())
			}
		}
	}
}

func (s *sweepRegistry) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.sweep()
		}
	}
}
