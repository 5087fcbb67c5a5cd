// A turn from registration to done: beginLocked registers it in a free
// session, startTurn/launch publish TurnStarted and start the runner,
// runTurn records the runner's outcome, and the two sides of the release
// (settle: the runner returned and the ending is recorded; released: the
// registry freed the session; ended: the terminal event is out) bring it to
// done. The named states and their legal moves are in lifecycle.go.

package gateway

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/timeout"
)

// turn is a live turn: registered by beginLocked, in Engine.turns until
// doneLocked.
type turn struct {
	run    *abort.Run
	owner  string
	runner string // the runner's name
	// resume: a resumed attempt (resume.go); its runner reads the note and,
	// with Confirm, the person is asked first. Set before the turn starts.
	resume *Resume
	// maxReply is the reply cap in characters (agents.defaults.maxReplyChars
	// when the turn started), for streamed and final text alike.
	maxReply int
	// cut is what a reply cut at maxReply ends with (messages.ReplyTruncated).
	cut string
	// msgs are the message texts when the turn started: its notices keep
	// them across a hot reload.
	msgs    *messages.Set
	started chan struct{} // closed once TurnStarted is published: before, no one may abort or publish
	// aliases are the run ids of the messages collected into this turn
	// besides its own (Engine.alias).
	aliases []string
	// inbox takes the messages steered into this turn (busy mode steer)
	// and the gateway's notes to the runner (a budget warning); a
	// NotesOnly inbox for a runner.NoteTaker that does not steer; nil when
	// the runner is neither.
	inbox *runner.Inbox
	// steered are the messages steered into this turn, oldest first (under
	// Engine.mu, like inbox.Put): the inbox's untaken texts are the last
	// of them.
	steered []QueuedMessage
	// joined are the run ids of the queued messages collected into this
	// turn besides its own (set before it starts; TurnStarted.Joined).
	joined []string
	// queuedAt is when its message was queued (zero: it started at once);
	// TurnStarted.Queued is the wait.
	queuedAt time.Time
	// done is closed once the outcome is known, the terminal event is out
	// to every subscriber and the session is free (both flags below, under
	// Engine.mu): whoever Wait wakes may send the session's next message at
	// once. The turn then leaves Engine.turns.
	done  chan struct{}
	ended bool // the terminal event is published
	freed bool // the run is released: the session is free
	out   Outcome
	// lost: the cluster refused the turn's ending (the replica lost its
	// lease), or it never started (forgetUnstarted): out is not its
	// outcome, and Wait does not answer it.
	lost bool
	// state is the turn's turnState (lifecycle.go), moved by Engine.move.
	state atomic.Uint32
	// fences is Engine.fences when the turn was registered: a queued turn
	// whose claim fails after a fence is dropped without a word.
	fences uint64
	// life: 0 while the runner runs; 1 once it returned; 2 when the run
	// was force-finalized first (then it counts in Engine.stuck until the
	// runner returns).
	life atomic.Int32
	// pending counts what must happen before the session is free: the
	// runner returns, and the terminal event is recorded. The side that
	// brings it to 0 releases the run (see settle).
	pending atomic.Int32
	// claimed: the cluster holds this turn's claim (cluster mode), so its
	// ending is recorded through Cluster.Finish before it is published.
	claimed atomic.Bool
	// sessionID is the id of the conversation the turn belongs to (its
	// session's when it started): after a Reset (/new) its ending is no
	// longer written to the session's history.
	sessionID string
	// clock stops and restarts the run's liveness clock for the runner's
	// pauses and the open questions (lifecycle.go).
	clock *livenessClock
}

