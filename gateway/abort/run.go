package abort

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/timeout"
)

// State is the outcome state of a run. Running is the only non-terminal
// state; the move out of it is a compare-and-swap, so exactly one of Finish
// and Abort wins.
type State uint32

// The states.
const (
	StateRunning  State = iota // the runner is working
	StateFinished              // the runner returned first: its result stands
	StateAborted               // an abort won: the stop reason stands
)

func (s State) String() string {
	switch s {
	case StateRunning:
		return "running"
	case StateFinished:
		return "finished"
	case StateAborted:
		return "aborted"
	}
	return "unknown"
}

// stepRec is one step. Records are immutable except done and prev: while a
// record is current its completion time lives in Run.curDone (on the hot
// cache line); when the next step replaces it, the completion is frozen into
// done.
//
// prev links to the last step completed before this one started. Only one
// step back is ever shown, so when a record becomes the prev of a new
// current step its own prev is cut (setCur): otherwise each record would keep
// the one before alive and a run would hold every step it ever took (tens of
// MB for a million steps). A reader that holds a record no longer current
// may find its prev cut; it reloads (loadWithPrev).
type stepRec struct {
	kind, name string
	seq        uint32
	started    int64 // ns since the registry's epoch
	done       atomic.Int64
	prev       atomic.Pointer[stepRec]
}

// Run is the abort controller of one turn. Its identity and settings are
// fixed at Register; its progress fields are atomics written by the runner's
// callbacks; its outcome moves once out of StateRunning.
//
// Run deliberately holds the turn's context.Context: the runner receives it
// and Abort cancels it (with the stop reason as the cause). It is the one
// context in the gateway that outlives a call, and it lives exactly as long as
// the turn.
//
// Who may call what: the runner's goroutine calls StepStarted, StepCompleted,
// Activity, Heartbeat, Pause and Resume (they are safe from any goroutine but
// assume one writer for step bookkeeping); anyone may call Abort, Finish,
// Snapshot and the getters.
//
// Re-arm contract: a call that can make the run due earlier (StepStarted,
// Resume, Abort) tells the registry's OnSooner watcher before it returns, so
// the scheduler re-arms at once (AbortDue, the watcher's own abort, does
// not: the watcher re-decides the run itself); every other call (StepCompleted, Activity,
// Heartbeat, Pause, Finish, MarkReturned) can only make the run due later,
// and is picked up lazily when the scheduler next looks. A liveness reset
// never moves the step deadline earlier: the liveness reference only moves
// forward and is never in the future.
type Run struct {
	// Hot: everything StepCompleted reads or writes is in the first 64 bytes,
	// so the hot path touches one cache line of the Run.
	reg      *Registry
	cur      atomic.Pointer[stepRec] // the running step, or the last completed one
	curDone  atomic.Int64            // when cur completed; 0 while it runs (see load)
	curName  atomic.Pointer[byte]    // cur's name string data, for the hot path's identity check
	start    int64                   // ns since the registry epoch
	curLen   atomic.Int32            // len(cur.name)
	returned atomic.Bool             // the runner's Run call has returned
	released atomic.Bool             // the session is free again (returned or force-finalized)
	state    atomic.Uint32           // State in the low byte, the stop reason's index above it
	steps    atomic.Uint32

	// Owned by the maintenance scheduler (written only by it).
	noticeSeq    atomic.Uint32 // step seq that has an open progress notice; 0 = none
	slot         uint32        // registry shard, fixed at Register (the scheduler shards by it)
	seq          uint32        // per-run event sequence, guarded by mu
	lastNoticeAt atomic.Int64
	armed        atomic.Int64 // when the scheduler will next look at this run; 0 = not armed
	warned       atomic.Bool  // the budget warning is out (at most one per run)

	ID         string
	SessionKey string
	Channel    string
	ChatRef    string
	Attempt    int // 1 for a first attempt, 2 and up for a resumed one (Spec.Attempt)
	Settings   timeout.Settings

	ctx    context.Context
	cancel context.CancelCauseFunc

	activity  atomic.Int64 // last liveness reset not due to a step (heartbeat, activity, resume shift)
	pausedAt  atomic.Int64 // 0 = not paused
	abortedAt atomic.Int64

	mu   sync.Mutex // orders event publication and guards seq and side
	side *runSide   // allocated with the run's first event (or reply chunk); nil before
}

