package maintenance

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
)

// Observer receives the scheduler's measurements (for metrics). Methods are
// called on the scheduler's goroutines (one per shard, so concurrently) and
// must be safe for concurrent use and not block. Any may be nil.
type Observer struct {
	// AbortLate is called for each deadline abort with how long after the
	// deadline the abort happened.
	AbortLate func(reason event.StopReason, late time.Duration)
}

// Scheduler is the deadline scheduler. Create it with New, start Run on one
// goroutine, and call Track for every registered run; Remove after a run is
// released. It publishes Progress, Aborted and ForceFinalized events through
// each run's Publish, so they are ordered with the run's other events; the
// publish function is called from every shard's goroutine concurrently.
//
// Runs are spread over shardsPerCore shards per core (GOMAXPROCS; at most
// abort.Slots), by their registry slot; each shard has its own lock, its own
// 4-ary min-heap of {when, run} values and its own goroutine and timer, so
// comparisons read only the heap (no run is touched while sifting) and due
// runs are handled on every core. A run's armed time (Run.Armed) is the one valid entry's key: an
// entry whose key no longer equals its run's armed time is stale and is
// dropped when it surfaces (lazy deletion), and a shard whose stale entries
// outnumber its live ones by more than compactSlack is compacted, so the heap
// holds at most twice its live runs plus compactSlack entries.
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

	shards []shard
	policy atomic.Uint32 // bit 0 enabled, bit 1 autoAbort

	stats Stats
}

// shardsPerCore: more shards than cores keep each due batch short, so an
// abort waits behind fewer looks; 4 per core measured 0.1–0.6 ms lower p50
// lateness than 1 per core at 100K busy turns (docs/performance.md), at the
// same CPU. A sleeping shard costs nothing.
const shardsPerCore = 4

// compactSlack is how many stale entries a shard tolerates beyond its live
// count before it compacts.
const compactSlack = 1024

// shard is one heap of the scheduler with its lock and wake-up channel.
type shard struct {
	mu   sync.Mutex
	h    []entry // 4-ary min-heap by when
	live int     // runs armed in this shard (each has exactly one valid entry)
	wake chan struct{}
	_    [64]byte // keep shards' locks on separate cache lines
}

// entry is a heap entry: valid while run.Armed() == when.
type entry struct {
	when time.Duration
	run  *abort.Run
}

// Stats are the scheduler's counters. Read them with Stats().
type Stats struct {
	Wakeups        atomic.Uint64 // loop iterations woken by the timer
	Looks          atomic.Uint64 // runs examined (due or early)
	Rearms         atomic.Uint64 // runs that surfaced early and were re-armed
	Progress       atomic.Uint64
	Warnings       atomic.Uint64 // budget warnings
	ForceFinalized atomic.Uint64
	aborts         [8]atomic.Uint64
}

// StatsSnapshot is a copy of the counters.
type StatsSnapshot struct {
	Wakeups        uint64                      `json:"wakeups"`
	Looks          uint64                      `json:"looks"`
	Rearms         uint64                      `json:"rearms"`
	Progress       uint64                      `json:"progressNotices"`
	Warnings       uint64                      `json:"budgetWarnings"`
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
	n := min(max(shardsPerCore*runtime.GOMAXPROCS(0), 1), abort.Slots)
	s := &Scheduler{reg: reg, publish: publish, obs: obs, shards: make([]shard, n)}
	for i := range s.shards {
		s.shards[i].wake = make(chan struct{}, 1)
	}
	s.policy.Store(3)
	reg.OnSooner(s.Touch)
	return s
}

func (s *Scheduler) shardOf(r *abort.Run) *shard { return &s.shards[r.Slot()%len(s.shards)] }

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

// Remove stops watching r. Its heap entry becomes stale and is dropped when
// it surfaces or at the shard's next compaction.
func (s *Scheduler) Remove(r *abort.Run) {
	sh := s.shardOf(r)
	sh.mu.Lock()
	if r.Armed() != 0 {
		r.SetArmed(0)
		sh.live--
		sh.compact()
	}
	sh.mu.Unlock()
}

// arm makes r due at t (registry time) at the latest: it puts r in its
// shard's heap at t, or, if t is earlier than its entry, adds an entry at t
// and leaves the old one stale. It never moves an entry later — a later time
// is reached lazily, by the entry surfacing and being re-armed — so of two
// racing arms (a Touch from a fresh view, a look from an older one) the
// earlier time wins. A released run is not armed.
func (s *Scheduler) arm(r *abort.Run, t time.Duration) {
	sh := s.shardOf(r)
	sh.mu.Lock()
	first := sh.armLocked(r, t)
	sh.mu.Unlock()
	if first {
		select {
		case sh.wake <- struct{}{}:
		default:
		}
	}
}

// armLocked is arm with sh.mu held, for r in sh; it reports whether r's new
// entry is the shard's earliest (its goroutine must then be woken).
func (sh *shard) armLocked(r *abort.Run, t time.Duration) bool {
	if t <= 0 {
		t = 1
	}
	a := r.Armed()
	if r.Released() || (a != 0 && a <= t) {
		return false
	}
	r.SetArmed(t)
	if a == 0 {
		sh.live++
	}
	sh.push(entry{when: t, run: r})
	first := sh.h[0].run == r && sh.h[0].when == t
	if a != 0 {
		sh.compact()
	}
	return first
}

