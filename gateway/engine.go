// Package gateway owns the turn engine: sessions (at most one active turn
// each), the start of turns on runners, idempotency of run ids, the
// methods channels call (Send, Abort, Wait, History) and the one event bus
// every turn transition is published on.
//
// Data flows one way: a channel calls Send; the engine registers the turn in
// the abort registry, hands it to the maintenance scheduler and starts the
// runner; the runner's callbacks and the scheduler publish events on the bus;
// channels subscribe and turn events into messages. The engine never sends a
// message itself.
package gateway

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/gateway/event"
	"github.com/turnguard/turnguard/gateway/maintenance"
	"github.com/turnguard/turnguard/runner"
)

// Errors callers branch on.
var (
	ErrBusy         = errors.New("session busy")
	ErrEmpty        = errors.New("empty message")
	ErrTooLong      = errors.New("message too long")
	ErrNoRunner     = errors.New("no such runner")
	ErrNotOwner     = errors.New("not allowed to abort this run")
	ErrWrongSession = errors.New("runId does not match sessionKey")
	ErrShutdown     = errors.New("gateway is shutting down")
)

// BusyError is returned by Send when the session already has an active turn.
type BusyError struct {
	SessionKey string
	RunID      string // the active run
	Stopping   bool   // the active run was aborted and is being stopped
}

func (e *BusyError) Error() string {
	if e.Stopping {
		return fmt.Sprintf("session %s busy: still stopping run %s", e.SessionKey, e.RunID)
	}
	return fmt.Sprintf("session %s busy with run %s", e.SessionKey, e.RunID)
}
func (e *BusyError) Unwrap() error { return ErrBusy }

// UserText is what a channel shows a person for a busy session.
func (e *BusyError) UserText() string {
	if e.Stopping {
		return "⏳ Still stopping your previous request — try again in a few seconds."
	}
	return "⏳ I'm still working on your previous message — send /stop to cancel it, or wait for the answer."
}

// Status is the state of a run as Send and Wait report it.
type Status string

// The statuses. Started and InFlight mean "watch the events"; the others are
// terminal.
const (
	StatusStarted  Status = "started"
	StatusInFlight Status = "in_flight"
	StatusOK       Status = "ok"
	StatusAborted  Status = "aborted" // stopped: by a deadline (StopReason says which), the user or shutdown
	StatusError    Status = "error"
)

// Outcome is how a run ended.
type Outcome struct {
	RunID      string           `json:"runId"`
	SessionKey string           `json:"sessionKey"`
	Status     Status           `json:"status"`
	StopReason event.StopReason `json:"stopReason"`
	Text       string           `json:"text"`              // the reply (partial when aborted)
	Message    string           `json:"message,omitempty"` // the user-facing notice for aborts and errors
	StartedAt  time.Time        `json:"startedAt"`
	EndedAt    time.Time        `json:"endedAt"`
}

// Message is one message of a session's history.
type Message struct {
	Role       string           `json:"role"` // user | assistant
	Text       string           `json:"text"`
	StopReason event.StopReason `json:"stopReason,omitempty"`
	Time       time.Time        `json:"time"`
}

// HistoryLoader loads a session's stored history (oldest first) the first
// time the engine touches the session. Optional.
type HistoryLoader func(ctx context.Context, sessionKey string, limit int) ([]Message, error)

// Options configure an Engine.
type Options struct {
	Config   *config.Source           // required
	Runners  map[string]runner.Runner // by name: demo, openai, exec
	Log      *slog.Logger
	History  HistoryLoader
	Observer maintenance.Observer
}

// Engine runs turns. Create with New, then Start. Methods are safe for
// concurrent use.
type Engine struct {
	cfg      *config.Source
	runners  map[string]runner.Runner
	log      *slog.Logger
	loadHist HistoryLoader

	reg   *abort.Registry
	sched *maintenance.Scheduler
	bus   *event.Bus

	baseCtx context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu       sync.Mutex
	sessions map[string]*session
	turns    map[string]*turn // live runs by id
	outcomes map[string]*list.Element
	expiry   *list.List // of *cached, oldest first
	closing  bool
	drained  chan struct{} // closed when turns becomes empty; nil until asked for
}