// runSide is what a Run keeps only once it publishes, out of line so that a
// Run stays in its size class: its subscribers' state, carried on its events
// (Publish), and its streamed reply.
type runSide struct {
	locals event.Locals
	text   *replyText // nil until the first delta
	// ended: the run's terminal event (Aborted or Finished) is published;
	// Publish drops every later event but ForceFinalized.
	ended bool
	// ending: the terminal event is being passed to pub, without r.mu (in
	// cluster mode pub records the ending in the database first, retrying
	// while it does not answer); waiter, when set, is closed once it is
	// passed on (a ForceFinalized waits for it there).
	ending bool
	waiter chan struct{}
}

// sideLocked returns r's side, allocating it. Called with r.mu held.
func (r *Run) sideLocked() *runSide {
	if r.side == nil {
		r.side = new(runSide)
	}
	return r.side
}

// stopReasons are the reasons a state word can carry (index 0 = none).
var stopReasons = [...]event.StopReason{event.ReasonNone, event.ReasonStop, event.ReasonTimeout,
	event.ReasonStepTimeout, event.ReasonMaxTurnTime, event.ReasonUser, event.ReasonShutdown,
	event.ReasonInterrupted, event.ReasonSuperseded, event.ReasonError} // error last: unknown reasons map to it

// stateWord packs a terminal state and its reason; an unknown reason is
// recorded as "error".
func stateWord(s State, reason event.StopReason) uint32 {
	for i, r := range stopReasons {
		if r == reason {
			return uint32(s) | uint32(i)<<8
		}
	}
	return uint32(s) | uint32(len(stopReasons)-1)<<8
}

// StartedAt returns when the run was registered (wall clock, for display).
func (r *Run) StartedAt() time.Time { return r.reg.wall(r.start) }

// wallDeadline and ceiling are in registry time; ceiling 0 = none.
func (r *Run) wallDeadline() int64 { return r.start + int64(r.Settings.Timeout) }

func (r *Run) ceiling() int64 {
	if r.Settings.MaxTurnTime <= 0 {
		return 0
	}
	return r.start + int64(r.Settings.MaxTurnTime)
}

// Context returns the context the runner must use. It is cancelled when the
// run is aborted (context.Cause reports an *AbortError) and after release.
func (r *Run) Context() context.Context { return r.ctx }

// State reports the run's outcome state.
func (r *Run) State() State { return State(r.state.Load() & 0xff) }

// StopReason reports why the run stopped (ReasonNone while running).
func (r *Run) StopReason() event.StopReason {
	return stopReasons[r.state.Load()>>8]
}

// Now returns the registry clock: time since the registry's epoch.
func (r *Run) now() int64 { return r.reg.now() }

// StepStarted records that a step began. It allocates one small record (the
// start path is not the hot path). A progress notice for the step may be due
// before the run's armed time, so it tells the OnSooner watcher.
func (r *Run) StepStarted(kind, name string) {
	now := r.now()
	r.setCur(r.newStep(kind, name, now), 0)
	r.reg.sooner(r)
}

// StepCompleted records that the running step finished, which resets the
// liveness deadline. This is the hot path: when the runner passes the same
// name string it passed to StepStarted (the normal case) it costs one clock
// read, two atomic loads and one atomic store, all on the Run's first cache
// line; it takes no lock and allocates nothing. Otherwise the current step is
// compared by kind and name. The same step reporting again is a liveness
// reset too. A completion that matches no started step is recorded as a step
// of its own (one allocation). The fast path identifies the step by its name
// alone: a runner that reuses one name string for two kinds of step at once
// completes whichever is current.
func (r *Run) StepCompleted(kind, name string) {
	now := r.now()
	if len(name) > 0 && r.curName.Load() == unsafe.StringData(name) && r.curLen.Load() == int32(len(name)) {
		r.curDone.Store(now)
		return
	}
	if c := r.cur.Load(); c != nil && c.name == name && c.kind == kind {
		r.curDone.Store(now)
		return
	}
	r.setCur(r.newStep(kind, name, now), now)
}

