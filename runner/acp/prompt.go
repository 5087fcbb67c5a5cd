// One turn's prompt: session/prompt and the agent's requests while it runs
// (permissions, elicitation), the prompt's answer turned into the turn's
// result, and a stopReason worded for the user.

package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
)

// prompt runs session/prompt on session id and serves the turn's
// permission requests until the agent answers, dies or ignores a cancel.
func (r *Runner) prompt(ctx context.Context, turn runner.Turn, cb runner.Callbacks, ag *agent, s *session, log *slog.Logger) (runner.Result, error) {
	id := s.id
	ts := newTurnState(turn.RunID, cb)
	// ctx ends with the turn (ts.end) or the agent: the fs requests of the
	// turn's session stop then.
	ts.ctx, ts.cancel = context.WithCancel(ag.ctx)
	ts.begin(ag.name) // before the prompt is sent: its updates may come at once
	ag.mu.Lock()
	ag.turns[id] = ts
	ag.mu.Unlock()
	askCtx, cancelAsks := context.WithCancel(ctx)
	var asks sync.WaitGroup
	defer func() {
		ts.end()
		if n := ts.ignored(); n > 0 {
			log.Warn("acp: tool calls over the limit of open ones not followed", "count", n, "limit", maxOpenTools)
		}
		ag.mu.Lock()
		if ag.turns[id] == ts {
			delete(ag.turns, id)
		}
		ag.mu.Unlock()
		cancelAsks()
		asks.Wait()
		for {
			select {
			case a := <-ts.perms:
				_ = ag.c.reply(a.id, a.cancelled(), nil)
				a.done()
			default:
				return
			}
		}
	}()

	params := map[string]any{"sessionId": id, "prompt": []map[string]string{{"type": "text", "text": turn.Message}}}
	reqID, respC, err := ag.c.request("session/prompt", params)
	if err != nil {
		log.Warn("acp: session/prompt not sent", "err", err)
		if ag.isDead() {
			return runner.Result{}, &runner.UserError{Message: ag.death}
		}
		r.retire(ag, "cannot write to it")
		return runner.Result{}, &runner.UserError{Message: messages.AgentUnreachable}
	}
	defer ag.c.forget(reqID)

	var (
		ctxDone  = ctx.Done()
		giveUp   <-chan time.Time
		canceled bool
	)
	for {
		select {
		case resp := <-respC:
			text, _ := ts.end()
			return r.finish(ctx, ag, resp, text, log)
		case <-ag.dead:
			select {
			case resp := <-respC: // answered before it died
				text, _ := ts.end()
				return r.finish(ctx, ag, resp, text, log)
			default:
			}
			text, _ := ts.end()
			if canceled {
				return runner.Result{Text: text}, ctx.Err()
			}
			log.Warn("acp: the agent stopped during the turn", "reason", ag.death, "agent_process", ag.n)
			return runner.Result{Text: text}, &runner.UserError{Message: ag.death}
		case a := <-ts.perms:
			asks.Go(func() { r.answer(askCtx, turn, ag, s, a, log) })
		case <-ctxDone:
			ctxDone, canceled = nil, true
			log.Info("acp: turn aborted; sending session/cancel", "session_id", id, "wait", r.cancelWait)
			if err := ag.c.notify("session/cancel", map[string]string{"sessionId": id}); err != nil {
				log.Warn("acp: session/cancel not sent", "err", err)
			}
			t := time.NewTimer(r.cancelWait)
			defer t.Stop()
			giveUp = t.C
		case <-giveUp:
			log.Warn("acp: the agent did not answer session/cancel; stopping it", "after", r.cancelWait, "agent_process", ag.n)
			ag.abandon(reqID, "session/prompt")
			r.retire(ag, "ignored session/cancel")
			text, _ := ts.end()
			return runner.Result{Text: text}, ctx.Err()
		}
	}
}