type session struct {
	key     string
	id      string // a stable id for this conversation (changes on Reset)
	active  *abort.Run
	history []Message
	loaded  bool
	updated time.Time
}

type turn struct {
	run   *abort.Run
	owner string
	done  chan struct{} // closed when the outcome is known
	out   Outcome
}

type cached struct {
	out     Outcome
	expires time.Time
}

// New builds an engine. It does not start anything.
func New(opts Options) (*Engine, error) {
	if opts.Config == nil || opts.Config.Current() == nil {
		return nil, errors.New("gateway: no config")
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	e := &Engine{
		cfg: opts.Config, runners: opts.Runners, log: opts.Log, loadHist: opts.History,
		bus: event.NewBus(), sessions: map[string]*session{}, turns: map[string]*turn{},
		outcomes: map[string]*list.Element{}, expiry: list.New(),
	}
	e.reg = abort.New(e.released)
	e.sched = maintenance.New(e.reg, e.publish, opts.Observer)
	e.applyPolicy(opts.Config.Current())
	return e, nil
}

// Start starts the scheduler. Runs derive their contexts from ctx, which
// must live as long as the engine. Call once.
func (e *Engine) Start(ctx context.Context) {
	e.baseCtx, e.cancel = context.WithCancel(context.WithoutCancel(ctx))
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.sched.Run(e.baseCtx)
	}()
}

// ConfigChanged applies a new configuration: the killswitches at once,
// everything else to turns that start afterwards (they read the config at
// start).
func (e *Engine) ConfigChanged(c *config.Config) { e.applyPolicy(c) }

func (e *Engine) applyPolicy(c *config.Config) {
	e.sched.SetPolicy(maintenance.Policy{Enabled: c.Watchdog.Enabled, AutoAbort: c.Watchdog.AutoAbort})
}

// Bus returns the event bus. Subscribers see every event of every turn.
func (e *Engine) Bus() *event.Bus { return e.bus }

// Registry returns the abort registry (read-only use: snapshots).
func (e *Engine) Registry() *abort.Registry { return e.reg }

// Scheduler returns the deadline scheduler (for diagnostics).
func (e *Engine) Scheduler() *maintenance.Scheduler { return e.sched }

// SendRequest is a user message to start a turn.
type SendRequest struct {
	SessionKey string
	Channel    string // "ws", "telegram", …: picks timeouts and runner overrides
	ChatRef    string // the channel's reference for replies
	RunID      string // the idempotency key; generated when empty
	Text       string
	Timeout    time.Duration // per-request wall clock (0 = configured)
	Owner      string        // who may abort besides an operator ("" = anyone)
}

// Ack answers Send.
type Ack struct {
	RunID   string
	Status  Status
	Outcome *Outcome // for a repeated key whose run already ended
}

