package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnguard/turnguard/cluster/busauth"
	"github.com/turnguard/turnguard/gateway"
)

// DefaultForwardTimeout bounds a Forward or ForwardAbort whose ctx has no
// deadline.
const DefaultForwardTimeout = 10 * time.Second

// maxServing bounds the forwarded requests a replica answers at once; past
// it the subscription waits (NATS buffers, then drops for a slow
// consumer: the caller's request times out as unavailable).
const maxServing = 1024

// noResponderPatience is the longest of the waits before a request that
// found no responder is sent again (10 ms, doubling: about 310 ms in all).
const noResponderPatience = 160 * time.Millisecond

// refusedLogEvery is the least time between two log lines about refused
// (unsigned or forged) requests; the count in between is in the next.
const refusedLogEvery = 10 * time.Second

// rpcSubject is replica's subject for op ("send", "abort", "resolve",
// "stop", "status"): busauth.RPCPrefix, which only replica may subscribe to.
func rpcSubject(replica, op string) string {
	return busauth.RPCPrefix(replica) + "." + op
}

// sendBody is a forwarded gateway.SendRequest.
type sendBody struct {
	SessionKey string        `json:"sessionKey"`
	Channel    string        `json:"channel,omitempty"`
	ChatRef    string        `json:"chatRef,omitempty"`
	RunID      string        `json:"runId,omitempty"`
	Text       string        `json:"text"`
	Timeout    time.Duration `json:"timeoutNs,omitempty"`
	Owner      string        `json:"owner,omitempty"`
	Restored   bool          `json:"restored,omitempty"` // gateway.SendRequest.Restored
	Budget     time.Duration `json:"budgetNs"`           // how long the caller waits for the answer
}

// abortBody is a forwarded gateway.AbortRequest.
type abortBody struct {
	gateway.AbortRequest
	Budget time.Duration `json:"budgetNs"`
}

// resolveBody is a forwarded gateway.ResolveRequest.
type resolveBody struct {
	gateway.ResolveRequest
	Budget time.Duration `json:"budgetNs"`
}

// stopBody is a forwarded gateway.StopRequest.
type stopBody struct {
	gateway.StopRequest
	Budget time.Duration `json:"budgetNs"`
}

// statusBody asks for a session's gateway.TurnStatus.
type statusBody struct {
	SessionKey string        `json:"sessionKey"`
	Budget     time.Duration `json:"budgetNs"`
}

// answer is a forwarded request's reply: Ack, Result, Resolved, Stopped
// or Status, or Err.
type answer struct {
	Ack      *gateway.Ack           `json:"ack,omitempty"`
	Result   *gateway.AbortResult   `json:"result,omitempty"`
	Resolved *gateway.ResolveResult `json:"resolved,omitempty"`
	Stopped  *gateway.StopResult    `json:"stopped,omitempty"`
	Status   *gateway.TurnStatus    `json:"status,omitempty"`
	Err      *wireError             `json:"err,omitempty"`
}

// Serve makes h the engine that answers the requests other replicas
// forward here; calling it again replaces h.
func (n *Node) Serve(h Handler) {
	n.handler.Store(&h)
	n.serveOnce.Do(func() {
		n.serving.init()
		for op, f := range map[string]func(context.Context, Handler, []byte) answer{"send": serveSend, "abort": serveAbort, "resolve": serveResolve, "stop": serveStop, "status": serveStatus} {
			sub, err := n.nc.Subscribe(rpcSubject(n.opts.ReplicaID, op), func(m *nats.Msg) { n.serve(m, op, f) })
			if err != nil {
				n.log.Error("cluster: cannot answer forwarded requests", "op", op, "error", err)
				continue
			}
			n.serving.add(sub)
		}
		if err := n.nc.Flush(); err != nil {
			n.log.Warn("cluster: flush the forwarded requests' subscriptions", "error", err)
		}
	})
}

