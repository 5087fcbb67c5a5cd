// Approvals: a runner's question to the person (runner.Turn.Ask), kept
// open until Resolve, approvalTimeoutSeconds or the turn's end, settled
// exactly once; the open questions a client lists; in a cluster an answer
// goes to the question's replica.

package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/timeout"
)

// Approvals: a runner asks the person a question through its turn's
// runner.Approver (approver, below). The engine publishes ApprovalRequested,
// pauses the turn's liveness clock and waits for whichever comes first:
// an answer (Engine.Resolve, from the chat the turn belongs to or an
// operator), approvalTimeoutSeconds (denied), or the turn's end (the
// runner's context). Each question is settled exactly once; a second answer
// is a no-op that reports the first.

// Errors of Resolve. Callers branch on them with errors.Is.
var (
	// ErrApprovalNotFound: no open or recently settled question has this id
	// here (it never existed, it was settled long ago, or the gateway
	// restarted while it waited — the store then has it as expired).
	ErrApprovalNotFound = errors.New("no such question")
	// ErrApprovalForbidden: the answer came from a chat the turn does not
	// belong to, and not from an operator.
	ErrApprovalForbidden = errors.New("this question belongs to another conversation")
	// ErrApprovalOption: the option id is not one of the question's.
	ErrApprovalOption = errors.New("no such option")
)

// Bounds of what a runner may put in a question: a channel shows it as is.
const (
	maxApprovalTitle   = 300  // characters
	maxApprovalDetail  = 2000 // characters
	maxApprovalOptions = 8
	maxOptionLabel     = 64
	// keptSettled is how many settled questions Resolve remembers, so a
	// late second answer is told "already answered" rather than "unknown".
	keptSettled = 1024
)

// ResolveRequest is an answer to an open question.
type ResolveRequest struct {
	ApprovalID string
	OptionID   string
	// OptionNumber, used when OptionID is "", picks the question's option
	// by its 1-based place (a Telegram button knows its place, not the
	// runner's id, which may be long); 0 picks nothing.
	OptionNumber int
	// SessionKey is the session of the chat the answer comes from; it must
	// be the turn's, unless Operator.
	SessionKey string
	// By names who answered, as the person's channel shows them
	// ("@alice", "web chat"); it is shown to the person and kept.
	By       string
	Operator bool
	// Forwarded: another replica passed this answer on (cluster mode); it
	// is not passed on again.
	Forwarded bool
}

// ResolveResult is how the question stands after Resolve.
type ResolveResult struct {
	Approval event.Approval // as settled (by this answer, or earlier)
	// Already: the question was settled before this answer, which changed
	// nothing (a second click, a late answer after the timeout).
	Already bool
}

// approvals holds the engine's open questions and the recently settled ones.
type approvals struct {
	mu      sync.Mutex
	open    map[string]*pendingApproval
	settled map[string]settledApproval
	order   []string // settled ids, oldest first (at most keptSettled)
}

type pendingApproval struct {
	a    *event.Approval
	run  *abort.Run
	done chan struct{} // closed when settled
	res  *event.Approval
}

type settledApproval struct {
	a          *event.Approval
	sessionKey string
}

func newApprovals() *approvals {
	return &approvals{open: map[string]*pendingApproval{}, settled: map[string]settledApproval{}}
}

// settle records p's outcome unless it was settled already, and reports
// the outcome that stands and whether this call set it.
func (ap *approvals) settle(p *pendingApproval, outcome, optionID, kind, by string, at time.Time) (*event.Approval, bool) {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	if p.res != nil {
		return p.res, false
	}
	r := *p.a
	r.Outcome, r.OptionID, r.OptionKind, r.By, r.ResolvedAt = outcome, optionID, kind, by, at
	p.res = &r
	delete(ap.open, r.ID)
	ap.settled[r.ID] = settledApproval{a: p.res, sessionKey: p.run.SessionKey}
	ap.order = append(ap.order, r.ID)
	if len(ap.order) > keptSettled {
		delete(ap.settled, ap.order[0])
		ap.order = ap.order[1:]
	}
	close(p.done)
	return p.res, true
}

// approver is a turn's runner.Approver.
type approver struct {
	e *Engine
	t *turn
}

