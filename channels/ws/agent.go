// The agent and agent.wait methods: a turn answered twice on one request id
// ("accepted", then the outcome), and the waiters that deliver the outcome.

package ws

import (
	"context"
	"encoding/json"
	"time"

	"github.com/turnguard/turnguard/gateway"
)

type agentParams struct {
	Message        *string  `json:"message"`
	IdempotencyKey string   `json:"idempotencyKey"`
	SessionKey     string   `json:"sessionKey"`
	AgentID        string   `json:"agentId"`
	Timeout        *float64 `json:"timeout"` // seconds
}

// agentRun starts a turn and answers twice on the request's id: "accepted"
// at once, then the outcome when the run ends.
func agentRun(c *conn, req request) (any, *rpcError) {
	var p agentParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	if rerr := checkStart(req.Method, p.Message != nil, p.IdempotencyKey); rerr != nil {
		return nil, rerr
	}
	if p.Timeout != nil && !(*p.Timeout >= 0) {
		return nil, invalid("invalid agent params: timeout must be a number of seconds ≥ 0")
	}
	key := p.SessionKey
	if key == "" && p.AgentID != "" {
		key = "agent:" + p.AgentID + ":" + mainKey
	}
	key, rerr := canonicalKey(req.Method, key)
	if rerr != nil {
		return nil, rerr
	}
	if !c.acquireWaiter() {
		return nil, &rpcError{Code: CodeUnavailable, Message: "too many agent calls waiting on this connection", Retryable: true, RetryAfterMs: 1000}
	}
	var timeout time.Duration
	if p.Timeout != nil {
		timeout = time.Duration(min(*p.Timeout, maxWaitMs/1000) * float64(time.Second))
	}
	// The waiter is registered before the turn starts, so the run's end
	// cannot be missed; the bus handler answers it right after the run's
	// terminal chat event (see Server.endAgentWaiters).
	w := &agentWaiter{c: c, id: req.ID}
	c.s.addAgentWaiter(p.IdempotencyKey, w)
	ack, rerr := c.send(req.Method, key, p.IdempotencyKey, *p.Message, timeout)
	if rerr != nil {
		c.s.removeAgentWaiter(p.IdempotencyKey, w)
		c.releaseWaiter()
		return nil, rerr
	}
	c.push(resFrame(req.ID, map[string]any{
		"runId": ack.RunID, "sessionKey": key, "agentId": agentOf(key), "status": "accepted", "acceptedAt": time.Now().UnixMilli(),
	}, nil))
	if ack.Outcome != nil { // a repeated key of a finished run
		c.s.removeAgentWaiter(p.IdempotencyKey, w)
		c.push(agentFinal(req.ID, *ack.Outcome))
		c.releaseWaiter()
		return deferred, nil
	}
	if out, ended := c.s.acceptAgentWaiter(p.IdempotencyKey, w); ended {
		c.push(agentFinal(req.ID, out))
		c.releaseWaiter()
	}
	return deferred, nil
}

// agentWaiter is an agent call waiting for its run's end.
type agentWaiter struct {
	c        *conn
	id       json.RawMessage
	accepted bool             // the "accepted" response is queued
	out      *gateway.Outcome // the run ended before that
}

func (s *Server) addAgentWaiter(runID string, w *agentWaiter) {
	s.runsMu.Lock()
	defer s.runsMu.Unlock()
	s.agentWaits[runID] = append(s.agentWaits[runID], w)
}

func (s *Server) removeAgentWaiter(runID string, w *agentWaiter) {
	s.runsMu.Lock()
	defer s.runsMu.Unlock()
	s.dropWaiterLocked(runID, w)
}

func (s *Server) dropWaiterLocked(runID string, w *agentWaiter) {
	ws := s.agentWaits[runID]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(s.agentWaits, runID)
	} else {
		s.agentWaits[runID] = ws
	}
}

