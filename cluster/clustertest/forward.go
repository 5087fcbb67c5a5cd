// The forwarding cases of the suite: a request forwarded to the other
// replica (send, abort, resolve, stop, status) reaches its engine — the fake
// engine here records it — and comes back with the engine's answer, its
// errors' types and words intact, concurrently; a replica that is not there
// is ErrClusterUnavailable.

package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
)

// engine is a fake local engine: it records what reached it and answers
// with send and abort.
type engine struct {
	mu     sync.Mutex
	sends  []gateway.SendRequest
	aborts []gateway.AbortRequest
	send   func(gateway.SendRequest) (gateway.Ack, error)
	abort  func(gateway.AbortRequest) (gateway.AbortResult, error)

	resolves []gateway.ResolveRequest
	resolve  func(gateway.ResolveRequest) (gateway.ResolveResult, error)

	stops []gateway.StopRequest
	stop  func(gateway.StopRequest) (gateway.StopResult, error)

	statuses []string // session keys asked
	status   func(string) (gateway.TurnStatus, error)
}

func (e *engine) Status(sessionKey string) gateway.TurnStatus {
	st, _ := record(&e.mu, &e.statuses, &e.status, sessionKey)
	return st
}

func (e *engine) StopWith(_ context.Context, req gateway.StopRequest) (gateway.StopResult, error) {
	return record(&e.mu, &e.stops, &e.stop, req)
}

func (e *engine) Resolve(_ context.Context, req gateway.ResolveRequest) (gateway.ResolveResult, error) {
	return record(&e.mu, &e.resolves, &e.resolve, req)
}

func (e *engine) Send(_ context.Context, req gateway.SendRequest) (gateway.Ack, error) {
	return record(&e.mu, &e.sends, &e.send, req)
}

// record appends req to got and answers it with the current *answer, read
// under mu (a case may change the answer between requests).
func record[Req, Res any](mu *sync.Mutex, got *[]Req, answer *func(Req) (Res, error), req Req) (Res, error) {
	mu.Lock()
	*got = append(*got, req)
	f := *answer
	mu.Unlock()
	return f(req)
}

func (e *engine) Abort(_ context.Context, sessionKey, runID string, reason event.StopReason, requester string, operator bool) (gateway.AbortResult, error) {
	req := gateway.AbortRequest{SessionKey: sessionKey, RunID: runID, Reason: reason, Requester: requester, Operator: operator}
	return record(&e.mu, &e.aborts, &e.abort, req)
}

func (e *engine) answer(send func(gateway.SendRequest) (gateway.Ack, error)) {
	e.mu.Lock()
	e.send = send
	e.mu.Unlock()
}

func forwardReachesTheOtherEngine(s *suite, p Pair) {
	t := s.t
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	want := gateway.Ack{RunID: "run-7", Status: gateway.StatusQueued, Busy: gateway.BusyQueue, Ahead: 2, FellBack: true,
		Outcome: &gateway.Outcome{RunID: "run-7", SessionKey: s.key, Status: gateway.StatusOK, StopReason: event.ReasonStop,
			Text: "the reply", StartedAt: at, EndedAt: at.Add(time.Second)}}
	e := &engine{send: func(gateway.SendRequest) (gateway.Ack, error) { return want, nil }}
	p.ServeB(e)
	req := gateway.SendRequest{SessionKey: s.key, Channel: "ws", ChatRef: "chat-1", RunID: "run-7", Text: "héllo\nworld",
		Timeout: 90 * time.Second, Owner: "user-1", Restored: true}
	got, err := p.A.Forward(s.ctx(), p.B.Replica(), req)
	if err != nil {
		t.Fatalf("Forward: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Forward answered %+v (outcome %+v); want %+v (outcome %+v)", got, got.Outcome, want, want.Outcome)
	}
	req.Forwarded = true
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.sends) != 1 || !reflect.DeepEqual(e.sends[0], req) {
		t.Errorf("B's engine got %+v; want exactly %+v", e.sends, req)
	}
}

