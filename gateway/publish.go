// The publish pipeline: the single exit of a turn's events. publish
// renders an event's user-facing notice (messages/), records a terminal
// event's outcome and history (refused ones, in cluster mode, record
// nothing) and hands the event to the bus and the exporter. Also the
// recording of failed turns: redacted, kept under an error id for
// operators, never shown to a user.

package gateway

import (
	"errors"
	"fmt"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/errlog"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
)

// errorRingSize is how many failures the engine keeps for /api/errors.
const errorRingSize = 256

// operatorDetailer is an error that carries more for operators than its
// message (runner/exec's ExitError: the agent's last stderr lines). The
// detail goes to the log and the error ring, never to the user.
type operatorDetailer interface{ OperatorDetail() string }

// failure records a failed turn. A runner.UserError's message was written
// for the user and is returned as userText, to be shown as is (secrets
// redacted). Anything else — an error chain that may hold stderr lines or a
// secret, a panic — is kept under a fresh error id, with the configuration's
// secrets and credential-shaped values redacted, in the log and the error
// ring (GET /api/errors); the user reads only the id, in the error notice
// rendered at publish.
func (e *Engine) failure(t *turn, err error, panicked any, stack []byte) (userText, errorID string) {
	run := t.run
	red := errlog.NewRedactor(e.cfg.Current().Secrets())
	if u, ok := runner.AsUserError(err); ok && panicked == nil {
		e.log.Info("turn failed with a message for the user", "run", run.ID, "session", run.SessionKey)
		return red.Redact(u.Message), "" // written for the user, but never with a secret in it
	}
	cur, _ := run.CurrentStep()
	rec := errlog.Record{
		ID: errlog.NewID(), Time: time.Now(), RunID: run.ID, SessionKey: run.SessionKey, Channel: run.Channel,
		Runner: t.runner, Step: cur.Label(), Error: err.Error(), Chain: errlog.Chain(err),
	}
	var d operatorDetailer
	if errors.As(err, &d) {
		rec.Detail = d.OperatorDetail()
	}
	if panicked != nil {
		rec.Panic, rec.Stack = fmt.Sprint(panicked), string(stack)
	}
	rec = red.RedactRecord(rec)
	e.errs.Add(rec)
	attrs := []any{"errorId", rec.ID, "run", run.ID, "session", run.SessionKey, "runner", rec.Runner, "err", rec.Error}
	if rec.Detail != "" {
		attrs = append(attrs, "detail", rec.Detail)
	}
	if panicked != nil {
		attrs = append(attrs, "panic", rec.Panic, "stack", rec.Stack)
	}
	e.log.Error("turn failed", attrs...)
	return "", rec.ID
}

// Errors returns the recent turn failures, newest first, secrets redacted
// (for operators only: never show them to a user).
func (e *Engine) Errors() []errlog.Record { return e.errs.List() }

// ErrorDetail returns the failure with error id id.
func (e *Engine) ErrorDetail(id string) (errlog.Record, bool) { return e.errs.Get(id) }

// publish is the single exit of events: it records terminal outcomes and
// history, then hands the event to the bus. Called through
// abort.Run.Publish, which serialises one run's events, so they arrive in
// order (a terminal event without the run's lock: recording it may retry). By the time
// any subscriber sees a terminal event, its outcome is recorded and (once
// the runner returned) the session is free: a client that answers a final
// reply at once is never told the session is busy.
//
// Lock contract: called without e.mu, through the run's Publish; it
// takes e.mu only in separate short steps (messagesOf, recordOutcome,
// ended), never across a call to the bus or the cluster.
func (e *Engine) publish(ev event.Event) {
	if ev.Kind == event.BudgetWarning {
		e.warnRunner(&ev)
	}
	if ev.Message == "" && messages.Wordy(&ev) {
		ev.Message = messages.Render(e.messagesOf(ev.RunID), ev)
	}
	if ev.Kind == event.ForceFinalized {
		// released held the session's queue back for this event (see
		// heldForFinalize): the next queued turn starts after it.
		e.bus.Publish(ev)
		e.export(ev)
		e.mu.Lock()
		s := e.heldForFinalize[ev.RunID]
		delete(e.heldForFinalize, ev.RunID)
		e.mu.Unlock()
		if s != nil {
			e.ended(nil, s)
		}
		return
	}
	if !ev.Kind.Terminal() {
		e.bus.Publish(ev)
		e.export(ev)
		return
	}
	refused := e.cluster != nil && !e.finishClaimed(ev)
	t, s := e.recordOutcome(ev, !refused)
	e.settle(t)
	if !refused {
		e.bus.Publish(ev)
		e.export(ev)
	}
	e.ended(t, s)
}