// Send starts a turn. The same RunID while it runs answers StatusInFlight;
// after it ended (for idempotencyTTLSeconds) the cached outcome. A session
// with an active turn answers *BusyError. Send returns as soon as the turn
// is registered; the reply comes as events.
func (e *Engine) Send(ctx context.Context, req SendRequest) (Ack, error) {
	cfg := e.cfg.Current()
	if req.RunID == "" {
		req.RunID = uuid.NewString()
	}
	e.mu.Lock()
	e.purgeExpired(time.Now())
	if el, ok := e.outcomes[req.RunID]; ok {
		out := el.Value.(*cached).out
		e.mu.Unlock()
		if out.SessionKey != req.SessionKey {
			return Ack{}, fmt.Errorf("run %s: %w", req.RunID, ErrWrongSession)
		}
		return Ack{RunID: req.RunID, Status: out.Status, Outcome: &out}, nil
	}
	if t, ok := e.turns[req.RunID]; ok {
		e.mu.Unlock()
		if t.run.SessionKey != req.SessionKey {
			return Ack{}, fmt.Errorf("run %s: %w", req.RunID, ErrWrongSession)
		}
		return Ack{RunID: req.RunID, Status: StatusInFlight}, nil
	}
	e.mu.Unlock()

	if len(req.Text) == 0 || !hasNonSpace(req.Text) {
		return Ack{}, ErrEmpty
	}
	if max := cfg.Server.MaxMessageChars; max > 0 && utf8.RuneCountInString(req.Text) > max {
		return Ack{}, fmt.Errorf("%w: %d characters, the limit is %d", ErrTooLong, utf8.RuneCountInString(req.Text), max)
	}
	name := cfg.RunnerFor(req.Channel)
	rn, ok := e.runners[name]
	if !ok {
		return Ack{}, fmt.Errorf("%w: %q (channel %s)", ErrNoRunner, name, req.Channel)
	}
	s := e.session(ctx, req.SessionKey)

	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return Ack{}, ErrShutdown
	}
	if s.active != nil {
		a := s.active
		e.mu.Unlock()
		return Ack{}, &BusyError{SessionKey: req.SessionKey, RunID: a.ID, Stopping: a.State() != abort.StateRunning}
	}
	run, err := e.reg.Register(e.baseCtx, abort.Spec{
		RunID: req.RunID, SessionKey: req.SessionKey, Channel: req.Channel, ChatRef: req.ChatRef,
		Settings: cfg.TurnSettings(req.Channel, req.Timeout), Messages: cfg.MessageSet(),
		MaxReplyChars: cfg.Agents.Defaults.MaxReplyChars,
	})
	if err != nil {
		e.mu.Unlock()
		if errors.Is(err, abort.ErrDuplicate) {
			return Ack{RunID: req.RunID, Status: StatusInFlight}, nil
		}
		return Ack{}, fmt.Errorf("send: %w", err)
	}
	history := append([]runner.Message(nil), toRunnerHistory(s.history)...)
	s.active = run
	s.history = appendBounded(s.history, Message{Role: "user", Text: req.Text, Time: run.StartedAt()}, cfg.Server.HistoryLimit)
	s.updated = run.StartedAt()
	t := &turn{run: run, owner: req.Owner, done: make(chan struct{})}
	e.turns[req.RunID] = t
	e.wg.Add(1)
	e.mu.Unlock()

	started := event.Event{Kind: event.TurnStarted, Text: req.Text, StepTimeout: run.Settings.StepTimeout,
		Deadline: run.StartedAt().Add(run.Settings.Timeout)}
	if run.Settings.MaxTurnTime > 0 {
		started.Ceiling = run.StartedAt().Add(run.Settings.MaxTurnTime)
	}
	run.Publish(e.publish, started)
	e.sched.Track(run)
	go e.runTurn(rn, run, runner.Turn{
		RunID: req.RunID, SessionKey: req.SessionKey, Channel: req.Channel, Message: req.Text, History: history,
	})
	return Ack{RunID: req.RunID, Status: StatusStarted}, nil
}

// runTurn runs the runner and records its outcome. A panicking runner is an
// error, not a crash.
func (e *Engine) runTurn(rn runner.Runner, run *abort.Run, t runner.Turn) {
	defer e.wg.Done()
	var (
		res runner.Result
		err error
	)
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("runner panicked: %v", p)
				e.log.Error("runner panicked", "run", run.ID, "panic", p)
			}
		}()
		res, err = rn.Run(run.Context(), t, &callbacks{e: e, run: run})
	}()
	run.MarkReturned()
	text := run.CapReply(res.Text) // agents.defaults.maxReplyChars, with a marker
	if text == "" {
		text = run.Text()
	}
	switch {
	case err == nil:
		if run.Finish(event.ReasonStop) {
			run.Publish(e.finish(run), event.Event{Kind: event.Finished, StopReason: event.ReasonStop, FullText: text})
		}
	default:
		if run.Finish(event.ReasonError) {
			msg := userErrorText(run, err)
			e.log.Warn("turn failed", "run", run.ID, "session", run.SessionKey, "err", err)
			run.Publish(e.finish(run), event.Event{Kind: event.Finished, StopReason: event.ReasonError, FullText: text, Message: msg})
		}
	}
	e.reg.Release(run)
}

