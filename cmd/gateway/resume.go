package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/ops/metrics"
	"github.com/turnguard/turnguard/store"
)

// resumeStore is what deciding and queueing a resumed attempt reads and
// writes: the attempt's record and message, and the person's text.
type resumeStore interface {
	store.Resumes
	UserText(ctx context.Context, runID string) (string, error)
}

// planResume decides whether the turn t, cut off by a restart or a
// takeover, is dispatched again (agents.defaults.resume), and returns its
// next attempt's record and message with true when it is. prev is t's own
// record (found false: t was a first attempt), text the person's message.
// It is not resumed when resume is off, t was its turn's last attempt, its
// first attempt started more than maxAgeSeconds before now, or the text
// is unknown. The next attempt asks the person first (Confirm) when t was
// cut off in a tool call. The result depends on its arguments only, so a
// recovery cut off and run again plans the same attempt (same run id).
func planResume(rc config.Resume, t store.Turn, prev store.Resume, found bool, text string, now time.Time) (store.Resume, store.QueuedMessage, bool) {
	origin, started, attempt := t.RunID, t.StartedAt, 1
	if found {
		origin, started, attempt = prev.OriginRunID, prev.OriginStartedAt, prev.Attempt
	}
	maxAge := time.Duration(rc.MaxAgeSeconds * float64(time.Second))
	if !rc.Enabled || attempt >= rc.MaxAttempts || now.Sub(started) > maxAge || text == "" {
		return store.Resume{}, store.QueuedMessage{}, false
	}
	step := event.Step{Kind: t.CurrentStep.Kind, Name: t.CurrentStep.Name}
	next := store.Resume{RunID: store.ResumeRunID(origin, attempt+1), PrevRunID: t.RunID, OriginRunID: origin, SessionKey: t.SessionKey,
		Attempt: attempt + 1, Step: step, Confirm: step.Kind == event.StepTool, OriginStartedAt: started, CreatedAt: now}
	// Queued at its predecessor's start: it goes before what waited behind it.
	m := store.QueuedMessage{RunID: next.RunID, SessionKey: t.SessionKey, Channel: t.Channel, ChatRef: t.ChatRef,
		Owner: t.Sender, Text: text, QueuedAt: t.StartedAt}
	return next, m, true
}

// resumeOutcome names planResume's decision (prev, found: the cut-off
// turn's own record; next, ok: its result) for the resume_decisions_total
// metric: asked, resumed, exhausted (the cut-off attempt was its turn's
// last) or skipped (too old, or its message unknown).
func resumeOutcome(rc config.Resume, prev store.Resume, found bool, next store.Resume, ok bool) string {
	attempt := 1
	if found {
		attempt = prev.Attempt
	}
	switch {
	case ok && next.Confirm:
		return metrics.ResumeAsked
	case ok:
		return metrics.ResumeResumed
	case attempt >= rc.MaxAttempts:
		return metrics.ResumeExhausted
	}
	return metrics.ResumeSkipped
}

// resumeTurn queues the next attempt of the cut-off turn t when planResume
// says so, and returns the notice that ends t: messages.Resuming or
// messages.ResumeAsk when an attempt is queued, interrupted otherwise (resume off,
// attempts used, too old, or a store failure — logged). With resume on,
// count (nil: none) is told the decision's outcome (resumeOutcome; a store
// failure is skipped).
func resumeTurn(ctx context.Context, st resumeStore, cfg *config.Config, t store.Turn, interrupted string, log *slog.Logger,
	count func(outcome string)) string {
	rc := cfg.Agents.Defaults.Resume
	if !rc.Enabled {
		return interrupted
	}
	if count == nil {
		count = func(string) {}
	}
	prev, err := st.Resume(ctx, t.RunID)
	found := err == nil
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		log.Error("store: cannot read an interrupted turn's attempts; it is not resumed", "run", t.RunID, "error", err)
		count(metrics.ResumeSkipped)
		return interrupted
	}
	text, err := st.UserText(ctx, t.RunID)
	if err != nil {
		log.Warn("store: an interrupted turn's message is not kept; it is not resumed", "run", t.RunID, "error", err)
		count(metrics.ResumeSkipped)
		return interrupted
	}
	next, m, ok := planResume(rc, t, prev, found, text, time.Now())
	if !ok {
		count(resumeOutcome(rc, prev, found, next, ok))
		return interrupted
	}
	if err := st.QueueResume(ctx, next, m); err != nil {
		log.Error("store: cannot queue an interrupted turn's next attempt; it ends as interrupted", "run", t.RunID, "error", err)
		count(metrics.ResumeSkipped)
		return interrupted
	}
	count(resumeOutcome(rc, prev, found, next, ok))
	log.Warn("turn interrupted by the last stop is resumed", "run", t.RunID, "attempt", next.Attempt,
		"next_run", next.RunID, "ask_first", next.Confirm)
	return resumingNotice(next, rc)
}

// resumingNotice is the notice that ends an attempt whose next attempt
// next is queued: it asks first (a tool call) or resumes at once.
func resumingNotice(next store.Resume, rc config.Resume) string {
	if next.Confirm {
		return messages.ResumeAsk(next.Step)
	}
	return messages.Resuming(next.Step, next.Attempt, rc.MaxAttempts)
}

// takeoverResume is pgcoord's Options.Resume: a turn a dead replica was
// running is resumed as the start-up recovery resumes one (planResume),
// with agents.defaults.resume as it is at the takeover. With resume on,
// count is told each decision's outcome (resumeOutcome).
func takeoverResume(cfg *config.Source, count func(outcome string)) func(store.Turn, store.Resume, bool, string) (store.Resume, store.QueuedMessage, string, bool) {
	return func(t store.Turn, prev store.Resume, found bool, text string) (store.Resume, store.QueuedMessage, string, bool) {
		rc := cfg.Current().Agents.Defaults.Resume
		next, m, ok := planResume(rc, t, prev, found, text, time.Now())
		if rc.Enabled {
			count(resumeOutcome(rc, prev, found, next, ok))
		}
		if !ok {
			return store.Resume{}, store.QueuedMessage{}, "", false
		}
		return next, m, resumingNotice(next, rc), true
	}
}

// resumeOf is the gateway's mark of a restored queued message that is a
// resumed attempt (nil for any other message).
func resumeOf(ctx context.Context, st store.Resumes, cfg *config.Source, runID string) (*gateway.Resume, error) {
	r, err := st.Resume(ctx, runID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("queued run %q: %w", runID, err)
	}
	return &gateway.Resume{Attempt: r.Attempt, MaxAttempts: max(cfg.Current().Agents.Defaults.Resume.MaxAttempts, r.Attempt),
		Step: r.Step, Confirm: r.Confirm}, nil
}