// serve answers m with f on a goroutine of its own (at most maxServing at
// once), under the caller's budget.
//
// A request without a valid, fresh signature of a replica (Options.Auth)
// is not handled: its body — the operator flag, the owner, the requester —
// is nobody's word. It is answered as refused, counted (Refused) and
// logged at most once every refusedLogEvery.
func (n *Node) serve(m *nats.Msg, op string, f func(context.Context, Handler, []byte) answer) {
	signer, err := n.opts.Auth.Verify(m.Subject, m.Header, m.Data, true)
	if err != nil {
		n.refuse(m, err)
		return
	}
	if op == "status" || op == "send" {
		// The asking replica is about to show the session (a re-attach, a
		// sender's connection): it wants the session's live events from
		// now on, before the answer, whatever its announcements say yet.
		// What the turn held until now is in the status it gets (or, for a
		// sender, before its time, as on one replica): dropped, not
		// replayed.
		var b struct {
			SessionKey string `json:"sessionKey"`
		}
		if json.Unmarshal(m.Data, &b) == nil && b.SessionKey != "" {
			n.interest.Touch(signer, b.SessionKey)
			n.dropHeld(b.SessionKey)
		}
	}
	ctx, done, ok := n.serving.begin()
	if !ok {
		return
	}
	go func() {
		defer done()
		h := *n.handler.Load()
		a := f(ctx, h, m.Data)
		data, err := json.Marshal(a)
		if err != nil {
			data, _ = json.Marshal(answer{Err: encodeError(fmt.Errorf("encode the answer: %w", err))})
		}
		if err := m.Respond(data); err != nil {
			n.log.Warn("cluster: answer a forwarded request", "subject", m.Subject, "error", err)
		}
	}()
}

// refuse answers m as refused, counts it, and logs it unless it logged
// one within refusedLogEvery.
func (n *Node) refuse(m *nats.Msg, err error) {
	total := n.refused.Add(1)
	now := time.Now().UnixNano()
	if last := n.refusedLogged.Load(); now-last >= int64(refusedLogEvery) && n.refusedLogged.CompareAndSwap(last, now) {
		n.log.Warn("cluster: refused a forwarded request not signed by a replica (someone else can reach NATS)",
			"subject", m.Subject, "error", err, "refused_total", total)
	}
	if m.Reply == "" {
		return
	}
	// Unavailable to the caller: a genuine replica refused here (its clock
	// off by more than busauth.Window, another secret) tells its user the
	// cluster cannot take the request now, not a Go error.
	data, _ := json.Marshal(answer{Err: encodeError(fmt.Errorf("refused: %w: %w", err, gateway.ErrClusterUnavailable))})
	_ = m.Respond(data)
}

// Refused is how many forwarded requests this replica refused for want of
// a valid signature.
func (n *Node) Refused() uint64 { return n.refused.Load() }

// budget is ctx bounded by the caller's budget (none: the default).
func budget(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		d = DefaultForwardTimeout
	}
	return context.WithTimeout(ctx, d)
}

func serveSend(ctx context.Context, h Handler, data []byte) answer {
	var b sendBody
	if err := json.Unmarshal(data, &b); err != nil {
		return answer{Err: encodeError(fmt.Errorf("a forwarded send that does not decode: %w", err))}
	}
	ctx, cancel := budget(ctx, b.Budget)
	defer cancel()
	ack, err := h.Send(ctx, gateway.SendRequest{SessionKey: b.SessionKey, Channel: b.Channel, ChatRef: b.ChatRef,
		RunID: b.RunID, Text: b.Text, Timeout: b.Timeout, Owner: b.Owner, Forwarded: true, Restored: b.Restored})
	if err != nil {
		return answer{Err: encodeError(err)}
	}
	return answer{Ack: &ack}
}

func serveAbort(ctx context.Context, h Handler, data []byte) answer {
	var b abortBody
	if err := json.Unmarshal(data, &b); err != nil {
		return answer{Err: encodeError(fmt.Errorf("a forwarded abort that does not decode: %w", err))}
	}
	ctx, cancel := budget(ctx, b.Budget)
	defer cancel()
	res, err := h.Abort(ctx, b.SessionKey, b.RunID, b.Reason, b.Requester, b.Operator)
	if err != nil {
		return answer{Err: encodeError(err)}
	}
	return answer{Result: &res}
}

func serveResolve(ctx context.Context, h Handler, data []byte) answer {
	var b resolveBody
	if err := json.Unmarshal(data, &b); err != nil {
		return answer{Err: encodeError(fmt.Errorf("a forwarded answer that does not decode: %w", err))}
	}
	ctx, cancel := budget(ctx, b.Budget)
	defer cancel()
	b.Forwarded = true
	res, err := h.Resolve(ctx, b.ResolveRequest)
	if err != nil {
		return answer{Err: encodeError(err)}
	}
	return answer{Resolved: &res}
}