// userTexter is what the errors with words for a person have.
type userTexter interface{ UserText() string }

func forwardedErrorsKeepTypeAndWords(s *suite, p Pair) {
	for _, c := range []struct {
		name  string
		err   error
		check func(error) bool
	}{
		{"busy", &gateway.BusyError{SessionKey: s.key, RunID: "run-1", Stopping: true}, func(err error) bool {
			be, ok := errors.AsType[*gateway.BusyError](err)
			return ok && be.RunID == "run-1" && be.SessionKey == s.key && be.Stopping && errors.Is(err, gateway.ErrBusy)
		}},
		{"queue full", &gateway.QueueFullError{SessionKey: s.key, Limit: 3}, func(err error) bool {
			qe, ok := errors.AsType[*gateway.QueueFullError](err)
			return ok && qe.Limit == 3 && qe.SessionKey == s.key && errors.Is(err, gateway.ErrBusy)
		}},
		{"runner stuck", &gateway.RunnerStuckError{Runner: "exec", Stuck: 4, Limit: 4}, func(err error) bool {
			re, ok := errors.AsType[*gateway.RunnerStuckError](err)
			return ok && re.Runner == "exec" && re.Stuck == 4 && re.Limit == 4 && errors.Is(err, gateway.ErrRunnerStuck)
		}},
		{"unavailable", &gateway.UnavailableError{Cause: errors.New("the store cannot write")}, func(err error) bool {
			_, ok := errors.AsType[*gateway.UnavailableError](err)
			return ok && errors.Is(err, gateway.ErrUnavailable)
		}},
		{"held", &gateway.HeldError{SessionKey: s.key, RunID: "run-1", Replica: "c"}, func(err error) bool {
			he, ok := errors.AsType[*gateway.HeldError](err)
			return ok && he.RunID == "run-1" && he.Replica == "c"
		}},
		{"too long", fmt.Errorf("%w: 5000 characters, at most 4000", gateway.ErrTooLong), is(gateway.ErrTooLong)},
		{"empty", gateway.ErrEmpty, is(gateway.ErrEmpty)},
		{"no runner", gateway.ErrNoRunner, is(gateway.ErrNoRunner)},
		{"not owner", gateway.ErrNotOwner, is(gateway.ErrNotOwner)},
		{"wrong session", gateway.ErrWrongSession, is(gateway.ErrWrongSession)},
		{"shutdown", gateway.ErrShutdown, is(gateway.ErrShutdown)},
		{"busy, untyped", gateway.ErrBusy, is(gateway.ErrBusy)},
		{"cluster unavailable", fmt.Errorf("claim: %w", gateway.ErrClusterUnavailable), is(gateway.ErrClusterUnavailable)},
		{"not turn owner", gateway.ErrNotTurnOwner, is(gateway.ErrNotTurnOwner)},
		{"unknown", errors.New("the disk is on fire"), func(error) bool { return true }},
	} {
		e := &engine{send: func(gateway.SendRequest) (gateway.Ack, error) { return gateway.Ack{}, c.err }}
		p.ServeB(e)
		_, err := p.A.Forward(s.ctx(), p.B.Replica(), gateway.SendRequest{SessionKey: s.key, RunID: "run-2", Text: "hi"})
		if err == nil || !c.check(err) {
			s.t.Errorf("%s: Forward returned %#v; want the engine's %#v", c.name, err, c.err)
			continue
		}
		if err.Error() != c.err.Error() {
			s.t.Errorf("%s: the words changed on the way: %q; want %q", c.name, err.Error(), c.err.Error())
		}
		if want, ok := c.err.(userTexter); ok {
			if got, ok := err.(userTexter); !ok || got.UserText() != want.UserText() {
				s.t.Errorf("%s: the user's text changed on the way: %v; want %q", c.name, err, want.UserText())
			}
		}
	}
}

