// Package abort owns the registry of chat abort controllers: one Run per turn,
// keyed by run id (the client's idempotency key). A Run holds the turn's
// context, its three deadlines (wall clock, per-step liveness, hard ceiling),
// its current and last step, and its outcome, which moves exactly once from
// running to finished or aborted by a compare-and-swap.
//
// The registry decides nothing about time: the maintenance scheduler reads
// runs through View and calls Abort; the runner's callbacks write progress.
package abort

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/timeout"
)

// ErrDuplicate is returned (wrapped in *DuplicateError) by Register when the
// run id is already live.
var ErrDuplicate = errors.New("run already in flight")

// DuplicateError reports a Register refused because the run id is live; Run
// is the existing run so the caller can answer "in flight".
type DuplicateError struct{ Run *Run }

func (e *DuplicateError) Error() string { return fmt.Sprintf("run %q: %v", e.Run.ID, ErrDuplicate) }
func (e *DuplicateError) Unwrap() error { return ErrDuplicate }

const shards = 64

// Slots is the number of distinct Run.Slot values.
const Slots = shards

// Registry holds the live runs. The zero Registry is not usable; call New.
// All methods are safe for concurrent use. Register and Release take one of
// 64 shard locks; nothing on a run's progress path takes a registry lock.
type Registry struct {
	epoch     time.Time
	seed      maphash.Seed
	shard     [shards]shard
	onRelease func(*Run)
	onSooner  func(*Run)
}

type shard struct {
	mu   sync.Mutex
	runs map[string]*Run
	// base is the first cancellable context Register was given for this
	// shard and parent its values without its cancellation, which the
	// shard's runs' contexts derive from (see parentFor).
	base   context.Context
	parent context.Context
	stop   func() bool // base's AfterFunc; never called: it ends the shard's runs
	_      [8]byte     // keep shards on separate cache lines
}

// parentFor returns the context a run registered with ctx derives its own
// from. Every run of the gateway is registered with the same base context,
// and a cancellable context keeps a map of its children under one lock: a
// run's context derived from it (or from one cancellable parent per shard)
// would insert into that map at each start and delete from it at each abort
// or release — in the scheduler's abort burst, that map delete was its
// largest single cost (docs/performance.md, "queueing"). So each shard
// takes the first cancellable context it is given as its base, derives its
// runs' contexts from the base's values without its cancellation
// (context.WithoutCancel: nothing is registered, nothing removed), and ends
// its live runs itself when the base ends, with the base's cause, from one
// context.AfterFunc registered once (endAll). A run registered after the
// base ended is ended by Register. Values and cause reach the run as they
// would directly; the base's deadline does not (the gateway's base has
// none), and a run's Err is context.Canceled. A run registered with any
// other context derives from it directly. Contexts are compared as
// interface values (every context of the standard library is a pointer).
// Called with s.mu held.
func (s *shard) parentFor(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx // never cancelled: deriving from it registers nothing
	}
	if s.base == nil {
		s.base = ctx
		s.parent = context.WithoutCancel(ctx)
		s.stop = context.AfterFunc(ctx, s.endAll)
	}
	if s.base == ctx {
		return s.parent
	}
	return ctx
}

// endAll ends the shard's live runs' contexts with the cause of its base,
// which has ended.
func (s *shard) endAll() {
	cause := context.Cause(s.base)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.runs {
		r.cancel(cause)
	}
}

// New returns an empty registry whose clock starts now. onRelease, if not
// nil, is called once per run when its session becomes free (the runner
// returned, or the run was force-finalized).
func New(onRelease func(*Run)) *Registry {
	r := &Registry{epoch: time.Now(), seed: maphash.MakeSeed(), onRelease: onRelease}
	for i := range r.shard {
		r.shard[i].runs = make(map[string]*Run)
	}
	return r
}

// OnSooner sets fn, which a run calls right after a change that can make it
// due earlier than whoever watches its deadlines last planned: a step
// started (a progress notice and a step deadline begin), a resume (the step
// deadline comes back) and an abort (the abort grace begins). Changes that
// only move what is due later (a step completing, a heartbeat, activity, a
// pause, a finish) do not call it: a watcher finds those lazily when it next
// looks. The maintenance scheduler installs its Touch here. Call OnSooner
// once, before the first Register; fn runs on the caller's goroutine and
// must not block.
func (g *Registry) OnSooner(fn func(*Run)) { g.onSooner = fn }

// sooner tells the watcher that r may be due earlier than planned.
func (g *Registry) sooner(r *Run) {
	if g.onSooner != nil {
		g.onSooner(r)
	}
}

// now is the registry clock: monotonic nanoseconds since the epoch, plus
// one, so that 0 never is a time and can mean "not yet" in every field.
func (g *Registry) now() int64 { return int64(time.Since(g.epoch)) + 1 }