// newStep returns the record of a step that starts at now, linked to the
// most recent completed step (the writer's view).
func (r *Run) newStep(kind, name string, now int64) *stepRec {
	s := &stepRec{kind: kind, name: name, seq: r.steps.Add(1), started: now}
	c, done := r.load()
	switch {
	case c == nil:
	case done != 0:
		s.prev.Store(c)
	default:
		s.prev.Store(c.prev.Load()) // a step started while another ran: the older one is superseded
	}
	return s
}

// setCur makes s the current step (done = its completion time, 0 = running).
// Called by the step writer only. The old record's completion is frozen into
// it first, so a reader holding the old record still sees it completed.
func (r *Run) setCur(s *stepRec, done int64) {
	if old := r.cur.Load(); old != nil {
		if d := r.curDone.Load(); d != 0 {
			old.done.Store(d)
		}
	}
	r.curDone.Store(done)
	r.curName.Store(unsafe.StringData(s.name))
	r.curLen.Store(int32(min(len(s.name), 1<<30)))
	r.cur.Store(s)
	// s's prev is no longer current: nothing reads two steps back, so cut
	// the link that would chain every older record to s.
	if p := s.prev.Load(); p != nil {
		p.prev.Store(nil)
	}
}

// load returns the current step record and its completion time (0 while it
// runs). Safe from any goroutine: cur is read before curDone, and setCur
// writes them in the other order, so a reader that sees the new record sees
// its fresh curDone, and a reader holding the old record falls back to the
// completion frozen into it.
func (r *Run) load() (*stepRec, int64) {
	c := r.cur.Load()
	if c == nil {
		return nil, 0
	}
	d := r.curDone.Load()
	if d == 0 {
		d = c.done.Load()
	}
	return c, d
}

// loadWithPrev is load plus, while the current step runs, the last step
// completed before it (nil if none). A record's prev is cut once the record
// is no longer current, so prev is read while c is still current: if the
// current record changed meanwhile, it loads again (the writer only moves
// forward, so this ends).
func (r *Run) loadWithPrev() (c *stepRec, done int64, prev *stepRec) {
	for {
		c, done = r.load()
		if c == nil || done != 0 {
			return c, done, nil
		}
		prev = c.prev.Load()
		if r.cur.Load() == c {
			return c, done, prev
		}
	}
}

// Activity records streamed output or other activity. It resets the liveness
// deadline only when the turn's livenessResetOn is "activity". It only moves
// deadlines later, so it needs no re-arm.
func (r *Run) Activity() {
	if r.Settings.LivenessResetOn == timeout.LivenessActivity {
		r.touchActivity(r.now())
	}
}

// Heartbeat is an explicit "still alive" from the runner: it always resets
// the liveness deadline. It only moves deadlines later, so it needs no re-arm.
func (r *Run) Heartbeat() { r.touchActivity(r.now()) }

// touchActivity moves the activity reference forward to t; it never moves it
// back (two resets racing each other keep the later one).
func (r *Run) touchActivity(t int64) {
	for {
		old := r.activity.Load()
		if t <= old || r.activity.CompareAndSwap(old, t) {
			return
		}
	}
}

// Pause stops the liveness clock (a tool waits for a human). The wall clock
// and the ceiling keep running. Pausing a paused run does nothing. It only
// moves deadlines later (no step deadline, no progress notice while paused),
// so it needs no re-arm.
func (r *Run) Pause() { r.pausedAt.CompareAndSwap(0, r.now()) }

