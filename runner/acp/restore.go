// A conversation's agent session: opening it (session/new), restoring the
// one the SessionStore recorded (session/resume or session/load), claiming
// its id against the other live conversations, recording it, and closing
// the session a new conversation replaced (session/close).

package acp

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
)

// open gives the fresh session s of conversation conv (of session key key)
// its agent session. The one the store recorded for the key is restored
// when it is this conversation's — recorded for conv, or for another
// SessionID while the conversation continues (its history is not empty:
// the engine's SessionIDs change with a gateway restart): session/resume
// when the agent advertises sessionCapabilities.resume, else session/load
// when it advertises loadSession (the history that session/load replays as
// session/update notifications reaches no turn — none runs on the session
// yet — so it is dropped). Otherwise, or when restoring fails, session/new
// opens a new one, which the store records; lost then reports that the
// conversation had a session the agent could not restore. The session of
// the key's previous conversation (after /new, a new SessionID with no
// history: gone, or the one the store recorded for another conversation)
// is closed with session/close when the agent advertises
// sessionCapabilities.close.
func (r *Runner) open(ctx context.Context, log *slog.Logger, key, conv string, continues bool, ag *agent, s *session, gone *session) (lost bool, err error) {
	prevConv, prevID := r.recorded(ctx, log, key)
	ours := prevID != "" && (prevConv == conv || continues)
	if gone != nil && gone.ag == ag && gone.id != "" && !continues {
		r.closeSession(ctx, ag, gone.id, log)
	}
	if prevID != "" && !ours && (gone == nil || gone.id != prevID) {
		r.closeSession(ctx, ag, prevID, log)
	}
	if ours {
		if method := ag.caps.restore(); method == "" {
			log.Info("acp: the agent cannot load or resume sessions; the conversation gets a new one", "session_id", cut(prevID, 200))
		} else {
			var restored json.RawMessage
			err := ag.call(ctx, r.startTimeout, method, map[string]any{"sessionId": prevID, "cwd": r.dir, "mcpServers": []any{}}, &restored)
			if err == nil && r.claim(ag, s, prevID) {
				ag.keepModes(s.id, restored)
				ag.keepConfigOptions(s.id, restored)
				log.Info("acp: session restored", "method", method, "session_id", s.id, "conversation", conv, "agent_process", ag.n)
				if prevConv != conv {
					r.record(ctx, log, key, conv, s.id)
				}
				return false, nil
			}
			if err == nil {
				err = errors.New("acp: the session is another live conversation's")
			}
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			if ag.isDead() {
				return false, &runner.UserError{Message: ag.death}
			}
			var te *timeoutError
			if errors.As(err, &te) {
				r.retire(ag, method+" unanswered")
				return false, startFailure(method, err)
			}
			log.Warn("acp: the agent could not restore the conversation's session; it gets a new one",
				"method", method, "session_id", cut(prevID, 200), "err", err)
		}
		lost = true
	}

	var res struct {
		SessionID string `json:"sessionId"`
	}
	var answer json.RawMessage
	err = ag.call(ctx, r.startTimeout, "session/new", map[string]any{"cwd": r.dir, "mcpServers": []any{}}, &answer)
	if err == nil {
		err = json.Unmarshal(answer, &res)
	}
	if retry, uerr := r.signIn(ctx, log, ag, "session/new", err); uerr != nil {
		return false, uerr
	} else if retry {
		err = ag.call(ctx, r.startTimeout, "session/new", map[string]any{"cwd": r.dir, "mcpServers": []any{}}, &answer)
		if err == nil {
			err = json.Unmarshal(answer, &res)
		}
		if ag.authRequired(err) {
			return false, r.signInNeeded(log, ag, "session/new", errors.New("auth_required again after authenticate"))
		}
	}
	if err == nil && res.SessionID == "" {
		err = errors.New("acp: session/new answered no sessionId")
	}
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		log.Warn("acp: session/new failed", "err", err, "agent_process", ag.n)
		var te *timeoutError
		if errors.As(err, &te) {
			r.retire(ag, "session/new unanswered")
		}
		if ag.isDead() {
			return false, &runner.UserError{Message: ag.death}
		}
		return false, startFailure("session/new", err)
	}
	if !r.claim(ag, s, res.SessionID) {
		log.Error("acp: session/new answered the sessionId of another live conversation; turn refused",
			"session_id", cut(res.SessionID, 200), "agent_process", ag.n)
		return false, &runner.UserError{Message: messages.AgentForeignSession}
	}
	ag.keepModes(s.id, answer)
	ag.keepConfigOptions(s.id, answer)
	log.Info("acp: session opened", "session_id", s.id, "conversation", conv, "agent_process", ag.n)
	r.record(ctx, log, key, conv, s.id)
	return lost, nil
}

// claim gives s the agent's session id, unless another live conversation
// on ag already has it (an agent that answers with it again would mix the
// two).
func (r *Runner) claim(ag *agent, s *session, id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tab.held(ag, id) {
		return false
	}
	s.id = id
	return true
}

// recorded returns the conversation and agent session id the store
// recorded for session key key ("", "" without a store, or when reading
// fails: the conversation then gets a new session).
func (r *Runner) recorded(ctx context.Context, log *slog.Logger, key string) (conv, id string) {
	if r.sessions == nil {
		return "", ""
	}
	ctx, cancel := context.WithTimeout(ctx, r.startTimeout)
	defer cancel()
	conv, id, err := r.sessions.AgentSession(ctx, key)
	if err != nil {
		log.Warn("acp: the conversation's agent session could not be read; it gets a new one", "err", err)
		return "", ""
	}
	return conv, id
}

// record stores id as the agent session of conversation conv of key; a
// failure is logged (the conversation keeps its session while the agent
// runs, and gets a new one after a restart).
func (r *Runner) record(ctx context.Context, log *slog.Logger, key, conv, id string) {
	if r.sessions == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.startTimeout)
	defer cancel()
	if err := r.sessions.SetAgentSession(ctx, key, conv, id); err != nil {
		log.Warn("acp: the conversation's agent session was not recorded", "err", err)
	}
}

// closeSession sends session/close for id, when the agent advertises it
// and no live conversation on ag has the session; the answer is awaited
// (bounded by the start-up timeout) so that the old session's work stops
// before the new one starts, and a failure is only logged.
func (r *Runner) closeSession(ctx context.Context, ag *agent, id string, log *slog.Logger) {
	if !ag.caps.close {
		return
	}
	r.mu.Lock()
	held := r.tab.held(ag, id)
	r.mu.Unlock()
	if held {
		return
	}
	err := ag.call(ctx, r.startTimeout, "session/close", map[string]string{"sessionId": id}, nil)
	ag.meta.forget(id)
	log.Info("acp: old session closed (a new conversation replaced it)", "session_id", cut(id, 200), "err", err)
}
