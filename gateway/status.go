// Session status: the value snapshot of a session's running turn and queue
// (/status, /api/turns), as this replica sees it (Status) and as every
// replica answers it (StatusOf, which asks the owner in cluster mode).

package gateway

import (
	"context"
	"fmt"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/gateway/maintenance"
	"github.com/turnguard/turnguard/timeout"
)

// TurnStatus is a value snapshot of a session: its running turn (if any),
// that turn's limits, and the messages queued behind it. Channels see turns
// only through it.
type TurnStatus struct {
	SessionKey string
	Running    bool           // a turn is active (running, or stopping: Turn.State says)
	Turn       abort.Snapshot // valid when Running
	Limits     timeout.Settings
	// Queue lists every waiting message, oldest first; messages collected
	// into one follow-up turn are listed one by one (that turn's run id is
	// the first one's).
	Queue []QueuedMessage
	// Text is the running turn's reply so far (valid when Running).
	Text string
	// Approvals are the running turn's open questions, oldest first (their
	// run is Turn.RunID): a client that (re)opens the session shows them.
	Approvals []event.Approval `json:",omitempty"`
	// Agent is what the running turn's agent offers the conversation
	// (agentview.go): /help and /mode on another replica read it.
	Agent *AgentView `json:",omitempty"`
}

// Status returns a snapshot of the session's running turn and queue.
func (e *Engine) Status(sessionKey string) TurnStatus {
	e.mu.Lock()
	s, ok := e.sessions[sessionKey]
	var run *abort.Run
	var queue []QueuedMessage
	if ok {
		run = s.active
		for _, q := range s.queue {
			queue = append(queue, q.msgs...)
		}
	}
	e.mu.Unlock()
	st := TurnStatus{SessionKey: sessionKey, Queue: queue}
	if run != nil {
		st.Running, st.Turn, st.Limits = true, e.snapshot(run), run.Settings
		st.Text = run.Text()
		st.Approvals = e.PendingApprovals(sessionKey)
		st.Agent = e.agentView(run.Channel, sessionKey)
	}
	return st
}

// statusPatience bounds StatusOf's questions to the cluster: a history
// answer waits no longer for an owner that does not answer (stopped, or
// unreachable).
const statusPatience = 3 * time.Second

// StatusOf is Status as every replica answers it (issue 20, "one view
// from every replica"): in cluster mode a session that runs nothing here
// is asked of the replica that runs its turn (Cluster.Holder, then
// Cluster.ForwardStatus), where its queue and open questions live too.
// Without a cluster, or when the session's turn or queue is here, it is
// Status. When the cluster cannot be asked (the database or the owner
// does not answer within statusPatience) it returns this replica's Status
// with an *UnavailableError: the caller decides whether an idle answer would be
// a lie.
func (e *Engine) StatusOf(ctx context.Context, sessionKey string) (TurnStatus, error) {
	st := e.Status(sessionKey)
	if e.cluster == nil || st.Running || len(st.Queue) > 0 {
		return st, nil
	}
	ctx, cancel := context.WithTimeout(ctx, statusPatience)
	defer cancel()
	_, replica, ok, err := e.cluster.Holder(ctx, sessionKey)
	if err != nil {
		return st, &UnavailableError{Cause: fmt.Errorf("who runs session %q: %w", sessionKey, err)}
	}
	if !ok || replica == e.cluster.Replica() {
		return st, nil
	}
	remote, err := e.cluster.ForwardStatus(ctx, replica, sessionKey)
	if err != nil {
		return st, &UnavailableError{Cause: fmt.Errorf("status of session %q on replica %s: %w", sessionKey, replica, err)}
	}
	return remote, nil
}

// snapshot is r's Snapshot with its stall class (Snapshot.Class).
func (e *Engine) snapshot(r *abort.Run) abort.Snapshot {
	s := r.Snapshot()
	s.Class = e.classOf(r).String()
	return s
}

// classOf is what r is doing now — working, long-running, stalled or stuck
// — as the deadline scheduler sees it: the class maintenance.Decide gives
// with its decision, from the same deadlines and the policy in force.
func (e *Engine) classOf(r *abort.Run) maintenance.Class {
	return maintenance.Decide(e.reg.Now(), r.View(), e.sched.Policy()).Class
}

// TurnClasses counts this replica's live turns by stall class (every class
// present, 0 when none), for the metrics and /api/turns.
func (e *Engine) TurnClasses() map[string]int {
	out := make(map[string]int, len(maintenance.Classes))
	for _, c := range maintenance.Classes {
		out[c.String()] = 0
	}
	for _, r := range e.reg.Runs() {
		out[e.classOf(r).String()]++
	}
	return out
}
