package acp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
)

// Sign-in. An agent that lists authMethods at initialize may answer
// session/new or session/prompt with ACP's auth_required error (-32000).
// Then, when agents.acp.authMethod names one of the listed methods, the
// runner calls authenticate with it (bounded by startTimeoutSeconds, one
// at a time per agent process) and, when that succeeds, sends the request
// once more. Otherwise — nothing configured, a method the agent does not
// list, authenticate failing, or auth_required again — the person reads
// messages.AgentSignInNeeded with a reference, and the operator finds a
// WARN line "acp: the agent needs the operator to sign in" with the same
// reference (error_id), the methods the agent lists and the configured
// one. A method of type "terminal" (an interactive login) is never run:
// signing in that way is the operator's action. A -32000 of an agent that
// lists no authMethods is an ordinary error, as before.

// codeAuthRequired is ACP's auth_required error code.
const codeAuthRequired = -32000

// authMethods returns the ids of initialize's authMethods (malformed
// entries skipped, at most 32, ids cut to 128 bytes).
func authMethods(raw json.RawMessage) []string {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return nil
	}
	var ids []string
	for _, m := range list {
		var am struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(m, &am) == nil && am.ID != "" && len(ids) < 32 {
			ids = append(ids, cut(am.ID, 128))
		}
	}
	return ids
}

// authRequired reports whether err is the auth_required answer of an agent
// that lists auth methods.
func (ag *agent) authRequired(err error) bool {
	var re *rpcError
	return len(ag.authIDs) > 0 && errors.As(err, &re) && re.Code == codeAuthRequired
}

// signIn handles an answer err of method: retry when authenticate
// succeeded and the request should be sent once more; a *runner.UserError
// when the agent needs a sign-in turnguard cannot do; (false, nil) when err
// is no auth_required answer.
func (r *Runner) signIn(ctx context.Context, log *slog.Logger, ag *agent, method string, err error) (retry bool, uerr *runner.UserError) {
	if !ag.authRequired(err) {
		return false, nil
	}
	m := r.authMethod
	var authErr error
	switch {
	case m == "":
		authErr = errors.New("agents.acp.authMethod is not set")
	case !slices.Contains(ag.authIDs, m):
		authErr = errors.New("the agent does not list agents.acp.authMethod")
	default:
		ag.authMu.Lock()
		authErr = ag.call(ctx, r.startTimeout, "authenticate", map[string]string{"methodId": m}, nil)
		ag.authMu.Unlock()
		if authErr == nil {
			log.Info("acp: the agent asked for sign-in; authenticated", "method", method, "auth_method", m)
			return true, nil
		}
		if ctx.Err() != nil {
			return false, nil // the turn is over; its caller reports ctx.Err()
		}
	}
	return false, r.signInNeeded(log, ag, method, authErr)
}

// signInNeeded logs what the operator must do and returns the person's
// words, both carrying the same reference.
func (r *Runner) signInNeeded(log *slog.Logger, ag *agent, method string, why error) *runner.UserError {
	var b [4]byte
	_, _ = rand.Read(b[:])
	ref := "auth-" + hex.EncodeToString(b[:])
	log.Warn("acp: the agent needs the operator to sign in", "error_id", ref, "method", method,
		"auth_methods", ag.authIDs, "auth_method", r.authMethod, "err", why, "agent_process", ag.n)
	r.signInChanged(signInNeeded, fmt.Errorf("the ACP agent needs the operator to sign in (%s answered auth_required; agents.acp.authMethod %q: %v; the agent lists %s; reference %s)",
		method, r.authMethod, why, strings.Join(ag.authIDs, ", "), ref))
	return &runner.UserError{Message: messages.AgentSignInNeeded(ref)}
}

// The sign-in states signInAlert was told last.
const (
	signInUnknown int32 = iota // nothing yet
	signInOK                   // a prompt succeeded
	signInNeeded               // a turn failed for a sign-in turnguard cannot do
)

// signInChanged tells signInAlert the state to, with problem when it is
// signInNeeded, unless it was told that state last.
func (r *Runner) signInChanged(to int32, problem error) {
	if r.signInAlert == nil || r.signInState.Swap(to) == to {
		return
	}
	if to == signInNeeded {
		r.signInAlert(problem)
		return
	}
	r.signInAlert(nil)
}

// authNeeded is a prompt's auth_required answer (see finish), handled by
// promptSigned.
type authNeeded struct{ err error }

func (e *authNeeded) Error() string { return "acp: session/prompt: " + e.err.Error() }
func (e *authNeeded) Unwrap() error { return e.err }

// promptSigned is prompt, signing the agent in and sending the prompt once
// more when it answers auth_required (see signIn). The liveness clock is
// paused while authenticate runs (bounded by startTimeoutSeconds).
func (r *Runner) promptSigned(ctx context.Context, turn runner.Turn, cb runner.Callbacks, ag *agent, s *session, log *slog.Logger) (runner.Result, error) {
	res, err := r.prompt(ctx, turn, cb, ag, s, log)
	var an *authNeeded
	if !errors.As(err, &an) {
		if err == nil {
			r.signInChanged(signInOK, nil)
		}
		return res, err
	}
	cb.Pause(messages.AgentSigningIn)
	retry, uerr := r.signIn(ctx, log, ag, "session/prompt", an.err)
	cb.Resume()
	switch {
	case uerr != nil:
		return res, uerr
	case !retry:
		return res, ctx.Err()
	}
	again, err := r.prompt(ctx, turn, cb, ag, s, log)
	again.Text = res.Text + again.Text
	if errors.As(err, &an) {
		return again, r.signInNeeded(log, ag, "session/prompt", errors.New("auth_required again after authenticate"))
	}
	if err == nil {
		r.signInChanged(signInOK, nil)
	}
	return again, err
}
