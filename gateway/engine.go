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
//
// The files, one concern each:
//
//	engine.go      the router: Engine, New, Send
//	idempotency.go the idempotency cache: a repeated run id's answer, Wait
//	errors.go      the public error types (their UserText from messages/)
//	sessions.go    the session cache: eviction, history load, Reset, History
//	turn.go        a turn's registration, start, run and release
//	lifecycle.go   the turn's named states and legal moves, the liveness clock
//	publish.go     the single exit of events, outcome recording, failures
//	stop.go        Abort and Stop
//	shutdown.go    Shutdown, the drain it waits for, Live
//	stuck.go       force-finalized runs whose runner still runs
//	busy.go        busy modes and the session's queue
//	queuestore.go  queue persistence (QueueStore, RestoreQueued)
//	status.go      the session status snapshot (Status, StatusOf)
//	approvals.go   questions to the person and their answers
//	callbacks.go   the runner's callbacks
//	cluster.go, clustered.go  the Cluster interface and the engine's cluster paths
package gateway

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/gateway/errlog"
	"github.com/turnguard/turnguard/gateway/maintenance"
	"github.com/turnguard/turnguard/runner"
)

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
	// RunID is the turn the message belongs to (its user message, its
	// ending); "" for one whose store did not keep it.
	RunID      string           `json:"runId,omitempty"`
	Role       string           `json:"role"` // user | assistant
	Text       string           `json:"text"`
	StopReason event.StopReason `json:"stopReason,omitempty"`
	Time       time.Time        `json:"time"`
}

// HistoryLoader loads a session's stored history (oldest first) the first
// time the engine touches the session (again after the session was evicted
// or a load failed). It runs on the engine's context with its own timeout,
// never a request's. Optional.
type HistoryLoader func(ctx context.Context, sessionKey string, limit int) ([]Message, error)

// Options configure an Engine.
type Options struct {
	Config  *config.Source           // required
	Runners map[string]runner.Runner // by name: demo, openai, exec
	Log     *slog.Logger
	History HistoryLoader
	// HistoryCheck, optional, is used instead of History where set (a
	// cluster's shared store): see HistoryChecker.
	HistoryCheck HistoryChecker
	// TurnDetails, optional, reads finished turns' steps and settled
	// approvals (Engine.TurnDetails); nil: a history shows none.
	TurnDetails TurnDetailsLoader
	Observer    maintenance.Observer
	// StuckRuns, optional, is told when a runner's stuck runs reach
	// server.maxStuckRuns and when they drop below it (operator alerts).
	StuckRuns StuckRunsFunc
	// Admit, when set, is asked before each new turn; an error refuses it
	// with an *UnavailableError (for example while the store cannot write,
	// so a turn would leave no trace). Repeated idempotency keys are still
	// answered.
	Admit func() error
	// Queue, optional, keeps queued messages across restarts (busy modes
	// queue, collect, interrupt and steer's fallback): Send answers
	// StatusQueued only once Queue.AddQueued returned. nil: queued messages
	// live in memory only.
	Queue QueueStore
	// Settings, optional, keeps a session's own busy mode (/queue <mode>,
	// SetBusyMode) across restarts; read with the session's history.
	Settings SessionSettings
	// Cluster, when set, makes this engine one replica of several
	// (cluster.go): sessions are claimed cluster-wide, turn endings are
	// recorded through it before they are published, messages and aborts
	// for sessions another replica runs are forwarded there, and a
	// session's history is read from the store (Options.History) whenever
	// it is idle here, since its turns may run anywhere.
	Cluster Cluster
}