// Resume restarts the liveness clock where Pause stopped it: the liveness
// window resumes with as much used as was used when the run paused, so the
// step deadline is the resume time plus what was left of the window. If the
// run made progress while paused (a step completed, a heartbeat), the window
// restarts in full at the resume. The liveness reference is never set in the
// future. The step deadline (and a progress notice) come back, which can be
// earlier than the run's armed time, so Resume tells the OnSooner watcher.
func (r *Run) Resume() {
	p := r.pausedAt.Load()
	if p == 0 || !r.pausedAt.CompareAndSwap(p, 0) {
		return
	}
	now := r.now()
	used := max(0, p-r.livenessRef()) // unpaused time since the last progress
	r.touchActivity(now - used)
	r.reg.sooner(r)
}

// livenessRef is the latest moment of progress: the turn's start, the last
// step completion or the last counted activity.
func (r *Run) livenessRef() int64 {
	ref := r.start
	if c, d, prev := r.loadWithPrev(); c != nil {
		if d != 0 {
			ref = max(ref, d)
		} else if prev != nil {
			ref = max(ref, prev.done.Load())
		}
	}
	return max(ref, r.activity.Load())
}

// AbortError is the cause of a run context's cancellation.
type AbortError struct {
	RunID  string
	Reason event.StopReason
}

func (e *AbortError) Error() string { return "turn " + e.RunID + " aborted: " + string(e.Reason) }

// Abort stops the run with reason. It wins only if the run is still running:
// then it cancels the run's context, tells the OnSooner watcher (the
// force-finalization after the abort grace is now due), and returns the
// Aborted event (with the facts its notice is rendered from — reason,
// elapsed, steps, the limit hit — and the partial reply) for the caller to
// publish, and true. If Finish or another Abort won first it
// changes nothing and returns false.
func (r *Run) Abort(reason event.StopReason) (event.Event, bool) {
	ev, ok := r.AbortDue(reason)
	if ok {
		r.reg.sooner(r) // the abort grace is due, maybe before the armed time
	}
	return ev, ok
}

// AbortDue is Abort for the OnSooner watcher itself, when it aborts a run it
// is looking at: it does not call the watcher back, because the watcher
// decides the run's next time (the abort grace) right after.
func (r *Run) AbortDue(reason event.StopReason) (event.Event, bool) {
	if !r.state.CompareAndSwap(uint32(StateRunning), stateWord(StateAborted, reason)) {
		return event.Event{}, false
	}
	now := r.now()
	r.abortedAt.Store(now)
	r.cancel(&AbortError{RunID: r.ID, Reason: reason})
	cur, last := r.steps2()
	ev := event.Event{
		Kind:        event.Aborted,
		StopReason:  reason,
		Elapsed:     time.Duration(now - r.start),
		Step:        cur,
		LastStep:    last,
		Limit:       r.Limit(reason),
		StepTimeout: r.Settings.StepTimeout,
		FullText:    r.Text(),
	}
	return ev, true
}

// Finish records the runner's outcome: reason is event.ReasonStop for a
// normal answer or event.ReasonError for a failure. It wins only if the run is
// still running and returns true; if an abort won first it changes nothing
// and returns false (the abort's message stands).
func (r *Run) Finish(reason event.StopReason) bool {
	if !r.state.CompareAndSwap(uint32(StateRunning), stateWord(StateFinished, reason)) {
		return false
	}
	return true
}

// MarkReturned records that the runner's Run call has returned.
func (r *Run) MarkReturned() { r.returned.Store(true) }

// Returned reports whether the runner's Run call has returned.
func (r *Run) Returned() bool { return r.returned.Load() }

// Released reports whether the run's session is free again.
func (r *Run) Released() bool { return r.released.Load() }

