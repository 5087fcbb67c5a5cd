// Package inproc owns an in-process gateway.Cluster: several engines in
// one test binary, joined to one Hub, decide who runs a session's turn in a
// map under a mutex and carry events and forwarded requests by plain
// function calls. It is for tests of the engine and the channels with more
// than one replica (and passes cluster/clustertest, as cluster/node does):
// no network, no clock of its own, and every goroutine it starts ends with
// the Import that started it or with Close, so it runs inside
// testing/synctest bubbles. It imports only the gateway's types and the
// vocabulary.
package inproc

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
)

// Handler is a member's local engine, as Forward and ForwardAbort reach
// it (*gateway.Engine satisfies it).
type Handler interface {
	Send(ctx context.Context, req gateway.SendRequest) (gateway.Ack, error)
	Abort(ctx context.Context, sessionKey, runID string, reason event.StopReason, requester string, operator bool) (gateway.AbortResult, error)
	Resolve(ctx context.Context, req gateway.ResolveRequest) (gateway.ResolveResult, error)
	StopWith(ctx context.Context, req gateway.StopRequest) (gateway.StopResult, error)
	Status(sessionKey string) gateway.TurnStatus
}

// DefaultQueue is how many events wait for one Import handler before
// the overflow is reported as a gap of their session.
const DefaultQueue = 1024

// TakenTurn is a turn a Kill ended as interrupted.
type TakenTurn struct {
	RunID, SessionKey, Channel, ChatRef string
	Notice                              string
}

// Hub is the cluster the members share. Set its fields before Join.
type Hub struct {
	// Notice renders the interrupted notice of a turn Kill ended (the
	// Aborted event's Message); nil means "interrupted".
	Notice func(TakenTurn) string
	// Queue bounds each Import handler's backlog; 0 means DefaultQueue.
	Queue int

	mu      sync.Mutex
	members map[string]*Member
	held    map[string]*run // session key → its running turn
	runs    map[string]*run // run id → the turn, running or ended
}

type run struct {
	TakenTurn
	owner      *Member
	running    bool
	stopReason event.StopReason
}

// NewHub returns an empty cluster.
func NewHub() *Hub {
	return &Hub{members: map[string]*Member{}, held: map[string]*run{}, runs: map[string]*run{}}
}

// Member is one replica's gateway.Cluster on a Hub.
type Member struct {
	hub *Hub
	id  string

	// Guarded by hub.mu.
	dead    bool
	handler Handler
	subs    []*sub
}

var _ gateway.Cluster = (*Member)(nil)

// Join adds the replica replicaID to the hub. A replica id joined before
// and not killed is refused with a panic: two members of one name would
// make every answer ambiguous.
func (h *Hub) Join(replicaID string) *Member {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.members[replicaID]; m != nil && !m.dead {
		panic(fmt.Sprintf("inproc: replica %q joined twice", replicaID))
	}
	m := &Member{hub: h, id: replicaID}
	h.members[replicaID] = m
	return m
}

// Serve makes h the engine that Forward and ForwardAbort from the other
// members reach.
func (m *Member) Serve(h Handler) {
	m.hub.mu.Lock()
	m.handler = h
	m.hub.mu.Unlock()
}

// Replica is the member's id.
func (m *Member) Replica() string { return m.id }

// Claim reserves the session for the run, as gateway.Cluster says.
func (m *Member) Claim(_ context.Context, c gateway.ClaimRequest) error {
	h := m.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if m.dead {
		return fmt.Errorf("claim run %q: replica %s is dead: %w", c.RunID, m.id, gateway.ErrLeaseLost)
	}
	if r := h.runs[c.RunID]; r != nil {
		return &gateway.RunExistsError{RunID: r.RunID, SessionKey: r.SessionKey, Running: r.running,
			Replica: r.owner.id, StopReason: r.stopReason}
	}
	if r := h.held[c.SessionKey]; r != nil {
		return &gateway.HeldError{SessionKey: c.SessionKey, RunID: r.RunID, Replica: r.owner.id}
	}
	r := &run{TakenTurn: TakenTurn{RunID: c.RunID, SessionKey: c.SessionKey, Channel: c.Channel, ChatRef: c.ChatRef},
		owner: m, running: true}
	h.runs[c.RunID], h.held[c.SessionKey] = r, r
	return nil
}

