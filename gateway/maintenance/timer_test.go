package maintenance

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnguard/turnguard/event"
)

// timerRegistry is the design a Go engineer would pick instead of the
// scheduler: one runtime timer per turn (time.AfterFunc), Timer.Reset on
// every step completion, and the runtime's timer heaps doing the ordering.
// Each turn's timer is armed for the earlier of its step (liveness) deadline
// and its wall clock; the callback re-checks, because a Reset racing a
// firing timer can run the callback for a deadline that has since moved.
// It is here only as a baseline for the benchmarks.
type timerRegistry struct {
	mu      sync.Mutex
	turns   map[string]*timerTurn
	epoch   time.Time
	onAbort func(t *timerTurn, reason event.StopReason, deadline, now time.Duration)
}

type timerTurn struct {
	reg          *timerRegistry
	id           string
	cancel       context.CancelFunc // the runner's context
	timer        *time.Timer
	stepTimeout  time.Duration
	wall         time.Duration // deadline, since the epoch
	lastProgress atomic.Int64  // since the epoch
	aborted      atomic.Bool
}

func newTimerRegistry(onAbort func(t *timerTurn, reason event.StopReason, deadline, now time.Duration)) *timerRegistry {
	return &timerRegistry{turns: map[string]*timerTurn{}, epoch: time.Now(), onAbort: onAbort}
}

func (g *timerRegistry) now() time.Duration { return time.Since(g.epoch) }

// register starts a turn with a wall clock timeout and a step timeout
// (0 = none).
func (g *timerRegistry) register(id string, timeout, stepTimeout time.Duration) *timerTurn {
	now := g.now()
	t := &timerTurn{reg: g, id: id, stepTimeout: stepTimeout, wall: now + timeout}
	_, t.cancel = context.WithCancel(context.Background())
	t.lastProgress.Store(int64(now))
	t.timer = time.AfterFunc(t.next(now)-now, t.fire)
	g.mu.Lock()
	g.turns[id] = t
	g.mu.Unlock()
	return t
}

// next is the earlier of the step deadline and the wall clock.
func (t *timerTurn) next(now time.Duration) time.Duration {
	if t.stepTimeout <= 0 {
		return t.wall
	}
	return min(t.wall, time.Duration(t.lastProgress.Load())+t.stepTimeout)
}

// stepCompleted is the progress reset: store the time, Reset the timer.
func (t *timerTurn) stepCompleted() {
	now := t.reg.now()
	t.lastProgress.Store(int64(now))
	t.timer.Reset(t.next(now) - now)
}

func (t *timerTurn) fire() {
	now := t.reg.now()
	due, reason := t.wall, event.ReasonTimeout
	if t.stepTimeout > 0 {
		if s := time.Duration(t.lastProgress.Load()) + t.stepTimeout; s < due {
			due, reason = s, event.ReasonStepTimeout
		}
	}
	if now < due { // a Reset moved the deadline after this firing was queued
		t.timer.Reset(due - now)
		return
	}
	if !t.aborted.CompareAndSwap(false, true) {
		return
	}
	t.cancel()
	t.reg.mu.Lock()
	delete(t.reg.turns, t.id)
	t.reg.mu.Unlock()
	if t.reg.onAbort != nil {
		t.reg.onAbort(t, reason, due, t.reg.now())
	}
}

// stop ends every turn's timer (the benchmark's cleanup).
func (g *timerRegistry) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, t := range g.turns {
		t.timer.Stop()
		t.cancel()
	}
	clear(g.turns)
}
