package maintenance

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
)

// Observer receives the scheduler's measurements (for metrics). Methods are
// called on the scheduler's goroutine and must not block. Any may be nil.
type Observer struct {
	// AbortLate is called for each deadline abort with how long after the
	// deadline the abort happened.
	AbortLate func(reason event.StopReason, late time.Duration)
}

// Scheduler is the deadline scheduler. Create it with New, start Run on one
// goroutine, and call Track for every registered run; Remove after a run is
// released. It publishes Progress, Aborted and ForceFinalized events through
// each run's Publish, so they are ordered with the run's other events.
//
// Re-arm contract: a run's heap entry is never later than the earliest thing
// due for it. Every change that can make a run due earlier (a step started, a
// resume, an abort) re-arms at once: New installs Touch as the registry's
// OnSooner hook, so the run itself calls it and no caller can forget.
// Changes that only make a run due later (a step completing, a heartbeat,
// activity, a pause) touch nothing: the entry surfaces at its old time and is
// re-armed lazily for the real one. Arming only ever moves an entry earlier,
// so a look that re-arms from a view older than a concurrent Touch cannot
// undo it.
type Scheduler struct {
	reg     *abort.Registry
	publish func(event.Event)
	obs     Observer

	mu     sync.Mutex
	h      runHeap
	wake   chan struct{}
	policy atomic.Uint32 // bit 0 enabled, bit 1 autoAbort

	stats Stats
}

// Stats are the scheduler's counters. Read them with Stats().
type Stats struct {
	Wakeups        atomic.Uint64 // loop iterations woken by the timer
	Looks          atomic.Uint64 // runs examined (due or early)
	Rearms         atomic.Uint64 // runs that surfaced early and were re-armed
	Progress       atomic.Uint64
	ForceFinalized atomic.Uint64
	aborts         [8]atomic.Uint64
}

// StatsSnapshot is a copy of the counters.
type StatsSnapshot struct {
	Wakeups        uint64                      `json:"wakeups"`
	Looks          uint64                      `json:"looks"`
	Rearms         uint64                      `json:"rearms"`
	Progress       uint64                      `json:"progressNotices"`
	ForceFinalized uint64                      `json:"forceFinalized"`
	Aborts         map[event.StopReason]uint64 `json:"aborts"`
	Entries        int                         `json:"entries"`
	NextDue        time.Duration               `json:"nextDueNs"` // registry time of the earliest entry; 0 = none
}

var abortReasons = [...]event.StopReason{event.ReasonTimeout, event.ReasonStepTimeout, event.ReasonMaxTurnTime}

// New returns a scheduler over reg that publishes with publish (typically the
// event bus's Publish). The policy starts enabled with auto-abort. It installs
// itself as reg's OnSooner hook; create it before the first Register.
func New(reg *abort.Registry, publish func(event.Event), obs Observer) *Scheduler {
	s := &Scheduler{reg: reg, publish: publish, obs: obs, wake: make(chan struct{}, 1)}
	s.policy.Store(3)
	reg.OnSooner(s.Touch)
	return s
}

// Policy returns the killswitch policy in force.
func (s *Scheduler) Policy() Policy {
	p := s.policy.Load()
	return Policy{Enabled: p&1 != 0, AutoAbort: p&2 != 0}
}

// SetPolicy changes the killswitches. They apply at once, to live turns too
// (they are killswitches); every live run is re-examined.
func (s *Scheduler) SetPolicy(p Policy) {
	var v uint32
	if p.Enabled {
		v |= 1
	}
	if p.AutoAbort {
		v |= 2
	}
	if s.policy.Swap(v) == v {
		return
	}
	for _, r := range s.reg.Runs() {
		s.arm(r, s.reg.Now())
	}
}

// Track starts watching r. Call it once, right after Register.
func (s *Scheduler) Track(r *abort.Run) { s.Touch(r) }

// Touch re-examines r after a change that may make it due earlier than it is
// armed for. The run calls it itself (through the registry's OnSooner hook)
// after StepStarted, Resume and Abort; other callers need not. It costs a
// Decide and, only when the run must be looked at earlier, a heap update.
// Changes that only push deadlines later (a step completing, a heartbeat, a
// pause) need no Touch: the run surfaces at its old time and is re-armed
// lazily.
func (s *Scheduler) Touch(r *abort.Run) {
	now := s.reg.Now()
	d := Decide(now, r.View(), s.Policy())
	switch {
	case d.Action == Drop:
		s.Remove(r)
	case d.Action != None:
		s.arm(r, now)
	case d.Next > 0:
		if a := r.Armed(); a == 0 || d.Next < a {
			s.arm(r, d.Next)
		}
	}
}

// Remove stops watching r.
func (s *Scheduler) Remove(r *abort.Run) {
	s.mu.Lock()
	if i := r.SchedIndex(); i > 0 {
		heap.Remove(&s.h, i-1)
	}
	r.SetArmed(0)
	s.mu.Unlock()
}