// Now returns the registry clock as a duration since its epoch.
func (g *Registry) Now() time.Duration { return time.Duration(g.now()) }

// Wall returns the wall-clock time of registry time t.
func (g *Registry) Wall(t time.Duration) time.Time { return g.wall(int64(t)) }

func (g *Registry) wall(ns int64) time.Time { return g.epoch.Add(time.Duration(ns - 1)) }

func (g *Registry) shardOf(id string) *shard {
	return &g.shard[g.slotOf(id)]
}

func (g *Registry) slotOf(id string) uint32 { return uint32(maphash.String(g.seed, id) % shards) }

// Spec describes a turn to register.
type Spec struct {
	RunID      string
	SessionKey string
	Channel    string
	ChatRef    string
	Settings   timeout.Settings
	// Attempt is the turn's attempt number (agents.defaults.resume): 2 and
	// up for a turn dispatched again after a restart or a takeover; 0 or 1
	// for a first attempt (Run.Attempt is then 1).
	Attempt int
	// Start is when the run started, in registry time (Registry.Now),
	// taken before Register (a cluster claim, decided first, wrote the
	// limits it implies); 0, or a time after Register's, means Register's.
	Start time.Duration
}

// Register creates the Run for spec. Its context derives from ctx, which must
// outlive the turn (pass the gateway's base context, not a request's). If the
// run id is live, Register returns a *DuplicateError carrying the existing run.
func (g *Registry) Register(ctx context.Context, spec Spec) (*Run, error) {
	if spec.RunID == "" {
		return nil, errors.New("register: empty run id")
	}
	slot := g.slotOf(spec.RunID)
	s := &g.shard[slot]
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.runs[spec.RunID]; ok {
		return nil, &DuplicateError{Run: old}
	}
	start := g.now()
	if spec.Start > 0 && int64(spec.Start) < start {
		start = int64(spec.Start)
	}
	r := &Run{
		ID: spec.RunID, SessionKey: spec.SessionKey, Channel: spec.Channel, ChatRef: spec.ChatRef, Attempt: max(spec.Attempt, 1),
		Settings: spec.Settings, reg: g, start: start, slot: slot,
	}
	r.ctx, r.cancel = context.WithCancelCause(s.parentFor(ctx))
	if ctx == s.base && ctx.Err() != nil {
		r.cancel(context.Cause(ctx)) // the base ended: endAll may have run before r was added
	}
	s.runs[spec.RunID] = r
	return r, nil
}

// Get returns the live run with id.
func (g *Registry) Get(id string) (*Run, bool) {
	s := g.shardOf(id)
	s.mu.Lock()
	r, ok := s.runs[id]
	s.mu.Unlock()
	return r, ok
}

// Release frees the run's session: it removes the run from the registry,
// cancels its context and calls the onRelease hook. Only the first call for a
// run does anything; it reports whether it was that call. forced is true
// when the run is force-finalized (its runner never returned).
func (g *Registry) Release(r *Run) bool {
	if !r.released.CompareAndSwap(false, true) {
		return false
	}
	s := g.shardOf(r.ID)
	s.mu.Lock()
	if s.runs[r.ID] == r {
		delete(s.runs, r.ID)
	}
	s.mu.Unlock()
	r.cancel(context.Canceled)
	if g.onRelease != nil {
		g.onRelease(r)
	}
	return true
}

// Len returns the number of live runs.
func (g *Registry) Len() int {
	n := 0
	for i := range g.shard {
		s := &g.shard[i]
		s.mu.Lock()
		n += len(s.runs)
		s.mu.Unlock()
	}
	return n
}

// Runs returns the live runs, in no particular order.
func (g *Registry) Runs() []*Run {
	var out []*Run
	for i := range g.shard {
		s := &g.shard[i]
		s.mu.Lock()
		for _, r := range s.runs {
			out = append(out, r)
		}
		s.mu.Unlock()
	}
	return out
}

// View is a consistent-enough snapshot of a run for deciding what is due,
// in registry time (durations since the epoch). Deadlines that do not apply
// are 0.
type View struct {
	Start        time.Duration
	WallDeadline time.Duration
	Ceiling      time.Duration // 0 = none
	LivenessRef  time.Duration // last progress
	Paused       bool
	StepRunning  bool
	StepSeq      uint32
	StepStarted  time.Duration
	NoticeSeq    uint32 // step with an open progress notice, 0 = none
	LastNoticeAt time.Duration
	Warned       bool // the budget warning is out
	State        State
	AbortedAt    time.Duration
	Returned     bool
	Released     bool
	Settings     timeout.Settings
}