// finish publishes a Finished event so that, by the time any subscriber sees
// it, the outcome is recorded and the session is free: a client that answers
// a final reply at once is never told the session is busy.
func (e *Engine) finish(run *abort.Run) func(event.Event) {
	return func(ev event.Event) {
		e.recordOutcome(ev)
		e.reg.Release(run)
		e.bus.Publish(ev)
	}
}

func userErrorText(run *abort.Run, err error) string {
	if u, ok := runner.AsUserError(err); ok {
		return u.Message
	}
	return run.RenderError(err)
}

// released is the registry's hook: the run's session is free.
func (e *Engine) released(run *abort.Run) {
	e.sched.Remove(run)
	e.mu.Lock()
	if s, ok := e.sessions[run.SessionKey]; ok && s.active == run {
		s.active = nil
	}
	// The turn entry goes when both the session is free and the outcome is
	// known; an abort cancels the runner before its event is published, so
	// either may come first.
	if t, ok := e.turns[run.ID]; ok && t.run == run && isClosed(t.done) {
		e.forgetLocked(run.ID)
	}
	e.mu.Unlock()
}

// forgetLocked removes a finished, released turn. Called with e.mu held.
func (e *Engine) forgetLocked(runID string) {
	delete(e.turns, runID)
	if len(e.turns) == 0 && e.drained != nil {
		close(e.drained)
		e.drained = nil
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// drainedLocked returns a channel closed when no turn is live. Called with
// e.mu held.
func (e *Engine) drainedLocked() <-chan struct{} {
	if len(e.turns) == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	if e.drained == nil {
		e.drained = make(chan struct{})
	}
	return e.drained
}

// publish is the single exit of events: it records terminal outcomes and
// history, then hands the event to the bus. Called under the run's publish
// lock (abort.Run.Publish), so one run's events arrive in order.
func (e *Engine) publish(ev event.Event) {
	if ev.Kind.Terminal() {
		e.recordOutcome(ev)
	}
	e.bus.Publish(ev)
}

func (e *Engine) recordOutcome(ev event.Event) {
	cfg := e.cfg.Current()
	out := Outcome{RunID: ev.RunID, SessionKey: ev.SessionKey, StopReason: ev.StopReason, Text: ev.FullText,
		Message: ev.Message, EndedAt: ev.Time}
	var msgs []Message
	switch {
	case ev.Kind == event.Aborted:
		out.Status = StatusAborted
		if ev.FullText != "" {
			msgs = append(msgs, Message{Role: "assistant", Text: ev.FullText, StopReason: ev.StopReason, Time: ev.Time})
		}
		msgs = append(msgs, Message{Role: "assistant", Text: ev.Message, StopReason: ev.StopReason, Time: ev.Time})
	case ev.StopReason == event.ReasonError:
		out.Status = StatusError
		msgs = append(msgs, Message{Role: "assistant", Text: ev.Message, StopReason: ev.StopReason, Time: ev.Time})
	default:
		out.Status = StatusOK
		msgs = append(msgs, Message{Role: "assistant", Text: ev.FullText, StopReason: ev.StopReason, Time: ev.Time})
	}
	ttl := time.Duration(cfg.Server.IdempotencyTTLSeconds * float64(time.Second))
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.sessions[ev.SessionKey]; ok {
		for _, m := range msgs {
			s.history = appendBounded(s.history, m, cfg.Server.HistoryLimit)
		}
		s.updated = ev.Time
	}
	if t, ok := e.turns[ev.RunID]; ok {
		out.StartedAt = t.run.StartedAt()
		t.out = out
		close(t.done)
		if t.run.Released() {
			e.forgetLocked(ev.RunID)
		}
	}
	e.purgeExpired(ev.Time)
	e.outcomes[ev.RunID] = e.expiry.PushBack(&cached{out: out, expires: ev.Time.Add(ttl)})
}

func (e *Engine) purgeExpired(now time.Time) {
	for el := e.expiry.Front(); el != nil; el = e.expiry.Front() {
		c := el.Value.(*cached)
		if c.expires.After(now) {
			return
		}
		e.expiry.Remove(el)
		if e.outcomes[c.out.RunID] == el {
			delete(e.outcomes, c.out.RunID)
		}
	}
}

// AbortResult reports what Abort stopped.
type AbortResult struct {
	Aborted bool
	RunIDs  []string
}

// Abort stops a run of sessionKey with reason: runID, or the session's
// active run when runID is "". Only the run's owner or an operator may abort
// it (ErrNotOwner); a runID of another session is ErrWrongSession. An unknown
// or finished run is not an error: Aborted is false. The Aborted event is
// published before Abort returns.
func (e *Engine) Abort(ctx context.Context, sessionKey, runID string, reason event.StopReason, requester string, operator bool) (AbortResult, error) {
	e.mu.Lock()
	var t *turn
	if runID != "" {
		t = e.turns[runID]
		if t == nil {
			if el, ok := e.outcomes[runID]; ok && el.Value.(*cached).out.SessionKey != sessionKey {
				e.mu.Unlock()
				return AbortResult{}, ErrWrongSession
			}
		}
	} else if s, ok := e.sessions[sessionKey]; ok && s.active != nil {
		t = e.turns[s.active.ID]
	}
	e.mu.Unlock()
	if t == nil {
		return AbortResult{RunIDs: []string{}}, nil
	}
	if t.run.SessionKey != sessionKey {
		return AbortResult{}, ErrWrongSession
	}
	if !operator && t.owner != "" && t.owner != requester {
		return AbortResult{}, ErrNotOwner
	}
	ev, ok := t.run.Abort(reason)
	if !ok {
		return AbortResult{RunIDs: []string{}}, nil
	}
	t.run.Publish(e.publish, ev)
	e.sched.Touch(t.run)
	return AbortResult{Aborted: true, RunIDs: []string{t.run.ID}}, nil
}

// Wait blocks until run runID has an outcome or ctx is done. ok is false for
// an unknown run (or one whose outcome has expired) and when ctx ends first.
func (e *Engine) Wait(ctx context.Context, runID string) (Outcome, bool) {
	e.mu.Lock()
	e.purgeExpired(time.Now())
	if el, ok := e.outcomes[runID]; ok {
		out := el.Value.(*cached).out
		e.mu.Unlock()
		return out, true
	}
	t, ok := e.turns[runID]
	e.mu.Unlock()
	if !ok {
		return Outcome{}, false
	}
	select {
	case <-t.done:
		e.mu.Lock()
		defer e.mu.Unlock()
		return t.out, true
	case <-ctx.Done():
		return Outcome{}, false
	}
}

// Active returns the session's active run, if any.
func (e *Engine) Active(sessionKey string) (*abort.Run, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.sessions[sessionKey]; ok && s.active != nil {
		return s.active, true
	}
	return nil, false
}

// History returns up to limit most recent messages of the session, oldest
// first, and the session's id.
func (e *Engine) History(ctx context.Context, sessionKey string, limit int) (sessionID string, msgs []Message) {
	s := e.session(ctx, sessionKey)
	e.mu.Lock()
	defer e.mu.Unlock()
	h := s.history
	if limit > 0 && len(h) > limit {
		h = h[len(h)-limit:]
	}
	return s.id, append([]Message(nil), h...)
}

// SessionInfo describes a session.
type SessionInfo struct {
	Key       string    `json:"key"`
	ID        string    `json:"sessionId"`
	Updated   time.Time `json:"updatedAt"`
	Messages  int       `json:"messages"`
	ActiveRun string    `json:"activeRun,omitempty"`
}

// Sessions lists the sessions the engine knows, most recently updated first.
func (e *Engine) Sessions() []SessionInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]SessionInfo, 0, len(e.sessions))
	for _, s := range e.sessions {
		si := SessionInfo{Key: s.key, ID: s.id, Updated: s.updated, Messages: len(s.history)}
		if s.active != nil {
			si.ActiveRun = s.active.ID
		}
		out = append(out, si)
	}
	sortSessions(out)
	return out
}