// Engine runs turns. Create with New, then Start. Methods are safe for
// concurrent use.
type Engine struct {
	cfg      *config.Source
	runners  map[string]runner.Runner
	log      *slog.Logger
	loadHist HistoryLoader
	// histCheck, optional (cluster mode), replaces loadHist: it loads
	// with a mark and keeps an idle session's cache when nothing changed.
	histCheck HistoryChecker
	details   TurnDetailsLoader
	onStuck   StuckRunsFunc
	admit     func() error
	qstore    QueueStore
	settings  SessionSettings
	cluster   Cluster // nil: one process

	cancelSubs cancelSubs // OnQueueCancel

	errs  *errlog.Ring
	reg   *abort.Registry
	sched *maintenance.Scheduler
	bus   *event.Bus
	// approvals are the open questions of runners to people (approvals.go).
	approvals *approvals

	baseCtx context.Context
	cancel  context.CancelFunc

	// idSpace makes session ids: a session never reset in this process has
	// the id uuid.NewSHA1(idSpace, key), the same after it is evicted and
	// reloaded; a reset session has a random one, kept for a while after
	// eviction in resetIDs.
	idSpace uuid.UUID

	// mu guards the engine's sessions, turns, queues and caches. Every
	// function has one lock contract, whatever it returns (issue 20):
	// a function whose name ends in Locked is called with mu held, runs
	// entirely under it and never releases it; what must happen after the
	// unlock (starting a turn, storing, claiming, notifying, answering
	// Send) it returns as one value — a func (pumpLocked, beginLocked,
	// requeueLocked, stuckChangedLocked) or a sendEffect (busyLocked,
	// claimEndLocked) — that the caller runs once it has released mu.
	// Every other function is called without mu and, if it needs it,
	// takes and releases it itself, in separate steps when it waits in
	// between (Send: decide, claim unlocked, decide again).
	mu       sync.Mutex
	sessions map[string]*session
	resetIDs map[string]*list.Element // by key: the ids of evicted reset sessions
	resetAge *list.List               // of resetID, oldest first; at most keptResetIDs
	lru      *list.List               // of *session, least recently used first
	turns    map[string]*turn         // live runs by id
	waiting  map[string]*queued       // queued messages by run id (each message of a collected turn too)
	// heldForFinalize: sessions freed by a force-finalization whose
	// ForceFinalized event is not out yet, by run id (their queue waits).
	heldForFinalize map[string]*session
	// stalled: idle sessions whose next queued turn waits because its
	// runner refuses new turns (stuck runs); pumped when a runner recovers.
	stalled map[*session]bool
	// alias: the run id of a message collected into another's turn → that
	// turn's run id (for Send's idempotency and Wait), until its outcome
	// expires.
	alias    map[string]string
	outcomes map[string]*list.Element
	expiry   *list.List // of *cached, oldest first
	closing  bool
	// fences counts Fenced calls (cluster mode): the leases this replica
	// lost, and everything held under them.
	fences   uint64
	stuck    map[string]int  // by runner: force-finalized runs still running
	refusing map[string]bool // by runner: at the cap (StuckRuns told saturated)
	// stuckLimit is server.maxStuckRuns as last applied (New,
	// ConfigChanged): Send's refusals and the StuckRuns notices use the same.
	stuckLimit int
	// illegalMoves counts turn state moves out of the lifecycle's order
	// (Engine.move): 0 unless there is a bug.
	illegalMoves atomic.Int64
	notifyMu     sync.Mutex    // orders StuckRuns calls; taken under mu, released after the call
	drained      chan struct{} // closed when turns becomes empty; nil until asked for
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
		cfg: opts.Config, runners: opts.Runners, log: opts.Log, loadHist: opts.History, histCheck: opts.HistoryCheck, details: opts.TurnDetails, onStuck: opts.StuckRuns,
		admit: opts.Admit, qstore: opts.Queue, settings: opts.Settings, cluster: opts.Cluster, waiting: map[string]*queued{}, heldForFinalize: map[string]*session{}, stalled: map[*session]bool{}, alias: map[string]string{}, stuck: map[string]int{}, refusing: map[string]bool{},
		stuckLimit: opts.Config.Current().Server.MaxStuckRuns,
		approvals:  newApprovals(),
		bus:        event.NewBus(), sessions: map[string]*session{}, lru: list.New(), turns: map[string]*turn{},
		outcomes: map[string]*list.Element{}, expiry: list.New(), errs: errlog.NewRing(errorRingSize),
		idSpace: uuid.New(), resetIDs: map[string]*list.Element{}, resetAge: list.New(),
	}
	e.reg = abort.New(e.released)
	e.sched = maintenance.New(e.reg, e.schedPublish, opts.Observer)
	e.applyPolicy(opts.Config.Current())
	return e, nil
}

// Start starts the scheduler. Runs derive their contexts from ctx, which
// must live as long as the engine. Call once.
func (e *Engine) Start(ctx context.Context) {
	e.baseCtx, e.cancel = context.WithCancel(context.WithoutCancel(ctx))
	go e.sched.Run(e.baseCtx)
}