// Ask implements runner.Approver.
func (ap *approver) Ask(ctx context.Context, q runner.Question) (runner.Answer, error) {
	if q.Title == "" {
		return runner.Answer{}, fmt.Errorf("ask: a question without a title: %w", runner.ErrNoApprover)
	}
	if err := ctx.Err(); err != nil {
		return runner.Answer{}, err
	}
	run := ap.t.run
	wait := run.Settings.ApprovalTimeout
	if wait <= 0 { // settings made without timeout.Resolve
		wait = timeout.DefaultApprovalTimeoutSeconds * time.Second
	}
	now := time.Now()
	a := &event.Approval{ID: newApprovalID(), Title: clip(q.Title, maxApprovalTitle), Detail: clip(q.Detail, maxApprovalDetail),
		Tool: clip(q.Tool, maxApprovalTitle), CreatedAt: now, ExpiresAt: now.Add(wait)}
	opts := q.Options
	if len(opts) == 0 {
		opts = runner.DefaultOptions
	}
	for i, o := range opts {
		if i == maxApprovalOptions {
			break
		}
		label := clip(o.Label, maxOptionLabel)
		if label == "" {
			label = string(o.Kind)
		}
		a.Options = append(a.Options, event.ApprovalOption{ID: o.ID, Label: label, Kind: string(o.Kind)})
	}
	p := &pendingApproval{a: a, run: run, done: make(chan struct{})}
	reg := ap.e.approvals
	reg.mu.Lock()
	reg.open[a.ID] = p
	reg.mu.Unlock()

	ap.t.clock.pause(pauseQuestion) // the liveness clock stops while the question is open
	ap.e.log.Info("asking the person", "run", run.ID, "session", run.SessionKey, "approval", a.ID,
		"tool", a.Tool, "expires", a.ExpiresAt)
	if run.State() == abort.StateRunning {
		cur, last := run.CurrentStep()
		run.Publish(ap.e.publish, event.Event{Kind: event.ApprovalRequested, Approval: a, Step: cur, LastStep: last})
	}
	timer := time.NewTimer(wait)
	var res *event.Approval
	select {
	case <-p.done:
		res = p.res
	case <-timer.C:
		deny := firstReject(a.Options)
		res, _ = reg.settle(p, event.ApprovalTimeout, deny.ID, deny.Kind, "", time.Now())
	case <-ctx.Done():
		res = ap.cancel(p)
	case <-run.Context().Done(): // the turn stopped, whatever ctx the runner passed
		res = ap.cancel(p)
	}
	timer.Stop()
	ap.t.clock.resume(pauseQuestion)
	ap.e.log.Info("question settled", "run", run.ID, "session", run.SessionKey, "approval", a.ID,
		"outcome", res.Outcome, "option", res.OptionID, "by", res.By)
	if res.Outcome == event.ApprovalCancelled {
		// The turn is stopping: its ending says so; the store cancels the
		// question with it.
		if err := ctx.Err(); err != nil {
			return runner.Answer{}, err
		}
		return runner.Answer{}, context.Cause(run.Context())
	}
	if run.State() == abort.StateRunning {
		cur, last := run.CurrentStep()
		run.Publish(ap.e.publish, event.Event{Kind: event.ApprovalResolved, Approval: res, Step: cur, LastStep: last})
	}
	out := runner.Answer{OptionID: res.OptionID, Kind: runner.OptionKind(res.OptionKind), By: res.By, Outcome: runner.Selected}
	if res.Outcome == event.ApprovalTimeout {
		out.Outcome = runner.TimedOut
		if out.Kind == "" {
			out.Kind = runner.RejectOnce
		}
	}
	return out, nil
}

// cancel settles p as cancelled (its turn is stopping) unless an answer won.
func (ap *approver) cancel(p *pendingApproval) *event.Approval {
	res, _ := ap.e.approvals.settle(p, event.ApprovalCancelled, "", "", "", time.Now())
	return res
}