// finish turns the prompt's answer into the turn's result.
func (r *Runner) finish(ctx context.Context, ag *agent, resp response, text string, log *slog.Logger) (runner.Result, error) {
	res := runner.Result{Text: text}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if resp.err != nil {
		if ag.authRequired(resp.err) {
			return res, &authNeeded{err: resp.err} // promptSigned signs in
		}
		var re *rpcError
		if errors.As(resp.err, &re) {
			log.Warn("acp: session/prompt failed", "code", re.Code, "message", cut(re.Message, 500))
			return res, &runner.UserError{Message: messages.AgentCouldNotAnswer(cut(oneLine(re.Message), 300))}
		}
		if ag.isDead() {
			log.Warn("acp: the agent stopped during the turn", "reason", ag.death, "agent_process", ag.n)
			return res, &runner.UserError{Message: ag.death}
		}
		return res, fmt.Errorf("acp: session/prompt: %w", resp.err)
	}
	var out struct {
		StopReason string `json:"stopReason"`
	}
	if err := json.Unmarshal(resp.result, &out); err != nil {
		log.Warn("acp: session/prompt answer unreadable", "err", err)
		return res, &runner.UserError{Message: messages.AgentAnswerUnreadable}
	}
	if msg := stopMessage(out.StopReason); msg != "" {
		log.Info("acp: turn ended early", "stop_reason", cut(out.StopReason, 50))
		return res, &runner.UserError{Message: msg}
	}
	if strings.TrimSpace(text) == "" {
		// An agent may just stop, say after the person denied its tool: the
		// person reads a sentence, not an empty reply.
		log.Info("acp: turn ended without any text")
		res.Text = messages.AgentNoReply
	}
	return res, nil
}

// stopMessage words a stopReason other than end_turn for the user ("" for
// end_turn).
func stopMessage(reason string) string {
	switch reason {
	case "end_turn":
		return ""
	case "max_tokens":
		return "The agent stopped: it reached its output limit (max tokens) before finishing."
	case "max_turn_requests":
		return "The agent stopped: it reached its limit of model requests for one turn."
	case "refusal":
		return "The agent refused to continue with this request."
	case "cancelled":
		return "The agent cancelled the turn."
	}
	return fmt.Sprintf("The agent stopped early (%s).", cut(oneLine(reason), 50))
}

// answer asks the person a permission request of the agent and replies
// with the chosen option; a stopped turn (ctx done) or a request without
// options is answered cancelled. "Always" answers are the conversation's,
// never the shared agent process's (see grants): a request the
// conversation answered "always" before is answered at once, and the
// agent only ever gets a "once" option.
func (r *Runner) answer(ctx context.Context, turn runner.Turn, ag *agent, s *session, a permissionAsk, log *slog.Logger) {
	defer a.done()
	if a.elicit != nil {
		r.elicit(ctx, turn, ag, a, log)
		return
	}
	if len(a.req.Options) == 0 {
		_ = ag.c.reply(a.id, permissionCancelled(), nil)
		return
	}
	q := question(a.req)
	if opt, ok := s.grants.recall(q); ok {
		log.Info("acp: permission answered by the conversation's earlier \"always\" answer", "tool", q.Tool, "option", opt)
		if err := ag.c.reply(a.id, permissionAnswer(runner.Answer{OptionID: opt}, nil), nil); err != nil {
			log.Warn("acp: permission answer not sent", "err", err)
		}
		return
	}
	q.Options = scopedOptions(q.Options)
	if len(q.Options) == 0 {
		log.Warn("acp: permission request offers only \"always\" options, which would hold for every conversation; answered cancelled", "tool", q.Tool)
		_ = ag.c.reply(a.id, permissionCancelled(), nil)
		return
	}
	ans, err := turn.Ask(ctx, q)
	log.Info("acp: permission answered", "tool", q.Tool, "outcome", ans.Outcome, "option", ans.OptionID, "err", err)
	if err == nil {
		ans.OptionID = s.grants.settle(q, ans.OptionID)
	}
	if err := ag.c.reply(a.id, permissionAnswer(ans, err), nil); err != nil {
		log.Warn("acp: permission answer not sent", "err", err)
	}
}

// elicit asks the person the agent's elicitation/create, when buttons can
// answer it (elicit.go), and sends the agent the answer.
func (r *Runner) elicit(ctx context.Context, turn runner.Turn, ag *agent, a permissionAsk, log *slog.Logger) {
	ea, err := elicitQuestion(*a.elicit)
	if err != nil {
		log.Info("acp: elicitation declined: it cannot be asked in chat", "why", err.Error())
		if err := ag.c.reply(a.id, elicitResponse{Action: "decline"}, nil); err != nil {
			log.Warn("acp: elicitation answer not sent", "err", err)
		}
		return
	}
	ans, err := turn.Ask(ctx, ea.q)
	res := ea.answer(ans, err)
	log.Info("acp: elicitation answered", "action", res.Action, "outcome", ans.Outcome, "option", ans.OptionID, "err", err)
	if err := ag.c.reply(a.id, res, nil); err != nil {
		log.Warn("acp: elicitation answer not sent", "err", err)
	}
}