func serveStop(ctx context.Context, h Handler, data []byte) answer {
	var b stopBody
	if err := json.Unmarshal(data, &b); err != nil {
		return answer{Err: encodeError(fmt.Errorf("a forwarded stop that does not decode: %w", err))}
	}
	ctx, cancel := budget(ctx, b.Budget)
	defer cancel()
	b.Forwarded = true
	res, err := h.StopWith(ctx, b.StopRequest)
	if err != nil {
		return answer{Err: encodeError(err)}
	}
	return answer{Stopped: &res}
}

func serveStatus(_ context.Context, h Handler, data []byte) answer {
	var b statusBody
	if err := json.Unmarshal(data, &b); err != nil {
		return answer{Err: encodeError(fmt.Errorf("a status request that does not decode: %w", err))}
	}
	st := h.Status(b.SessionKey)
	return answer{Status: &st}
}

// ForwardStatus asks replica's engine for its status of sessionKey (the
// running turn, its queue and open questions).
func (n *Node) ForwardStatus(ctx context.Context, replica, sessionKey string) (gateway.TurnStatus, error) {
	var a answer
	b := statusBody{SessionKey: sessionKey}
	n.interest.Asked(sessionKey) // replica wants it for us now (serve: Touch); Import follows it
	if err := n.request(ctx, replica, "status", func(d time.Duration) any { b.Budget = d; return b }, &a); err != nil {
		return gateway.TurnStatus{}, fmt.Errorf("ask the status of session %q: %w", sessionKey, err)
	}
	if a.Err != nil {
		return gateway.TurnStatus{}, a.Err.decode()
	}
	if a.Status == nil {
		return gateway.TurnStatus{}, fmt.Errorf("ask the status of session %q of replica %s: an answer with no status", sessionKey, replica)
	}
	return *a.Status, nil
}

// ForwardStop asks replica's engine to carry out a /stop and returns its
// answer.
func (n *Node) ForwardStop(ctx context.Context, replica string, req gateway.StopRequest) (gateway.StopResult, error) {
	var a answer
	b := stopBody{StopRequest: req}
	if err := n.request(ctx, replica, "stop", func(d time.Duration) any { b.Budget = d; return b }, &a); err != nil {
		return gateway.StopResult{}, fmt.Errorf("forward the stop of session %q: %w", req.SessionKey, err)
	}
	if a.Err != nil {
		return gateway.StopResult{}, a.Err.decode()
	}
	if a.Stopped == nil {
		return gateway.StopResult{}, fmt.Errorf("forward the stop of session %q to replica %s: an answer with no result", req.SessionKey, replica)
	}
	return *a.Stopped, nil
}

// ForwardResolve asks replica's engine to settle a question and returns
// its answer.
func (n *Node) ForwardResolve(ctx context.Context, replica string, req gateway.ResolveRequest) (gateway.ResolveResult, error) {
	var a answer
	b := resolveBody{ResolveRequest: req}
	if err := n.request(ctx, replica, "resolve", func(d time.Duration) any { b.Budget = d; return b }, &a); err != nil {
		return gateway.ResolveResult{}, fmt.Errorf("forward the answer to %q: %w", req.ApprovalID, err)
	}
	if a.Err != nil {
		return gateway.ResolveResult{}, a.Err.decode()
	}
	if a.Resolved == nil {
		return gateway.ResolveResult{}, fmt.Errorf("forward the answer to %q to replica %s: an answer with no result", req.ApprovalID, replica)
	}
	return *a.Resolved, nil
}

// Forward hands req to replica's engine (its Send, with req.Forwarded
// set) and returns its answer, errors as the engine's types.
func (n *Node) Forward(ctx context.Context, replica string, req gateway.SendRequest) (gateway.Ack, error) {
	var a answer
	b := sendBody{SessionKey: req.SessionKey, Channel: req.Channel, ChatRef: req.ChatRef, RunID: req.RunID,
		Text: req.Text, Timeout: req.Timeout, Owner: req.Owner, Restored: req.Restored}
	n.interest.Asked(req.SessionKey) // as ForwardStatus
	if err := n.request(ctx, replica, "send", func(d time.Duration) any { b.Budget = d; return b }, &a); err != nil {
		return gateway.Ack{}, fmt.Errorf("forward run %q of session %q: %w", req.RunID, req.SessionKey, err)
	}
	if a.Err != nil {
		return gateway.Ack{}, a.Err.decode()
	}
	if a.Ack == nil {
		return gateway.Ack{}, fmt.Errorf("forward run %q to replica %s: an answer with no ack", req.RunID, replica)
	}
	return *a.Ack, nil
}