// acceptAgentWaiter records that w's "accepted" response is queued. If the
// run already ended it returns the outcome for the caller to send.
func (s *Server) acceptAgentWaiter(runID string, w *agentWaiter) (gateway.Outcome, bool) {
	s.runsMu.Lock()
	defer s.runsMu.Unlock()
	w.accepted = true
	if w.out == nil {
		return gateway.Outcome{}, false
	}
	s.dropWaiterLocked(runID, w)
	return *w.out, true
}

// endAgentWaiters answers the agent calls waiting for run out.RunID: those
// already accepted get the final response now, the others when their
// handler has queued "accepted".
func (s *Server) endAgentWaiters(out gateway.Outcome) {
	s.runsMu.Lock()
	ws := s.agentWaits[out.RunID]
	var now []*agentWaiter
	for _, w := range ws {
		if w.accepted {
			now = append(now, w)
		} else {
			w.out = &out
		}
	}
	for _, w := range now {
		s.dropWaiterLocked(out.RunID, w)
	}
	s.runsMu.Unlock()
	for _, w := range now {
		w.c.push(agentFinal(w.id, out))
		w.c.releaseWaiter()
	}
}

// agentFinal is the agent method's second response.
func agentFinal(id []byte, out gateway.Outcome) outFrame {
	switch out.Status {
	case gateway.StatusOK:
		return resFrame(id, map[string]any{
			"runId": out.RunID, "status": "ok", "summary": "completed",
			"result": map[string]any{
				"payloads": []map[string]any{{"text": out.Text}},
				"meta":     map[string]any{"durationMs": out.EndedAt.Sub(out.StartedAt).Milliseconds()},
			},
		}, nil)
	case gateway.StatusError:
		return resFrame(id, map[string]any{"runId": out.RunID, "status": "error", "summary": out.Message}, unavailable(out.Message))
	}
	summary := out.Message
	if summary == "" {
		summary = "aborted"
	}
	return resFrame(id, map[string]any{"runId": out.RunID, "status": "timeout", "summary": summary, "stopReason": string(out.StopReason)}, nil)
}

func (c *conn) acquireWaiter() bool {
	if c.waiters.Add(1) > maxWaiters {
		c.waiters.Add(-1)
		return false
	}
	return true
}

func (c *conn) releaseWaiter() { c.waiters.Add(-1) }

type agentWaitParams struct {
	RunID     string `json:"runId"`
	TimeoutMs *int64 `json:"timeoutMs"`
}

func agentWait(c *conn, req request) (any, *rpcError) {
	var p agentWaitParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	if p.RunID == "" {
		return nil, invalid("invalid agent.wait params: runId is required")
	}
	wait := int64(defaultWaitMs)
	if p.TimeoutMs != nil {
		if *p.TimeoutMs < 0 {
			return nil, invalid("invalid agent.wait params: timeoutMs must be ≥ 0")
		}
		wait = min(*p.TimeoutMs, maxWaitMs)
	}
	if !c.acquireWaiter() {
		return nil, &rpcError{Code: CodeUnavailable, Message: "too many agent.wait calls on this connection", Retryable: true, RetryAfterMs: 1000}
	}
	go func() {
		defer c.releaseWaiter()
		ctx, cancel := context.WithTimeout(c.ctx, time.Duration(wait)*time.Millisecond)
		defer cancel()
		out, ok := c.s.eng.Wait(ctx, p.RunID)
		if c.ctx.Err() != nil {
			return
		}
		res := map[string]any{"runId": p.RunID, "status": "timeout"}
		if ok {
			res["status"] = protoStatus(out.Status)
			res["startedAt"], res["endedAt"] = ms(out.StartedAt), ms(out.EndedAt)
			if out.Status != gateway.StatusOK {
				res["stopReason"] = string(out.StopReason)
				res["error"] = out.Message
			}
		}
		c.push(resFrame(req.ID, res, nil))
	}()
	return deferred, nil
}