// Publish stamps ev with the run's identity, the next per-run sequence number,
// the time (unless set; on the registry's clock, as step start times) and the
// run's Locals, and passes it to pub. Calls are serialised per run, so pub
// sees one run's events in sequence order (and its handlers may use the
// run's Locals without a lock). A non-terminal event's pub must not block.
//
// The terminal event (Aborted or Finished) is the run's last: an event
// published after it — a delta or step of a runner that passed its
// liveness check as the turn was stopped, a late progress notice — is
// dropped, under the same lock, so no subscriber sees it; ForceFinalized,
// which follows an abort by design, is the one exception, and it waits
// until the terminal event is passed on. Publish reports whether ev was
// passed on.
//
// The terminal event's pub may block (in cluster mode it records the
// ending in the database, retrying while the database does not answer):
// it is called without the run's lock, once the run is marked ended, so a
// runner's late delta, Text and the run's other readers never wait for it
// (issue 20: a lock held across those retries stalled the runner's
// goroutine and every reader of the run's reply).
func (r *Run) Publish(pub func(event.Event), ev event.Event) bool {
	if ev.Kind.Terminal() || ev.Kind == event.ForceFinalized {
		return r.publishEnd(pub, ev)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	side := r.sideLocked()
	if side.ended {
		return false
	}
	r.stampLocked(&ev, side)
	pub(ev)
	return true
}

// publishEnd is Publish of the terminal event, passed to pub without the
// run's lock once the run is marked ended, and of ForceFinalized, which
// waits until the terminal event is passed on.
func (r *Run) publishEnd(pub func(event.Event), ev event.Event) bool {
	r.mu.Lock()
	side := r.sideLocked()
	for ev.Kind == event.ForceFinalized && side.ending {
		if side.waiter == nil {
			side.waiter = make(chan struct{})
		}
		w := side.waiter
		r.mu.Unlock()
		<-w
		r.mu.Lock()
	}
	if ev.Kind == event.ForceFinalized {
		defer r.mu.Unlock()
		r.stampLocked(&ev, side)
		pub(ev)
		return true
	}
	if side.ended {
		r.mu.Unlock()
		return false
	}
	r.stampLocked(&ev, side)
	side.ended, side.ending = true, true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		side.ending = false
		w := side.waiter
		side.waiter = nil
		r.mu.Unlock()
		if w != nil {
			close(w)
		}
	}()
	pub(ev)
	return true
}

// stampLocked gives ev the run's next sequence number, identity, Locals
// and (unless set) time. Called with r.mu held.
func (r *Run) stampLocked(ev *event.Event, side *runSide) {
	r.seq++
	ev.Seq = uint64(r.seq)
	ev.RunID, ev.SessionKey, ev.Channel, ev.ChatRef = r.ID, r.SessionKey, r.Channel, r.ChatRef
	ev.Locals = &side.locals
	if ev.Time.IsZero() {
		ev.Time = r.reg.wall(r.now()) // the registry's clock (as steps' StartedAt): one monotonic read, no wall clock read
	}
}

// CurrentStep returns the running step (zero if none) and the last completed
// step.
func (r *Run) CurrentStep() (current, last event.Step) { return r.steps2() }

func (r *Run) steps2() (current, last event.Step) {
	c, done, prev := r.loadWithPrev()
	if c == nil {
		return
	}
	if done != 0 {
		return event.Step{}, r.toStep(c)
	}
	if prev != nil {
		last = r.toStep(prev)
	}
	return r.toStep(c), last
}

func (r *Run) toStep(s *stepRec) event.Step {
	return event.Step{Kind: s.kind, Name: s.name, Seq: s.seq, StartedAt: r.reg.wall(s.started)}
}

// Limit is the limit a stop with reason enforces: the wall clock, the
// liveness window or the ceiling; 0 for the other reasons.
func (r *Run) Limit(reason event.StopReason) time.Duration {
	switch reason {
	case event.ReasonTimeout:
		return r.Settings.Timeout
	case event.ReasonStepTimeout:
		return r.Settings.StepTimeout
	case event.ReasonMaxTurnTime:
		return r.Settings.MaxTurnTime
	}
	return 0
}