// Finish ends the member's running turn ev.RunID; a turn that is not
// running under this live member is gateway.ErrNotTurnOwner.
func (m *Member) Finish(_ context.Context, ev event.Event) error {
	if !ev.Kind.Terminal() {
		return fmt.Errorf("finish run %q: a %s event is not an ending", ev.RunID, ev.Kind)
	}
	h := m.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.runs[ev.RunID]
	switch {
	case m.dead:
		return fmt.Errorf("finish run %q: replica %s is dead: %w", ev.RunID, m.id, gateway.ErrNotTurnOwner)
	case r == nil:
		return fmt.Errorf("finish run %q: no such turn: %w", ev.RunID, gateway.ErrNotTurnOwner)
	case !r.running && r.owner == m && r.stopReason == ev.StopReason && ev.StopReason != event.ReasonInterrupted:
		return nil // the same ending again: a retry whose first answer was lost
	case !r.running:
		return fmt.Errorf("finish run %q: it already ended (%s): %w", ev.RunID, r.stopReason, gateway.ErrNotTurnOwner)
	case r.owner != m:
		return fmt.Errorf("finish run %q: it runs on replica %s: %w", ev.RunID, r.owner.id, gateway.ErrNotTurnOwner)
	}
	h.end(r, ev.StopReason)
	return nil
}

// end is called with hub.mu held.
func (h *Hub) end(r *run, reason event.StopReason) {
	r.running, r.stopReason = false, reason
	if h.held[r.SessionKey] == r {
		delete(h.held, r.SessionKey)
	}
}

// Holder returns the session's running turn and its member.
func (m *Member) Holder(_ context.Context, sessionKey string) (runID, replica string, ok bool, err error) {
	m.hub.mu.Lock()
	defer m.hub.mu.Unlock()
	if r := m.hub.held[sessionKey]; r != nil {
		return r.RunID, r.owner.id, true, nil
	}
	return "", "", false, nil
}

// target is the live, serving member replica; an error wrapping
// gateway.ErrClusterUnavailable if there is none.
func (m *Member) target(replica string) (Handler, error) {
	m.hub.mu.Lock()
	defer m.hub.mu.Unlock()
	t := m.hub.members[replica]
	switch {
	case m.dead:
		return nil, fmt.Errorf("replica %s is dead: %w", m.id, gateway.ErrClusterUnavailable)
	case t == nil || t.dead:
		return nil, fmt.Errorf("replica %s is gone: %w", replica, gateway.ErrClusterUnavailable)
	case t.handler == nil:
		return nil, fmt.Errorf("replica %s serves no requests: %w", replica, gateway.ErrClusterUnavailable)
	}
	return t.handler, nil
}

// Forward calls replica's engine's Send with req.Forwarded set.
func (m *Member) Forward(ctx context.Context, replica string, req gateway.SendRequest) (gateway.Ack, error) {
	h, err := m.target(replica)
	if err != nil {
		return gateway.Ack{}, fmt.Errorf("forward run %q: %w", req.RunID, err)
	}
	req.Forwarded = true
	return h.Send(ctx, req)
}

// ForwardAbort calls replica's engine's Abort.
func (m *Member) ForwardAbort(ctx context.Context, replica string, req gateway.AbortRequest) (gateway.AbortResult, error) {
	h, err := m.target(replica)
	if err != nil {
		return gateway.AbortResult{}, fmt.Errorf("forward the abort of session %q: %w", req.SessionKey, err)
	}
	return h.Abort(ctx, req.SessionKey, req.RunID, req.Reason, req.Requester, req.Operator)
}

// ForwardResolve calls replica's engine's Resolve with req.Forwarded set.
func (m *Member) ForwardResolve(ctx context.Context, replica string, req gateway.ResolveRequest) (gateway.ResolveResult, error) {
	h, err := m.target(replica)
	if err != nil {
		return gateway.ResolveResult{}, fmt.Errorf("forward the answer to %q: %w", req.ApprovalID, err)
	}
	req.Forwarded = true
	return h.Resolve(ctx, req)
}

// ForwardStop calls replica's engine's StopWith with req.Forwarded set.
func (m *Member) ForwardStop(ctx context.Context, replica string, req gateway.StopRequest) (gateway.StopResult, error) {
	h, err := m.target(replica)
	if err != nil {
		return gateway.StopResult{}, fmt.Errorf("forward the stop of session %q: %w", req.SessionKey, err)
	}
	req.Forwarded = true
	return h.StopWith(ctx, req)
}

// ForwardStatus calls replica's engine's Status.
func (m *Member) ForwardStatus(ctx context.Context, replica, sessionKey string) (gateway.TurnStatus, error) {
	h, err := m.target(replica)
	if err != nil {
		return gateway.TurnStatus{}, fmt.Errorf("ask the status of session %q: %w", sessionKey, err)
	}
	return h.Status(sessionKey), nil
}

// Export queues ev for every other live member's Import handlers; it
// never blocks. A dead member exports nothing.
func (m *Member) Export(ev event.Event) {
	ev.Locals = nil
	m.hub.mu.Lock()
	defer m.hub.mu.Unlock()
	if m.dead {
		return
	}
	m.hub.fanOut(m, ev)
}