// arm makes r due at t (registry time) at the latest: it puts r in the heap
// at t, or moves its entry to t if t is earlier. It never moves an entry
// later — a later time is reached lazily, by the entry surfacing and being
// re-armed — so of two racing arms (a Touch from a fresh view, a look from an
// older one) the earlier time wins. A released run is not armed.
func (s *Scheduler) arm(r *abort.Run, t time.Duration) {
	if t <= 0 {
		t = 1
	}
	s.mu.Lock()
	i := r.SchedIndex()
	if r.Released() || (i > 0 && r.Armed() <= t) {
		s.mu.Unlock()
		return
	}
	r.SetArmed(t)
	if i > 0 {
		heap.Fix(&s.h, i-1)
	} else {
		heap.Push(&s.h, r)
	}
	first := s.h[0] == r
	s.mu.Unlock()
	if first {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// Run is the scheduler loop. It sleeps until the earliest armed run is due,
// handles every due run, and returns when ctx is done.
func (s *Scheduler) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var due []*abort.Run
	for {
		now := s.reg.Now()
		due = due[:0]
		s.mu.Lock()
		for len(s.h) > 0 && s.h[0].Armed() <= now {
			r := heap.Pop(&s.h).(*abort.Run)
			r.SetArmed(0)
			due = append(due, r)
		}
		var next time.Duration
		if len(s.h) > 0 {
			next = s.h[0].Armed()
		}
		s.mu.Unlock()
		if len(due) > 0 {
			for _, r := range due {
				s.look(r, now)
			}
			clear(due)
			continue
		}
		if next > 0 {
			timer.Reset(next - now)
		}
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
			s.stats.Wakeups.Add(1)
		case <-s.wake:
			timer.Stop()
		}
	}
}

// testHookLookDecided, when set by a test, runs in look between the
// decision and acting on it: the window in which a concurrent Touch races.
var testHookLookDecided func(*abort.Run)

// look applies the ladder to one due run until nothing more is due, then
// re-arms it for its next due time.
func (s *Scheduler) look(r *abort.Run, now time.Duration) {
	s.stats.Looks.Add(1)
	for range 4 {
		d := Decide(now, r.View(), s.Policy())
		if testHookLookDecided != nil {
			testHookLookDecided(r)
		}
		switch d.Action {
		case None:
			if d.Next > 0 {
				s.stats.Rearms.Add(1)
				s.arm(r, d.Next)
			}
			return
		case Drop:
			return
		case Progress:
			s.progress(r, now)
		case Abort:
			if ev, ok := r.Abort(d.Reason); ok {
				s.stats.aborts[reasonIndex(d.Reason)].Add(1)
				if s.obs.AbortLate != nil {
					s.obs.AbortLate(d.Reason, now-d.Due)
				}
				r.Publish(s.publish, ev)
			}
		case ForceFinalize:
			cur, last := r.CurrentStep()
			if s.reg.Release(r) {
				s.stats.ForceFinalized.Add(1)
				r.Publish(s.publish, event.Event{
					Kind: event.ForceFinalized, StopReason: r.StopReason(),
					Elapsed: now - r.View().AbortedAt, Step: cur, LastStep: last,
				})
			}
			return
		}
	}
}

func (s *Scheduler) progress(r *abort.Run, now time.Duration) {
	v := r.View()
	cur, last := r.CurrentStep()
	elapsed := now - v.StepStarted
	r.SetNotice(v.StepSeq, now)
	s.stats.Progress.Add(1)
	r.Publish(s.publish, event.Event{Kind: event.Progress, Step: cur, LastStep: last, Elapsed: elapsed,
		StepTimeout: r.Settings.StepTimeout, Limit: r.Settings.Timeout})
}

func reasonIndex(r event.StopReason) int {
	for i, x := range abortReasons {
		if x == r {
			return i
		}
	}
	return len(abortReasons)
}

// Stats returns a copy of the counters and the heap state.
func (s *Scheduler) Stats() StatsSnapshot {
	out := StatsSnapshot{
		Wakeups: s.stats.Wakeups.Load(), Looks: s.stats.Looks.Load(), Rearms: s.stats.Rearms.Load(),
		Progress: s.stats.Progress.Load(), ForceFinalized: s.stats.ForceFinalized.Load(),
		Aborts: map[event.StopReason]uint64{},
	}
	for i, r := range abortReasons {
		out.Aborts[r] = s.stats.aborts[i].Load()
	}
	s.mu.Lock()
	out.Entries = len(s.h)
	if len(s.h) > 0 {
		out.NextDue = s.h[0].Armed()
	}
	s.mu.Unlock()
	return out
}

// runHeap is a min-heap of runs by armed time; each run knows its slot.
type runHeap []*abort.Run

func (h runHeap) Len() int           { return len(h) }
func (h runHeap) Less(i, j int) bool { return h[i].Armed() < h[j].Armed() }
func (h runHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].SetSchedIndex(i + 1)
	h[j].SetSchedIndex(j + 1)
}
func (h *runHeap) Push(x any) {
	r := x.(*abort.Run)
	r.SetSchedIndex(len(*h) + 1)
	*h = append(*h, r)
}
func (h *runHeap) Pop() any {
	old := *h
	n := len(old)
	r := old[n-1]
	old[n-1] = nil
	r.SetSchedIndex(0)
	*h = old[:n-1]
	return r
}