// Reset starts a fresh conversation in sessionKey: the history is cleared
// (in memory, and in the store through a SessionReset event) and the session
// id changes. A running turn is not affected.
func (e *Engine) Reset(sessionKey string) SessionInfo {
	e.mu.Lock()
	s, ok := e.sessions[sessionKey]
	if !ok {
		s = &session{key: sessionKey, loaded: true}
		e.sessions[sessionKey] = s
	}
	s.id = uuid.NewString()
	s.history = nil
	s.loaded = true
	s.updated = time.Now()
	info := SessionInfo{Key: s.key, ID: s.id, Updated: s.updated}
	e.mu.Unlock()
	// Published (outside the lock: handlers may call the engine) so the store
	// forgets the history too, across restarts.
	e.bus.Publish(event.Event{Kind: event.SessionReset, SessionKey: sessionKey, Time: info.Updated})
	return info
}

// session returns the session for key, creating it and loading its stored
// history on first use.
func (e *Engine) session(ctx context.Context, key string) *session {
	e.mu.Lock()
	s, ok := e.sessions[key]
	if !ok {
		s = &session{key: key, id: uuid.NewString(), updated: time.Now()}
		e.sessions[key] = s
	}
	need := !s.loaded
	s.loaded = true
	e.mu.Unlock()
	if need && e.loadHist != nil {
		limit := e.cfg.Current().Server.HistoryLimit
		h, err := e.loadHist(ctx, key, limit)
		if err != nil {
			e.log.Warn("loading history failed", "session", key, "err", err)
		} else if len(h) > 0 {
			e.mu.Lock()
			s.history = append(h, s.history...)
			if limit > 0 && len(s.history) > limit {
				s.history = s.history[len(s.history)-limit:]
			}
			e.mu.Unlock()
		}
	}
	return s
}