// Resolve answers an open question. The answer must come from the chat the
// question's turn belongs to (req.SessionKey) or an operator, and name one
// of its options. In cluster mode a question of a turn another replica
// runs is answered there (req.SessionKey routes it, also an operator's). A question settled already (answered, timed out, or its
// turn ended) is not changed: Resolve returns how it was settled with
// Already set. Errors: ErrApprovalNotFound, ErrApprovalForbidden,
// ErrApprovalOption, wrapped with the id.
func (e *Engine) Resolve(ctx context.Context, req ResolveRequest) (ResolveResult, error) {
	reg := e.approvals
	reg.mu.Lock()
	p := reg.open[req.ApprovalID]
	if p == nil {
		s, ok := reg.settled[req.ApprovalID]
		reg.mu.Unlock()
		if !ok {
			if e.cluster != nil && !req.Forwarded && req.SessionKey != "" {
				return e.resolveElsewhere(ctx, req)
			}
			return ResolveResult{}, fmt.Errorf("answer %q: %w", req.ApprovalID, ErrApprovalNotFound)
		}
		if !req.Operator && s.sessionKey != req.SessionKey {
			return ResolveResult{}, fmt.Errorf("answer %q: %w", req.ApprovalID, ErrApprovalForbidden)
		}
		return ResolveResult{Approval: *s.a, Already: true}, nil
	}
	reg.mu.Unlock()
	if !req.Operator && p.run.SessionKey != req.SessionKey {
		return ResolveResult{}, fmt.Errorf("answer %q: %w", req.ApprovalID, ErrApprovalForbidden)
	}
	o, ok := p.a.Option(req.OptionID)
	if req.OptionID == "" && req.OptionNumber >= 1 && req.OptionNumber <= len(p.a.Options) {
		o, ok = p.a.Options[req.OptionNumber-1], true
	}
	if !ok {
		return ResolveResult{}, fmt.Errorf("answer %q with %q: %w", req.ApprovalID, req.OptionID, ErrApprovalOption)
	}
	by := clip(req.By, maxOptionLabel)
	if by == "" && req.Operator {
		by = "an operator"
	}
	res, mine := reg.settle(p, event.ApprovalSelected, o.ID, o.Kind, by, time.Now())
	return ResolveResult{Approval: *res, Already: !mine}, nil
}

// resolveElsewhere passes an answer to a question this replica does not
// have to the replica that runs the session's turn (cluster mode): the
// question lives with its turn.
func (e *Engine) resolveElsewhere(ctx context.Context, req ResolveRequest) (ResolveResult, error) {
	_, replica, ok, err := e.cluster.Holder(ctx, req.SessionKey)
	if err != nil {
		return ResolveResult{}, &UnavailableError{Cause: err}
	}
	if !ok || replica == e.cluster.Replica() {
		return ResolveResult{}, fmt.Errorf("answer %q: %w", req.ApprovalID, ErrApprovalNotFound)
	}
	req.Forwarded = true
	return e.cluster.ForwardResolve(ctx, replica, req)
}

// PendingApprovals returns the open questions of sessionKey's turns, or of
// every session when sessionKey is "", oldest first.
func (e *Engine) PendingApprovals(sessionKey string) []event.Approval {
	reg := e.approvals
	reg.mu.Lock()
	defer reg.mu.Unlock()
	var out []event.Approval
	for _, p := range reg.open {
		if sessionKey == "" || p.run.SessionKey == sessionKey {
			a := *p.a
			out = append(out, a)
		}
	}
	sortApprovals(out)
	return out
}

// ApprovalSession returns the session key and run id of an open question
// (for channels that must route an answer), or ok false.
func (e *Engine) ApprovalSession(id string) (sessionKey, runID string, ok bool) {
	reg := e.approvals
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if p := reg.open[id]; p != nil {
		return p.run.SessionKey, p.run.ID, true
	}
	return "", "", false
}

func sortApprovals(a []event.Approval) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && (a[j].CreatedAt.Before(a[j-1].CreatedAt) ||
			(a[j].CreatedAt.Equal(a[j-1].CreatedAt) && a[j].ID < a[j-1].ID)); j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

func firstReject(opts []event.ApprovalOption) event.ApprovalOption {
	for _, o := range opts {
		if !o.Allows() {
			return o
		}
	}
	return event.ApprovalOption{Kind: string(runner.RejectOnce)}
}

func newApprovalID() string {
	var b [9]byte
	_, _ = rand.Read(b[:])
	return "ap_" + hex.EncodeToString(b[:])
}

// clip returns s cut to at most n characters (runes), on a rune boundary,
// with "…" when cut; invalid UTF-8 is replaced.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
