package maintenance

import (
	"context"
	"sync"
	"time"

	"github.com/turnguard/turnguard/gateway/event"
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
	cancel   context.CancelCauseFunc
	deadline time.Duration // since epoch
	reason   event.StopReason
}

func newSweepRegistry(onAbort func(id string, deadline, now time.Duration)) *sweepRegistry {
	return &sweepRegistry{entries: map[string]*sweepEntry{}, epoch: time.Now(), onAbort: onAbort}
}

func (s *sweepRegistry) now() time.Duration { return time.Since(s.epoch) }

func (s *sweepRegistry) register(id string, timeout time.Duration) {
	_, cancel := context.WithCancelCause(context.Background())
	s.mu.Lock()
	s.entries[id] = &sweepEntry{cancel: cancel, deadline: s.now() + timeout, reason: event.ReasonTimeout}
	s.mu.Unlock()
}

// sweep is one pass: O(n) under the lock, whatever is due.
func (s *sweepRegistry) sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweeps++
	now := s.now()
	for id, e := range s.entries {
		if now >= e.deadline {
			e.cancel(nil)
			delete(s.entries, id)
			if s.onAbort != nil {
				s.onAbort(id, e.deadline, s.now())
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