// beginLocked registers the turn of req in the free session s and makes it
// the session's active turn; the returned function starts it (TurnStarted,
// scheduler, runner) and must be called once e.mu is released — right away,
// or by the publisher of the session's previous ending (s.deferred). Called
// with e.mu held. start is when the turn started in registry time (its
// claim's start, claimBeginLocked), 0 for now. Errors: ErrNoRunner,
// *RunnerStuckError, a wrapped abort.ErrDuplicate.
func (e *Engine) beginLocked(cfg *config.Config, s *session, req SendRequest, start time.Duration) (func(), error) {
	name := cfg.RunnerFor(req.Channel)
	rn, ok := e.runners[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q (channel %s)", ErrNoRunner, name, req.Channel)
	}
	if n, limit := e.stuck[name], e.stuckLimit; limit > 0 && n >= limit {
		return nil, &RunnerStuckError{Runner: name, Stuck: n, Limit: limit}
	}
	run, err := e.reg.Register(e.baseCtx, abort.Spec{
		RunID: req.RunID, SessionKey: req.SessionKey, Channel: req.Channel, ChatRef: req.ChatRef,
		Settings: cfg.TurnSettings(req.Channel, req.Timeout), Attempt: req.Resume.attempt(), Start: start,
	})
	if err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	history := append([]runner.Message(nil), toRunnerHistory(s.history)...)
	s.active = run
	e.appendHistoryLocked(s, Message{RunID: run.ID, Role: "user", Text: req.Text, Time: run.StartedAt()}, cfg.Server.HistoryLimit)
	s.updated = run.StartedAt()
	e.touchLocked(s, time.Now())
	t := &turn{run: run, owner: req.Owner, runner: name, started: make(chan struct{}), done: make(chan struct{}),
		maxReply: cfg.Agents.Defaults.MaxReplyChars, cut: replyCut(cfg.Agents.Defaults.MaxReplyChars), msgs: cfg.MessageSet(), clock: &livenessClock{run: run}, sessionID: s.id, fences: e.fences}
	if st, ok := rn.(runner.Steerer); ok && st.Steers() {
		t.inbox = &runner.Inbox{}
	} else if nt, ok := rn.(runner.NoteTaker); ok && nt.TakesNotes() {
		t.inbox = runner.NotesOnly() // the gateway's notes (a budget warning), no messages
	}
	t.pending.Store(2)
	e.turns[req.RunID] = t
	rt := runner.Turn{RunID: req.RunID, SessionKey: req.SessionKey, SessionID: s.id, Channel: req.Channel,
		Message: req.Text, History: history, Inbox: t.inbox, Approver: &approver{e: e, t: t}}
	t.resume = req.Resume
	return func() { e.startTurn(rn, t, rt) }, nil
}

// startTurn publishes a registered turn's TurnStarted, hands the run to the
// scheduler and starts the runner.
//
// Lock contract: called without e.mu (it is the function beginLocked
// returns, run by Send, the pump's caller or the previous ending's
// publisher), once per turn.
func (e *Engine) startTurn(rn runner.Runner, t *turn, rt runner.Turn) {
	if e.cluster != nil && !t.claimed.Load() {
		// A queued message's turn: claimed in the cluster first, off the
		// caller's goroutine (a publisher's or the scheduler's).
		go e.claimQueued(rn, t, rt)
		return
	}
	e.launch(rn, t, rt)
}

// launch is startTurn once the turn may start.
//
// Lock contract: called without e.mu, once per turn.
func (e *Engine) launch(rn runner.Runner, t *turn, rt runner.Turn) {
	run := t.run
	started := event.Event{Kind: event.TurnStarted, Text: rt.Message, StepTimeout: run.Settings.StepTimeout}
	started.Deadline, started.Ceiling = turnLimits(run.Settings, run.StartedAt())
	started.Joined = t.joined // the store forgets these queued rows with the turn's own
	started.Runner = t.runner
	started.Sender = t.owner
	if !t.queuedAt.IsZero() {
		started.Queued = max(0, time.Since(t.queuedAt))
	}
	// Nothing else may publish for this run before TurnStarted: Abort and
	// Shutdown wait for t.started, and the scheduler and the runner only
	// learn of the run below.
	e.move(t, turnRunning)
	run.Publish(e.publish, started)
	close(t.started)
	e.sched.Track(run)
	rn, rt = resumed(rn, rt, t.resume) // after TurnStarted: the history keeps the person's words
	go e.runTurn(rn, t, rt)
}

// turnLimits are the deadline and ceiling (zero: none) of a turn with
// settings st that started at start: its TurnStarted's, and its claim's.
func turnLimits(st timeout.Settings, start time.Time) (deadline, ceiling time.Time) {
	deadline = start.Add(st.Timeout)
	if st.MaxTurnTime > 0 {
		ceiling = start.Add(st.MaxTurnTime)
	}
	return deadline, ceiling
}

// runTurn runs the runner and records its outcome. A panicking runner is an
// error, not a crash.
//
// Lock contract: called without e.mu, on the turn's own goroutine; it
// takes e.mu only inside the functions it calls.
func (e *Engine) runTurn(rn runner.Runner, tr *turn, t runner.Turn) {
	run := tr.run
	var (
		res      runner.Result
		err      error
		panicked any
		stack    []byte
	)
	func() {
		defer func() {
			if p := recover(); p != nil {
				panicked, stack = p, debug.Stack()
				err = errors.New("runner panicked")
			}
		}()
		res, err = rn.Run(run.Context(), t, &callbacks{e: e, run: run, clock: tr.clock, maxReply: tr.maxReply, cut: tr.cut})
	}()
	run.MarkReturned()
	// Steered messages the runner never took run next, before the queue.
	e.requeueSteered(tr)
	if !tr.life.CompareAndSwap(0, 1) {
		e.stuckChanged(tr.runner, -1) // force-finalized earlier: no longer stuck
	}
	// The runner's side of the release; the terminal event's side follows
	// (Finished below, or an Aborted that was or will be published).
	e.settle(tr)
	text := abort.CapReply(res.Text, tr.maxReply, tr.cut) // agents.defaults.maxReplyChars, with a marker
	if text == "" {
		text = run.Text()
	}
	switch {
	case err == nil:
		if run.Finish(event.ReasonStop) {
			run.Publish(e.publish, event.Event{Kind: event.Finished, StopReason: event.ReasonStop, FullText: text})
		}
	default:
		if run.Finish(event.ReasonError) {
			cur, last := run.CurrentStep()
			ev := event.Event{Kind: event.Finished, StopReason: event.ReasonError, FullText: text,
				Elapsed: time.Since(run.StartedAt()), Step: cur, LastStep: last}
			ev.Message, ev.ErrorID = e.failure(tr, err, panicked, stack)
			run.Publish(e.publish, ev)
		}
	}
}