// fanOut is called with hub.mu held: it queues ev for the subscribers of
// every live member but from.
func (h *Hub) fanOut(from *Member, ev event.Event) {
	for _, o := range h.members {
		if o == from || o.dead {
			continue
		}
		for _, s := range o.subs {
			s.push(ev)
		}
	}
}

// Import delivers the other members' events to h, in each session's order,
// on a goroutine of its own; past the hub's Queue waiting events, a
// session's overflow is reported to gap (once, in order) instead. stop ends
// it and waits for the goroutine: no call follows it.
func (m *Member) Import(h event.Handler, gap func(sessionKey string)) (stop func()) {
	q := m.hub.Queue
	if q <= 0 {
		q = DefaultQueue
	}
	s := &sub{h: h, gap: gap, limit: q, gapped: map[string]bool{}, wake: make(chan struct{}, 1),
		quit: make(chan struct{}), done: make(chan struct{})}
	m.hub.mu.Lock()
	m.subs = append(m.subs, s)
	m.hub.mu.Unlock()
	go s.run()
	return func() {
		m.hub.mu.Lock()
		m.subs = slices.DeleteFunc(m.subs, func(x *sub) bool { return x == s })
		m.hub.mu.Unlock()
		s.close()
	}
}

// Kill makes the member die as a crashed replica does: its running turns
// end as interrupted (the other members' Import handlers get each one's
// Aborted event, with the hub's Notice), its handler is no longer reached,
// its Claim fails with gateway.ErrClusterUnavailable, its Finish with
// gateway.ErrNotTurnOwner, and its Export carries nothing. Its Import
// handlers stay until stopped. It returns the turns it ended.
func (m *Member) Kill() []TakenTurn {
	h := m.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if m.dead {
		return nil
	}
	m.dead, m.handler = true, nil
	var taken []*run
	for _, r := range h.runs {
		if r.owner == m && r.running {
			taken = append(taken, r)
		}
	}
	slices.SortFunc(taken, func(a, b *run) int { return cmp.Compare(a.RunID, b.RunID) })
	var out []TakenTurn
	for _, r := range taken {
		h.end(r, event.ReasonInterrupted)
		r.Notice = "interrupted"
		if h.Notice != nil {
			r.Notice = h.Notice(r.TakenTurn)
		}
		out = append(out, r.TakenTurn)
		h.fanOut(m, event.Event{Kind: event.Aborted, RunID: r.RunID, SessionKey: r.SessionKey, Channel: r.Channel,
			ChatRef: r.ChatRef, StopReason: event.ReasonInterrupted, Message: r.Notice, Time: time.Now()})
	}
	return out
}

// Close stops the member's Import goroutines (as their stop functions
// would) and makes it leave the hub: Forward no longer reaches it. Its
// claims stay, as a replica's do until it finishes them.
func (m *Member) Close() {
	m.hub.mu.Lock()
	subs := m.subs
	m.subs, m.handler = nil, nil
	m.hub.mu.Unlock()
	for _, s := range subs {
		s.close()
	}
}

// sub is one Import handler: a bounded queue and the goroutine that
// drains it.
type sub struct {
	h     event.Handler
	gap   func(string)
	limit int

	mu     sync.Mutex
	queue  []item
	gapped map[string]bool // sessions with a gap report queued
	wake   chan struct{}
	quit   chan struct{}
	done   chan struct{}
	once   sync.Once
}

// item is an event, or a gap report when gap is set.
type item struct {
	ev  event.Event
	gap bool
}

// push queues ev; past the limit it queues a gap report for its session
// instead (one until it is delivered) and drops ev.
func (s *sub) push(ev event.Event) {
	s.mu.Lock()
	switch {
	case len(s.queue) < s.limit && !s.gapped[ev.SessionKey]:
		s.queue = append(s.queue, item{ev: ev})
	case !s.gapped[ev.SessionKey]:
		s.gapped[ev.SessionKey] = true
		s.queue = append(s.queue, item{ev: event.Event{SessionKey: ev.SessionKey}, gap: true})
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *sub) run() {
	defer close(s.done)
	for {
		select {
		case <-s.quit:
			return
		case <-s.wake:
		}
		for {
			s.mu.Lock()
			if len(s.queue) == 0 {
				s.mu.Unlock()
				break
			}
			it := s.queue[0]
			s.queue[0] = item{}
			s.queue = s.queue[1:]
			if it.gap {
				delete(s.gapped, it.ev.SessionKey)
			}
			s.mu.Unlock()
			select {
			case <-s.quit:
				return
			default:
			}
			if it.gap {
				if s.gap != nil {
					s.gap(it.ev.SessionKey)
				}
			} else {
				s.h(it.ev)
			}
		}
	}
}

func (s *sub) close() {
	s.once.Do(func() { close(s.quit) })
	<-s.done
}