// ForwardAbort asks replica's engine to abort and returns its answer.
func (n *Node) ForwardAbort(ctx context.Context, replica string, req gateway.AbortRequest) (gateway.AbortResult, error) {
	var a answer
	b := abortBody{AbortRequest: req}
	if err := n.request(ctx, replica, "abort", func(d time.Duration) any { b.Budget = d; return b }, &a); err != nil {
		return gateway.AbortResult{}, fmt.Errorf("forward the abort of session %q: %w", req.SessionKey, err)
	}
	if a.Err != nil {
		return gateway.AbortResult{}, a.Err.decode()
	}
	if a.Result == nil {
		return gateway.AbortResult{}, fmt.Errorf("forward the abort of session %q to replica %s: an answer with no result", req.SessionKey, replica)
	}
	return *a.Result, nil
}

// request sends the body (built with the time the caller will wait) to
// replica's op and decodes the answer into a. Not reaching the replica is
// an error wrapping gateway.ErrClusterUnavailable.
func (n *Node) request(ctx context.Context, replica, op string, body func(time.Duration) any, a *answer) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultForwardTimeout)
		defer cancel()
	}
	dl, _ := ctx.Deadline()
	data, err := json.Marshal(body(time.Until(dl)))
	if err != nil {
		return fmt.Errorf("encode the request: %w", err)
	}
	subject := rpcSubject(replica, op)
	send := func() (*nats.Msg, error) {
		req := &nats.Msg{Subject: subject, Data: data}
		n.opts.Auth.Sign(req) // a new nonce each time: the receiver refuses a replay
		return n.nc.RequestMsgWithContext(ctx, req)
	}
	m, err := send()
	// A replica that has just started serving may not be known yet on
	// every NATS node (interest crosses the cluster's routes
	// asynchronously): ask again for a moment before calling it gone.
	for wait := 10 * time.Millisecond; errors.Is(err, nats.ErrNoResponders) && wait <= noResponderPatience; wait *= 2 {
		select {
		case <-ctx.Done():
		case <-time.After(wait):
			m, err = send()
		}
		if ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("replica %s does not answer (gone, or not serving): %w: %w", replica, gateway.ErrClusterUnavailable, err)
		}
		return fmt.Errorf("replica %s: %w: %w", replica, gateway.ErrClusterUnavailable, err)
	}
	if err := json.Unmarshal(m.Data, a); err != nil {
		return fmt.Errorf("replica %s: an answer that does not decode: %w", replica, err)
	}
	return nil
}

// serving tracks the forwarded requests being answered.
type serving struct {
	mu     sync.Mutex
	subs   []*nats.Subscription
	slots  chan struct{}
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
	ended  bool
}

func (s *serving) init() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slots = make(chan struct{}, maxServing)
	s.ctx, s.cancel = context.WithCancel(context.Background())
}

func (s *serving) add(sub *nats.Subscription) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subs = append(s.subs, sub)
}

// begin takes a slot (waiting for one) for a request; false once stopping.
func (s *serving) begin() (context.Context, func(), bool) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return nil, nil, false
	}
	s.wg.Add(1)
	ctx, slots := s.ctx, s.slots
	s.mu.Unlock()
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		s.wg.Done()
		return nil, nil, false
	}
	return ctx, func() { <-slots; s.wg.Done() }, true
}

// stop unsubscribes and waits for the requests being answered until ctx
// ends; then it cancels them and waits for them to return.
func (s *serving) stop(ctx context.Context) error {
	s.mu.Lock()
	if s.ended || s.cancel == nil {
		s.ended = true
		s.mu.Unlock()
		return nil
	}
	s.ended = true
	subs := s.subs
	s.mu.Unlock()
	var errs []error
	for _, sub := range subs {
		if err := sub.Unsubscribe(); err != nil {
			errs = append(errs, fmt.Errorf("stop answering %s: %w", sub.Subject, err))
		}
	}
	idle := make(chan struct{})
	go func() { s.wg.Wait(); close(idle) }()
	select {
	case <-idle:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("forwarded requests still being answered: %w", ctx.Err()))
	}
	s.cancel()
	<-idle
	return errors.Join(errs...)
}