// ConfigChanged applies a new configuration: the killswitches and
// server.maxStuckRuns at once (a runner the new cap saturates refuses new
// turns and StuckRuns is told; one it frees is told it recovered),
// everything else to turns that start afterwards (they read the config at
// start).
func (e *Engine) ConfigChanged(c *config.Config) {
	e.applyPolicy(c)
	e.mu.Lock()
	e.stuckLimit = c.Server.MaxStuckRuns
	// Every runner that has stuck runs or was refusing: the edge may have
	// moved under them.
	names := slices.Sorted(maps.Keys(e.refusing))
	for name := range e.stuck {
		if !e.refusing[name] {
			names = append(names, name)
		}
	}
	var notices []stuckNotice
	for _, name := range names {
		if n, ok := e.recountStuckLocked(name, 0); ok {
			notices = append(notices, n)
		}
	}
	notify := e.notifyStuckLocked(notices)
	e.mu.Unlock()
	notify()
	e.pumpStalled() // a higher cap may let waiting messages start
}

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
	// Forwarded: another replica forwarded this message here because this
	// replica runs the session's turn (Cluster.Forward). If the session
	// turns out to be running elsewhere by now, Send answers *BusyError
	// rather than forwarding it again.
	Forwarded bool
	// Resume, when set, runs the turn as a resumed attempt of a turn cut
	// off by a restart or a takeover (resume.go). Set by the engine for a
	// restored queued message, never by a channel.
	Resume *Resume
	// Restored: a message accepted earlier as queued — a stored queued
	// message sent again by a restore, or a queued message handed to the
	// replica that took its session (cluster mode). It is queued behind a
	// running turn whatever the channel's busy mode, and no queue bound
	// (busy.maxQueued, maxQueuedBytes) refuses it: it was within them when
	// it was accepted.
	Restored bool
}

// Ack answers Send.
type Ack struct {
	RunID   string
	Status  Status
	Outcome *Outcome // for a repeated key whose run already ended
	// Busy is what happened to a message that arrived while its session
	// had a running turn ("" when it started at once): BusyQueue or
	// BusyCollect (Status queued), BusySteer (Status steered, or queued
	// with FellBack), BusyInterrupt (the running turn was superseded; the
	// message is queued first and starts when that turn has ended).
	Busy BusyMode
	// Ahead counts the queued turns before this message's (Status queued):
	// 0 means it runs next.
	Ahead int
	// FellBack: steer was asked but the running turn's runner cannot take
	// a message, so it was queued.
	FellBack bool
	// Dropped are the texts of the messages dropped to answer this one
	// when busy.maxQueued messages already waited (busy.overflow): the
	// oldest waiting (drop-old; Status queued) or this one (drop-new;
	// Status dropped). Empty when none was.
	Dropped []string
	// DroppedIDs are the run ids of Dropped (drop-old: the messages'
	// own, as Send was given them).
	DroppedIDs []string
	// Limit is busy.maxQueued when Dropped is set.
	Limit int
}