// View returns the run's current view.
func (r *Run) View() View {
	v := View{
		Start:        time.Duration(r.start),
		WallDeadline: time.Duration(r.wallDeadline()),
		Ceiling:      time.Duration(r.ceiling()),
		LivenessRef:  time.Duration(r.livenessRef()),
		Paused:       r.pausedAt.Load() != 0,
		NoticeSeq:    r.noticeSeq.Load(),
		LastNoticeAt: time.Duration(r.lastNoticeAt.Load()),
		Warned:       r.warned.Load(),
		State:        r.State(),
		AbortedAt:    time.Duration(r.abortedAt.Load()),
		Returned:     r.returned.Load(),
		Released:     r.released.Load(),
		Settings:     r.Settings,
	}
	if c, done := r.load(); c != nil && done == 0 {
		v.StepRunning, v.StepSeq, v.StepStarted = true, c.seq, time.Duration(c.started)
	}
	return v
}

// Scheduler bookkeeping. These are for the maintenance scheduler only.

// SetNotice records that a progress notice was sent for step seq at now.
func (r *Run) SetNotice(seq uint32, now time.Duration) {
	r.lastNoticeAt.Store(int64(now))
	r.noticeSeq.Store(seq)
}

// ClearNotice closes an open progress notice and reports whether there was
// one (the caller then emits Recovered). Cheap when none is open.
func (r *Run) ClearNotice() bool {
	if r.noticeSeq.Load() == 0 {
		return false
	}
	return r.noticeSeq.Swap(0) != 0
}

// MarkWarned records that the budget warning is out and reports whether
// this call did it (false: it was out already).
func (r *Run) MarkWarned() bool { return r.warned.CompareAndSwap(false, true) }

// Armed returns when the scheduler will next look at the run (0 = never).
func (r *Run) Armed() time.Duration { return time.Duration(r.armed.Load()) }

// SetArmed records the scheduler's next look.
func (r *Run) SetArmed(t time.Duration) { r.armed.Store(int64(t)) }

// Slot returns a number in [0, Slots) fixed when the run was registered (its
// registry shard: a hash of its run id), so that a watcher can spread runs
// over its own shards without hashing again.
func (r *Run) Slot() int { return int(r.slot) }

// Snapshot is a run as operators and /status see it.
type Snapshot struct {
	RunID       string           `json:"runId"`
	SessionKey  string           `json:"sessionKey"`
	Channel     string           `json:"channel"`
	ChatRef     string           `json:"chatRef,omitempty"`
	Attempt     int              `json:"attempt"` // Run.Attempt
	State       string           `json:"state"`
	StopReason  event.StopReason `json:"stopReason,omitempty"`
	StartedAt   time.Time        `json:"startedAt"`
	Elapsed     time.Duration    `json:"elapsedNs"`
	CurrentStep event.Step       `json:"currentStep,omitzero"`
	StepElapsed time.Duration    `json:"stepElapsedNs,omitempty"`
	LastStep    event.Step       `json:"lastStep,omitzero"`
	Paused      bool             `json:"paused"`
	Stalled     bool             `json:"stalled"`
	// Class is what the turn is doing (working, long_running, stalled,
	// stuck): set by whoever decides the run's deadlines (the gateway, from
	// maintenance.Decide); Snapshot leaves it empty.
	Class        string        `json:"class,omitempty"`
	UntilStep    time.Duration `json:"untilStepTimeoutNs,omitempty"` // 0 = disabled or paused
	UntilWall    time.Duration `json:"untilTimeoutNs"`
	UntilCeiling time.Duration `json:"untilMaxTurnTimeNs,omitempty"` // 0 = no ceiling
	Returned     bool          `json:"returned"`
}

// Snapshot returns the run as of now.
func (r *Run) Snapshot() Snapshot {
	now := r.now()
	v := r.View()
	cur, last := r.steps2()
	s := Snapshot{
		RunID: r.ID, SessionKey: r.SessionKey, Channel: r.Channel, ChatRef: r.ChatRef, Attempt: r.Attempt,
		State: r.State().String(), StopReason: r.StopReason(), StartedAt: r.StartedAt(),
		Elapsed: time.Duration(now - r.start), CurrentStep: cur, LastStep: last, Paused: v.Paused,
		UntilWall: time.Duration(r.wallDeadline() - now), Returned: v.Returned,
	}
	if v.StepRunning {
		s.StepElapsed = time.Duration(now) - v.StepStarted
		s.Stalled = r.Settings.ProgressNotifyAfter > 0 && s.StepElapsed >= r.Settings.ProgressNotifyAfter
	}
	if r.Settings.StepTimeout > 0 && !v.Paused {
		s.UntilStep = v.LivenessRef + r.Settings.StepTimeout - time.Duration(now)
	}
	if c := r.ceiling(); c > 0 {
		s.UntilCeiling = time.Duration(c - now)
	}
	return s
}