// messagesOf returns the message texts of live turn runID (those in force
// when it started), or the current ones.
//
// Lock contract: called without e.mu; it takes it once.
func (e *Engine) messagesOf(runID string) *messages.Set {
	e.mu.Lock()
	t := e.turns[runID]
	e.mu.Unlock()
	if t != nil && t.msgs != nil {
		return t.msgs
	}
	return e.cfg.Current().MessageSet()
}

// recordOutcome records a terminal event in the history and the outcome
// cache and returns the live turn it ends (nil if none) and the session,
// whose ending count it raised (nil if the session is not in memory): the
// caller calls ended once the event is published. owned false: the cluster
// refused the ending (this replica lost the turn: a survivor records it as
// interrupted), so nothing of it is recorded here — no history message, no
// cached outcome a repeated run id or Wait would answer from; the turn is
// only brought to its end (issue 20, defect 6).
//
// Lock contract: called without e.mu (by publish); it takes it once, for
// all its records.
func (e *Engine) recordOutcome(ev event.Event, owned bool) (*turn, *session) {
	cfg := e.cfg.Current()
	out := Outcome{RunID: ev.RunID, SessionKey: ev.SessionKey, StopReason: ev.StopReason, Text: ev.FullText,
		Message: ev.Message, EndedAt: ev.Time}
	var msgs []Message
	switch {
	case ev.Kind == event.Aborted:
		out.Status = StatusAborted
		if ev.FullText != "" {
			// The partial reply carries no stop reason: the notice after it
			// does, so a client counting notices by stop reason finds one.
			msgs = append(msgs, Message{RunID: ev.RunID, Role: "assistant", Text: ev.FullText, Time: ev.Time})
		}
		msgs = append(msgs, Message{RunID: ev.RunID, Role: "assistant", Text: ev.Message, StopReason: ev.StopReason, Time: ev.Time})
	case ev.StopReason == event.ReasonError:
		out.Status = StatusError
		msgs = append(msgs, Message{RunID: ev.RunID, Role: "assistant", Text: ev.Message, StopReason: ev.StopReason, Time: ev.Time})
	default:
		out.Status = StatusOK
		msgs = append(msgs, Message{RunID: ev.RunID, Role: "assistant", Text: ev.FullText, StopReason: ev.StopReason, Time: ev.Time})
	}
	ttl := time.Duration(cfg.Server.IdempotencyTTLSeconds * float64(time.Second))
	e.mu.Lock()
	defer e.mu.Unlock()
	t, live := e.turns[ev.RunID]
	if live && turnState(t.state.Load()) != turnForced { // forced: already free, its ending was on its way
		e.move(t, turnEnding)
	}
	s, ok := e.sessions[ev.SessionKey]
	if ok {
		// A turn of the conversation before a /new ends in that one: its
		// reply is not written to the fresh history (nor read by the next
		// turn's runner).
		if owned && (!live || t.sessionID == s.id) {
			for _, m := range msgs {
				e.appendHistoryLocked(s, m, cfg.Server.HistoryLimit)
			}
			s.updated = ev.Time
		}
		s.ending++
	}
	if !owned {
		if live {
			t.lost = true
		}
		return t, s
	}
	var aliases []string
	if live {
		out.StartedAt = t.run.StartedAt()
		t.out = out
		aliases = t.aliases
	}
	e.purgeExpired(ev.Time)
	e.outcomes[ev.RunID] = e.expiry.PushBack(&cached{out: out, expires: ev.Time.Add(ttl), aliases: aliases})
	return t, s
}