// forwardsAreAnsweredConcurrently: n forwarded sends are all in the other
// engine's Send at once — one slow Send does not hold the others back.
func forwardsAreAnsweredConcurrently(s *suite, p Pair) {
	const n = 8
	var arrived sync.WaitGroup
	arrived.Add(n)
	all := make(chan struct{})
	go func() { arrived.Wait(); close(all) }()
	ctx := s.ctx()
	p.ServeB(&engine{send: func(req gateway.SendRequest) (gateway.Ack, error) {
		arrived.Done()
		select {
		case <-all:
			return gateway.Ack{RunID: req.RunID, Status: gateway.StatusStarted}, nil
		case <-ctx.Done():
			return gateway.Ack{}, fmt.Errorf("only some of the %d sends arrived together: %w", n, ctx.Err())
		}
	}})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ack, err := p.A.Forward(ctx, p.B.Replica(), gateway.SendRequest{SessionKey: fmt.Sprintf("%s:%d", s.key, i), RunID: fmt.Sprintf("run-%d", i), Text: "hi"})
			if err == nil && ack.RunID != fmt.Sprintf("run-%d", i) {
				err = fmt.Errorf("ack %+v", ack)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			s.t.Errorf("forward %d: %v", i, err)
		}
	}
}

func is(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }

// forwardResolve: an answer reaches the other engine's Resolve whole (with
// Forwarded set), its result comes back whole, and its typed errors stay
// typed.
func forwardResolve(s *suite, p Pair) {
	t := s.t
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	settled := event.Approval{ID: "ap_1", Title: "Run `make deploy` ✓", Detail: "in /srv", Tool: "shell",
		Options:   []event.ApprovalOption{{ID: "y", Label: "Allow", Kind: "allow_once"}, {ID: "n", Label: "Deny", Kind: "reject_once"}},
		CreatedAt: at, ExpiresAt: at.Add(5 * time.Minute), Outcome: event.ApprovalSelected, OptionID: "y",
		OptionKind: "allow_once", By: "@alice", ResolvedAt: at.Add(time.Minute)}
	e := &engine{resolve: func(req gateway.ResolveRequest) (gateway.ResolveResult, error) {
		switch {
		case req.SessionKey != s.key && !req.Operator:
			return gateway.ResolveResult{}, fmt.Errorf("answer %q: %w", req.ApprovalID, gateway.ErrApprovalForbidden)
		case req.ApprovalID != "ap_1":
			return gateway.ResolveResult{}, fmt.Errorf("answer %q: %w", req.ApprovalID, gateway.ErrApprovalNotFound)
		}
		return gateway.ResolveResult{Approval: settled}, nil
	}}
	p.ServeB(e)
	req := gateway.ResolveRequest{ApprovalID: "ap_1", OptionID: "y", SessionKey: s.key, By: "@alice"}
	got, err := p.A.ForwardResolve(s.ctx(), p.B.Replica(), req)
	if err != nil || got.Already || got.Approval.By != "@alice" || !got.Approval.ResolvedAt.Equal(settled.ResolvedAt) ||
		len(got.Approval.Options) != 2 || got.Approval.Title != settled.Title {
		t.Errorf("ForwardResolve: %+v, %v; want %+v", got, err, settled)
	}
	for _, tc := range []struct {
		req  gateway.ResolveRequest
		want error
	}{
		{gateway.ResolveRequest{ApprovalID: "ap_1", OptionID: "y", SessionKey: "another"}, gateway.ErrApprovalForbidden},
		{gateway.ResolveRequest{ApprovalID: "ap_2", OptionID: "y", SessionKey: s.key}, gateway.ErrApprovalNotFound},
	} {
		if _, err := p.A.ForwardResolve(s.ctx(), p.B.Replica(), tc.req); !errors.Is(err, tc.want) {
			t.Errorf("ForwardResolve %+v: %v; want %v", tc.req, err, tc.want)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.resolves) != 3 || !e.resolves[0].Forwarded || e.resolves[0].By != "@alice" {
		t.Errorf("B's engine got %+v", e.resolves)
	}
}

// forwardStop: a /stop reaches the other engine's StopWith whole (with
// Forwarded set), its result (the run aborted, the queued messages
// dropped) comes back whole, and ErrNotOwner stays typed.
func forwardStop(s *suite, p Pair) {
	t := s.t
	e := &engine{stop: func(req gateway.StopRequest) (gateway.StopResult, error) {
		if req.Requester != "user-1" && !req.Operator {
			return gateway.StopResult{}, fmt.Errorf("stop %s: %w", req.SessionKey, gateway.ErrNotOwner)
		}
		return gateway.StopResult{AbortResult: gateway.AbortResult{Aborted: true, RunIDs: []string{"run-1"}}, Dropped: 2}, nil
	}}
	p.ServeB(e)
	req := gateway.StopRequest{SessionKey: s.key, Requester: "user-1"}
	got, err := p.A.ForwardStop(s.ctx(), p.B.Replica(), req)
	if err != nil || !got.Aborted || got.Dropped != 2 || !reflect.DeepEqual(got.RunIDs, []string{"run-1"}) {
		t.Errorf("ForwardStop: %+v, %v; want run-1 aborted and 2 dropped", got, err)
	}
	other := gateway.StopRequest{SessionKey: s.key, Requester: "user-2"}
	if _, err := p.A.ForwardStop(s.ctx(), p.B.Replica(), other); !errors.Is(err, gateway.ErrNotOwner) {
		t.Errorf("ForwardStop by another user: %v; want ErrNotOwner", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.stops) != 2 || !e.stops[0].Forwarded || e.stops[0].Requester != "user-1" {
		t.Errorf("B's engine got %+v", e.stops)
	}
}

// forwardStatus: a session's status on the replica that runs its turn —
// the turn with its steps and limits, its reply so far, its queue, open
// questions and what its agent offers — comes back whole (issue 20: one
// view from every replica).
func forwardStatus(s *suite, p Pair) {
	t := s.t
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	want := gateway.TurnStatus{SessionKey: s.key, Running: true, Text: "so far",
		Queue: []gateway.QueuedMessage{{RunID: "run-2", SessionKey: s.key, Channel: "ws", Text: "next ✓", QueuedAt: at.Add(time.Second)}},
		Approvals: []event.Approval{{ID: "ap_1", Title: "Run `make deploy`", Tool: "shell", CreatedAt: at.Add(2 * time.Second),
			ExpiresAt: at.Add(time.Minute), Options: []event.ApprovalOption{{ID: "y", Label: "Allow", Kind: "allow_once"}}}},
	}
	// The turn as the owner's registry sees it, and its limits (set field
	// by field: this suite imports only the engine's seam).
	tr := &want.Turn
	tr.RunID, tr.SessionKey, tr.Channel, tr.State, tr.StartedAt = "run-1", s.key, "ws", "running", at
	tr.Elapsed, tr.StepElapsed, tr.UntilWall, tr.Paused = 3*time.Second, 2*time.Second, time.Minute, true
	tr.CurrentStep = event.Step{Kind: "tool", Name: "shell", Seq: 2, StartedAt: at.Add(time.Second)}
	tr.LastStep = event.Step{Kind: "tool", Name: "web_search", Seq: 1, StartedAt: at}
	want.Limits.Timeout, want.Limits.StepTimeout, want.Limits.ApprovalTimeout = 10*time.Minute, 5*time.Minute, time.Minute
	// What the owner's agent offers (/help and /mode through another
	// replica), decoded: this suite does not import the runner's types.
	want.Agent = &gateway.AgentView{}
	if err := json.Unmarshal([]byte(`{"Commands": [{"Name": "echo", "Description": "Say the input back"}],
		"Modes": {"Current": "ask", "Available": [{"ID": "ask", "Name": "Ask"}, {"ID": "code", "Name": "Code", "Description": "Write code"}]},
		"Options": [{"ID": "model", "Name": "Model", "Current": "fast", "Values": [{"ID": "fast"}, {"ID": "smart", "Name": "Smart"}]},
			{"ID": "verbose", "Boolean": true, "Current": "off"}]}`), want.Agent); err != nil {
		t.Fatal(err)
	}
	e := &engine{status: func(key string) (gateway.TurnStatus, error) {
		if key != s.key {
			return gateway.TurnStatus{SessionKey: key}, nil
		}
		return want, nil
	}}
	p.ServeB(e)
	got, err := p.A.ForwardStatus(s.ctx(), p.B.Replica(), s.key)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("ForwardStatus: %+v, %v;\nwant %+v", got, err, want)
	}
	if got, err := p.A.ForwardStatus(s.ctx(), p.B.Replica(), "another"); err != nil || got.Running || got.SessionKey != "another" {
		t.Errorf("ForwardStatus of an idle session: %+v, %v", got, err)
	}
	if _, err := p.A.ForwardStatus(s.ctx(), "nobody", s.key); !errors.Is(err, gateway.ErrClusterUnavailable) {
		t.Errorf("ForwardStatus to a replica that is not there: %v; want ErrClusterUnavailable", err)
	}
}

func forwardAbort(s *suite, p Pair) {
	t := s.t
	e := &engine{abort: func(req gateway.AbortRequest) (gateway.AbortResult, error) {
		if req.Requester != "user-1" && !req.Operator {
			return gateway.AbortResult{}, gateway.ErrNotOwner
		}
		return gateway.AbortResult{Aborted: true, RunIDs: []string{"run-1"}}, nil
	}}
	p.ServeB(e)
	req := gateway.AbortRequest{SessionKey: s.key, RunID: "run-1", Reason: event.ReasonUser, Requester: "user-1"}
	got, err := p.A.ForwardAbort(s.ctx(), p.B.Replica(), req)
	if err != nil || !got.Aborted || !reflect.DeepEqual(got.RunIDs, []string{"run-1"}) {
		t.Errorf("ForwardAbort: %+v, %v; want run-1 aborted", got, err)
	}
	other := gateway.AbortRequest{SessionKey: s.key, Reason: event.ReasonUser, Requester: "user-2"}
	if _, err := p.A.ForwardAbort(s.ctx(), p.B.Replica(), other); !errors.Is(err, gateway.ErrNotOwner) {
		t.Errorf("ForwardAbort by another user: %v; want ErrNotOwner", err)
	}
	admin := gateway.AbortRequest{SessionKey: s.key, Reason: event.ReasonUser, Requester: "admin", Operator: true}
	if _, err := p.A.ForwardAbort(s.ctx(), p.B.Replica(), admin); err != nil {
		t.Errorf("ForwardAbort by an operator: %v", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if want := []gateway.AbortRequest{req, other, admin}; !reflect.DeepEqual(e.aborts, want) {
		t.Errorf("B's engine got %+v; want %+v", e.aborts, want)
	}
}

func forwardToAReplicaThatIsNotThere(s *suite, p Pair) {
	if _, err := p.A.Forward(s.ctx(), "no-such-replica", gateway.SendRequest{SessionKey: s.key, Text: "hi"}); !errors.Is(err, gateway.ErrClusterUnavailable) {
		s.t.Errorf("Forward to a replica that is not there: %v; want ErrClusterUnavailable", err)
	}
	if _, err := p.A.ForwardAbort(s.ctx(), "no-such-replica", gateway.AbortRequest{SessionKey: s.key}); !errors.Is(err, gateway.ErrClusterUnavailable) {
		s.t.Errorf("ForwardAbort to a replica that is not there: %v; want ErrClusterUnavailable", err)
	}
}