// Send starts a turn. The same RunID while it runs answers StatusInFlight;
// after it ended (for idempotencyTTLSeconds) the cached outcome; while it
// waits in a queue StatusQueued again. A message for a session with an
// active turn (or messages waiting) is handled by the channel's busy mode
// (busy.go): queued or collected (StatusQueued, stored in Options.Queue
// first; *QueueFullError past busy.maxQueued), steered into the running
// turn (StatusSteered), queued after superseding the running turn
// (interrupt), or refused (*BusyError, mode reject). Send returns as soon as the turn
// is registered; the reply comes as events. While the session's previous
// turn's terminal event is still being handed to subscribers (Send called
// from a handler of it, or racing it), the session is free and the turn is
// accepted, but its TurnStarted is published — and its runner started —
// right after that event: every subscriber sees a session's turns in order.
//
// Lock contract: called without e.mu. Send takes e.mu in separate steps,
// each deciding under one hold and acting after releasing it: the
// idempotency lookup; the decision (a repeat, busy — busyLocked's effect —,
// refused, or free: claim or begin); in a cluster, after claiming unlocked,
// the claim's end (claimEndLocked) and the turn's registration
// (beginLocked), whose start runs after the unlock.
func (e *Engine) Send(ctx context.Context, req SendRequest) (Ack, error) {
	cfg := e.cfg.Current()
	if req.RunID == "" {
		req.RunID = uuid.NewString()
	}
	if config.RunIDReserved(req.Channel, req.RunID) {
		// Before the idempotency lookup: another channel's run is neither
		// taken nor reported.
		return Ack{}, fmt.Errorf("send %q from channel %q: %w", req.RunID, req.Channel, ErrReservedRunID)
	}
	e.mu.Lock()
	e.purgeExpired(time.Now())
	ack, repeated, err := e.repeatLocked(req)
	e.mu.Unlock()
	if repeated {
		return ack, err
	}
	if e.admit != nil {
		if err := e.admit(); err != nil {
			return Ack{}, &UnavailableError{Cause: err}
		}
	}

	if len(req.Text) == 0 || !hasNonSpace(req.Text) {
		return Ack{}, ErrEmpty
	}
	if max := cfg.Server.MaxMessageChars; max > 0 && utf8.RuneCountInString(req.Text) > max {
		return Ack{}, fmt.Errorf("%w: %d characters, the limit is %d", ErrTooLong, utf8.RuneCountInString(req.Text), max)
	}
	name := cfg.RunnerFor(req.Channel)
	if _, ok := e.runners[name]; !ok {
		return Ack{}, fmt.Errorf("%w: %q (channel %s)", ErrNoRunner, name, req.Channel)
	}
	var s *session
	for {
		var err error
		if s, err = e.session(ctx, e.refresh(req.SessionKey)); err != nil {
			return Ack{}, fmt.Errorf("send: %w", err)
		}
		e.mu.Lock()
		if e.sessions[req.SessionKey] != s {
			e.mu.Unlock()
			continue // evicted since
		}
		if c := s.claiming; c != nil {
			// Another message of this session is being claimed in the
			// cluster: its answer decides whether this one is busy.
			e.mu.Unlock()
			select {
			case <-c:
				continue
			case <-ctx.Done():
				return Ack{}, fmt.Errorf("send: %w", context.Cause(ctx))
			}
		}
		break // e.mu is held
	}
	// e.mu was released since the check above: the same run id (a client's
	// retry racing its first send) may have started, queued or ended since.
	if ack, ok, err := e.repeatLocked(req); ok {
		e.mu.Unlock()
		return ack, err
	}
	// The wait for the history (up to historyLoadTimeout) may have crossed
	// a hot reload: the turn starts with the configuration in force now.
	cfg = e.cfg.Current()
	if e.closing {
		e.mu.Unlock()
		return Ack{}, ErrShutdown
	}
	mode, maxQueued := cfg.BusyFor(req.Channel)
	if s.busyMode != "" {
		mode = string(s.busyMode) // set for this session by /queue <mode>
	}
	if req.Restored {
		mode = string(BusyQueue) // accepted as queued once already
	}
	if s.active == nil && len(s.queue) == 0 && e.cluster == nil && !req.Restored {
		if d := cfg.DebounceFor(req.Channel); d > 0 {
			effect := e.debounceLocked(s, req, d)
			e.mu.Unlock()
			return effect(ctx)
		}
	}
	if s.active != nil || len(s.queue) > 0 {
		if m := BusyMode(mode); m != BusyReject || e.holdingLocked(s) {
			effect := e.busyLocked(s, req, m, maxQueued)
			e.mu.Unlock()
			return effect(ctx)
		}
	}
	if s.active != nil {
		a := s.active
		e.mu.Unlock()
		return Ack{}, &BusyError{SessionKey: req.SessionKey, RunID: a.ID, Stopping: a.State() != abort.StateRunning}
	}
	claimed := false
	var start time.Duration // 0: the turn starts as it registers
	if e.cluster != nil {
		// Three steps, each with its own hold of e.mu or none: begin the
		// claim (decided with the check above), claim unlocked, end it.
		c, err := e.claimBeginLocked(cfg, s, req)
		e.mu.Unlock()
		if err != nil {
			return Ack{}, err
		}
		err = e.cluster.Claim(ctx, c.req)
		if err != nil && e.claimReadBack(req.RunID, req.SessionKey, err) {
			err = nil // committed, its answer lost: this replica's claim
		}
		e.mu.Lock()
		if effect := e.claimEndLocked(s, c, req, err); effect != nil {
			e.mu.Unlock()
			return effect(ctx)
		}
		claimed = true
		start = c.start
		cfg = e.cfg.Current() // the claim may have waited across a reload too
	}
	begin, err := e.beginLocked(cfg, s, req, start)
	if claimed && err == nil {
		e.turns[req.RunID].claimed.Store(true)
	}
	if err != nil {
		e.mu.Unlock()
		if claimed {
			// The pump waited for this claim (pumpLocked): what was queued
			// meanwhile starts once the claim is released.
			e.abandonClaim(s, req, err)
		}
		if errors.Is(err, abort.ErrDuplicate) {
			return Ack{RunID: req.RunID, Status: StatusInFlight}, nil
		}
		return Ack{}, err
	}
	// The previous turn's ending is still on its way to the bus's
	// subscribers (this may be one of them, answering it): the publisher
	// starts this turn right after it, so everyone sees the ending first.
	deferred := s.ending > 0
	if deferred {
		s.deferred = append(s.deferred, begin)
	}
	e.mu.Unlock()
	if !deferred {
		begin()
	}
	return Ack{RunID: req.RunID, Status: StatusStarted}, nil
}