// settle marks one of the two conditions of a run's release as met (the
// runner returned; the terminal event is recorded) and releases the run when
// both are: the session becomes free only after its turn's ending is in the
// history and the outcome cache, so the next user message always comes after
// it. (A runner that never returns is released by force-finalization.)
//
// Lock contract: called without e.mu (Release calls released, which
// takes it).
func (e *Engine) settle(t *turn) {
	if t != nil && t.pending.Add(-1) == 0 {
		e.reg.Release(t.run)
	}
}

// released is the registry's hook: the run's session is free.
//
// Lock contract: called without e.mu (by the registry, once per run); it
// takes e.mu once and runs what the pump and the stuck count return after
// releasing it.
func (e *Engine) released(run *abort.Run) {
	e.sched.Remove(run)
	notify := func() {}
	defer func() { notify() }() // after e.mu is unlocked
	e.mu.Lock()
	forced := false
	if t, ok := e.turns[run.ID]; ok && t.run == run && t.life.CompareAndSwap(0, 2) {
		// Force-finalized: its runner has not returned. Counted under the
		// same lock as the swap, so the runner's return (which finds the
		// swap done and subtracts under e.mu) always comes after.
		notify = e.stuckChangedLocked(t.runner, +1)
		forced = true
		e.move(t, turnForced)
	}
	start := func() {}
	defer func() { start() }() // after e.mu is unlocked, before notify
	if s, ok := e.sessions[run.SessionKey]; ok && s.active == run {
		s.active = nil
		e.touchLocked(s, time.Now()) // idle from now on
		if forced {
			// Its ForceFinalized event follows this hook: the queue waits
			// for it like for an ending (publish calls ended).
			s.ending++
			e.heldForFinalize[run.ID] = s
		} else {
			start = e.pumpLocked(s) // waits for an ending on its way (ended pumps)
		}
	}
	// The turn is done when both the session is free and its terminal event
	// is published; an abort cancels the runner before its event is
	// published, so either may come first.
	if t, ok := e.turns[run.ID]; ok && t.run == run {
		t.freed = true
		e.doneLocked(t)
	}
	e.mu.Unlock()
}

// doneLocked closes t.done and forgets t once its terminal event is
// published and its session is free (each happens once, so this closes
// once). Called with e.mu held.
func (e *Engine) doneLocked(t *turn) {
	if !t.ended || !t.freed {
		return
	}
	e.move(t, turnDone)
	close(t.done)
	if e.turns[t.run.ID] == t {
		delete(e.turns, t.run.ID)
	}
	if len(e.turns) == 0 && e.drained != nil {
		close(e.drained)
		e.drained = nil
	}
}

// ended is called once the terminal event of turn t (nil: not live) of
// session s (nil: not in memory) is out to every subscriber: the turns Send
// accepted meanwhile start now, and t is done if its session is free.
//
// Lock contract: called without e.mu (by publish, once per ending whose
// recordOutcome raised s.ending); it takes e.mu once and starts the
// deferred turns after releasing it.
func (e *Engine) ended(t *turn, s *session) {
	e.mu.Lock()
	if t != nil {
		t.ended = true
		e.doneLocked(t)
	}
	var starts []func()
	if s != nil {
		s.ending--
		if s.ending == 0 {
			starts, s.deferred = s.deferred, nil
			// The session may be free with messages waiting (its turn was
			// released while this ending was on its way): the next one starts.
			starts = append(starts, e.pumpLocked(s))
		}
	}
	e.mu.Unlock()
	for _, start := range starts {
		start()
	}
}

// replyCut is what a reply cut at maxReply characters (≤ 0: the registry's
// default cap) ends with.
func replyCut(maxReply int) string {
	if maxReply <= 0 {
		maxReply = abort.DefaultMaxReplyChars
	}
	return messages.ReplyTruncated(maxReply)
}