// Run is the scheduler loop: one goroutine per shard, each sleeping until
// its earliest armed run is due and handling every due run. It returns when
// ctx is done and every shard's goroutine has stopped.
func (s *Scheduler) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for i := 1; i < len(s.shards); i++ {
		wg.Go(func() { s.runShard(ctx, &s.shards[i]) })
	}
	s.runShard(ctx, &s.shards[0])
	wg.Wait()
}

// runShard is one shard's loop. Each wake-up pops the whole due batch under
// one lock hold, then handles it without the lock.
func (s *Scheduler) runShard(ctx context.Context, sh *shard) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var due []*abort.Run
	var rearm []entry
	for {
		now := s.reg.Now()
		due = due[:0]
		sh.mu.Lock()
		for len(sh.h) > 0 && sh.h[0].when <= now {
			e := sh.pop()
			if e.run.Armed() != e.when {
				continue // stale: the run was re-armed earlier or removed
			}
			e.run.SetArmed(0)
			sh.live--
			due = append(due, e.run)
		}
		next := sh.dropStaleTop()
		sh.mu.Unlock()
		if len(due) > 0 {
			// Handle the batch, then re-arm the runs that surfaced early
			// under one lock hold: the shard's own goroutine loops at once,
			// so no wake-up is needed.
			rearm = rearm[:0]
			for _, r := range due {
				if t := s.look(r, now); t > 0 {
					rearm = append(rearm, entry{when: t, run: r})
				}
			}
			if len(rearm) > 0 {
				sh.mu.Lock()
				for _, e := range rearm {
					sh.armLocked(e.run, e.when)
				}
				sh.mu.Unlock()
			}
			clear(due)
			clear(rearm)
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
		case <-sh.wake:
			timer.Stop()
		}
	}
}

// testHookLookDecided, when set by a test, runs in look between the
// decision and acting on it: the window in which a concurrent Touch races.
var testHookLookDecided func(*abort.Run)

// look applies the ladder to one due run until nothing more is due, and
// returns when it is next due (0 = not to be armed); the caller arms it.
func (s *Scheduler) look(r *abort.Run, now time.Duration) time.Duration {
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
			}
			return d.Next
		case Drop:
			return 0
		case Progress:
			s.progress(r, now)
		case Warn:
			s.warn(r, now)
		case Abort:
			if ev, ok := r.AbortDue(d.Reason); ok { // look decides the grace next: no Touch
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
			return 0
		}
	}
	return 0
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

// warn publishes r's budget warning, once: how long is left before the
// earlier of its wall clock and ceiling. The engine turns it into words for
// the person and a note for the runner.
func (s *Scheduler) warn(r *abort.Run, now time.Duration) {
	if !r.MarkWarned() {
		return
	}
	v := r.View()
	_, deadline, _ := r.Settings.WarnAt(v.Start, v.WallDeadline, v.Ceiling)
	cur, last := r.CurrentStep()
	s.stats.Warnings.Add(1)
	r.Publish(s.publish, event.Event{Kind: event.BudgetWarning, Step: cur, LastStep: last,
		Elapsed: now - v.Start, Limit: deadline - now, Deadline: s.reg.Wall(deadline)})
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
		Progress: s.stats.Progress.Load(), Warnings: s.stats.Warnings.Load(), ForceFinalized: s.stats.ForceFinalized.Load(),
		Aborts: map[event.StopReason]uint64{},
	}
	for i, r := range abortReasons {
		out.Aborts[r] = s.stats.aborts[i].Load()
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		out.Entries += sh.live
		if next := sh.dropStaleTop(); next > 0 && (out.NextDue == 0 || next < out.NextDue) {
			out.NextDue = next
		}
		sh.mu.Unlock()
	}
	return out
}

// The shard's heap. Every method is called with sh.mu held.

// push adds e.
func (sh *shard) push(e entry) {
	h := append(sh.h, e)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 4
		if h[p].when <= e.when {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = e
	sh.h = h
}

// pop removes and returns the earliest entry; the heap must not be empty.
func (sh *shard) pop() entry {
	h := sh.h
	top := h[0]
	n := len(h) - 1
	last := h[n]
	h[n] = entry{}
	h = h[:n]
	if n > 0 {
		siftDown(h, 0, last)
	}
	sh.h = h
	return top
}

// siftDown places e at slot i or below.
func siftDown(h []entry, i int, e entry) {
	n := len(h)
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		for j := c + 1; j < min(c+4, n); j++ {
			if h[j].when < h[m].when {
				m = j
			}
		}
		if h[m].when >= e.when {
			break
		}
		h[i] = h[m]
		i = m
	}
	h[i] = e
}

// dropStaleTop pops stale entries off the top and returns the earliest valid
// entry's time (0 = none).
func (sh *shard) dropStaleTop() time.Duration {
	for len(sh.h) > 0 {
		if e := sh.h[0]; e.run.Armed() == e.when {
			return e.when
		}
		sh.pop()
	}
	return 0
}

// compact drops every stale entry once they outnumber the live ones by more
// than compactSlack (amortised O(1) per stale entry), and gives back memory
// the heap no longer needs.
func (sh *shard) compact() {
	if len(sh.h)-sh.live <= sh.live+compactSlack {
		return
	}
	h := sh.h[:0]
	for _, e := range sh.h {
		if e.run.Armed() == e.when {
			h = append(h, e)
		}
	}
	clear(sh.h[len(h):])
	if cap(h) > 4*len(h)+compactSlack {
		h = append([]entry(nil), h...)
	}
	for i := (len(h) - 2) / 4; len(h) > 1 && i >= 0; i-- { // from the last entry's parent up
		siftDown(h, i, h[i])
	}
	sh.h = h
}