// Shutdown stops the engine: new turns are refused, every running turn is
// aborted with reason shutdown (its users get the shutdown message), and
// Shutdown waits until every run is released, at most the longest abort
// grace (or until ctx ends); runs still held then are force-finalized.
func (e *Engine) Shutdown(ctx context.Context) {
	e.mu.Lock()
	e.closing = true
	e.mu.Unlock()
	var grace time.Duration
	for _, r := range e.reg.Runs() {
		grace = max(grace, r.Settings.AbortGrace)
		if ev, ok := r.Abort(event.ReasonShutdown); ok {
			r.Publish(e.publish, ev)
		}
	}
	e.mu.Lock()
	drained := e.drainedLocked()
	e.mu.Unlock()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-drained:
	case <-timer.C:
	case <-ctx.Done():
	}
	for _, r := range e.reg.Runs() {
		cur, last := r.CurrentStep()
		if e.reg.Release(r) {
			r.Publish(e.publish, event.Event{Kind: event.ForceFinalized, StopReason: r.StopReason(), Step: cur, LastStep: last})
		}
	}
	if e.cancel != nil {
		e.cancel()
	}
}

// Live returns snapshots of the live turns.
func (e *Engine) Live() []abort.Snapshot {
	runs := e.reg.Runs()
	out := make([]abort.Snapshot, 0, len(runs))
	for _, r := range runs {
		out = append(out, r.Snapshot())
	}
	sortSnapshots(out)
	return out
}
