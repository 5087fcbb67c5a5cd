package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/turnguard/turnguard/event"
)

// Attribute keys of the turn spans.
const (
	AttrRunID       = "turnguard.run_id"
	AttrSession     = "turnguard.session"
	AttrChannel     = "turnguard.channel"
	AttrRunner      = "turnguard.runner"
	AttrQueuedMs    = "turnguard.queue_wait_ms"
	AttrStopReason  = "turnguard.stop_reason"
	AttrErrorID     = "turnguard.error_id"
	AttrPausedMs    = "turnguard.paused_ms"
	AttrSteps       = "turnguard.steps"
	AttrStepKind    = "turnguard.step.kind"
	AttrStepName    = "turnguard.step.name"
	AttrStepSeq     = "turnguard.step.seq"
	AttrStepAborted = "turnguard.step.aborted"
	AttrElapsedMs   = "turnguard.elapsed_ms"
	AttrLimitMs     = "turnguard.limit_ms"
	AttrApprovalID  = "turnguard.approval.id"
	AttrTool        = "turnguard.approval.tool"
	AttrOutcome     = "turnguard.approval.outcome"
	AttrOptionKind  = "turnguard.approval.option_kind"
	AttrBy          = "turnguard.approval.by"
	AttrReason      = "turnguard.reason"
	AttrLeftMs      = "turnguard.left_ms"
	AttrRunnerTold  = "turnguard.runner_told"
	AttrFallbackTo  = "turnguard.fallback.to" // the model a fallback event moved the turn to
)

// turnSpans is one run's tracing state, in the run's Locals (event.Local):
// only the handler of the run's events touches it, one event at a time.
type turnSpans struct {
	ctx      context.Context // carries the root span
	root     trace.Span
	step     trace.Span // the open step span; nil between steps
	steps    int
	pausedAt time.Time // zero unless paused
	// held: the runner paused (Paused … Resumed); asking: open questions
	// to the person (ApprovalRequested … ApprovalResolved). The turn is
	// paused while either holds, as the engine's liveness clock is.
	held       bool
	asking     int
	stepPaused time.Duration
	turnPaused time.Duration
	ended      bool // the root has ended (Aborted); ForceFinalized may follow
}

var slot = event.NewLocal[turnSpans]()

// IsError reports whether a turn that stopped for r is an error in its
// trace: any stop but a normal finish, the user's stop and a supersession.
func IsError(r event.StopReason) bool {
	switch r {
	case event.ReasonStop, event.ReasonUser, event.ReasonSuperseded, event.ReasonNone:
		return false
	}
	return true
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// Handle is the bus handler (subscribe it for all sessions). It never
// blocks: spans are handed to the SDK's processor, which exports on its own
// goroutine. Events without a run (SessionReset) and events of a run whose
// TurnStarted it did not see (subscribed late) are ignored.
func (t *Tracer) Handle(ev event.Event) {
	if ev.Kind == event.TurnStarted {
		t.start(ev)
		return
	}
	s := slot.Get(ev)
	if s == nil {
		return
	}
	at := trace.WithTimestamp(ev.Time)
	switch ev.Kind {
	case event.StepStarted:
		s.endStep(ev.Time, false)
		start := ev.Step.StartedAt
		if start.IsZero() {
			start = ev.Time
		}
		_, s.step = t.tracer.Start(s.ctx, ev.Step.Label(), trace.WithTimestamp(start),
			trace.WithAttributes(attribute.String(AttrStepKind, ev.Step.Kind), attribute.String(AttrStepName, ev.Step.Name),
				attribute.Int64(AttrStepSeq, int64(ev.Step.Seq))))
		s.steps++
		s.stepPaused = 0
		if !s.pausedAt.IsZero() { // a step started while paused: its pause counts from here
			s.pausedAt = ev.Time
		}
	case event.StepCompleted:
		s.endStep(ev.Time, false)
	case event.Paused:
		s.held = true
		s.pause(ev.Time)
		s.root.AddEvent("paused", at, trace.WithAttributes(attribute.String(AttrReason, ev.Text)))
	case event.Resumed:
		s.held = false
		if s.asking == 0 {
			s.resume(ev.Time)
		}
		s.root.AddEvent("resumed", at)
	case event.Progress:
		s.root.AddEvent("progress", at, trace.WithAttributes(attribute.String(AttrStepName, ev.Step.Label()),
			attribute.Int64(AttrElapsedMs, ms(ev.Elapsed))))
	case event.BudgetWarning:
		// The budget warning: how long was left, and whether the runner
		// took the gateway's note (runners that steer do).
		s.root.AddEvent("budget_warning", at, trace.WithAttributes(attribute.String(AttrStepName, ev.Step.Label()),
			attribute.Int64(AttrElapsedMs, ms(ev.Elapsed)), attribute.Int64(AttrLeftMs, ms(ev.Limit)),
			attribute.Bool(AttrRunnerTold, ev.Text != "")))
	case event.Recovered:
		s.root.AddEvent("recovered", at, trace.WithAttributes(attribute.String(AttrStepName, ev.Step.Label())))
	case event.Fallback:
		s.root.AddEvent("fallback", at, trace.WithAttributes(attribute.String(AttrStepName, ev.Step.Label()),
			attribute.String(AttrFallbackTo, ev.Text)))
	case event.ApprovalRequested, event.ApprovalResolved:
		if ev.Kind == event.ApprovalRequested {
			s.asking++
			s.pause(ev.Time)
		} else if s.asking > 0 {
			s.asking--
			if s.asking == 0 && !s.held {
				s.resume(ev.Time)
			}
		}
		attrs := []attribute.KeyValue{}
		if a := ev.Approval; a != nil {
			attrs = append(attrs, attribute.String(AttrApprovalID, a.ID), attribute.String(AttrTool, a.Tool))
			if ev.Kind == event.ApprovalResolved {
				attrs = append(attrs, attribute.String(AttrOutcome, a.Outcome), attribute.String(AttrOptionKind, a.OptionKind),
					attribute.String(AttrBy, a.By))
			}
		}
		s.root.AddEvent(ev.Kind.String(), at, trace.WithAttributes(attrs...))
	case event.Aborted:
		if s.ended {
			return
		}
		attrs := []attribute.KeyValue{attribute.String(AttrStopReason, string(ev.StopReason)),
			attribute.Int64(AttrElapsedMs, ms(ev.Elapsed))}
		if ev.Limit > 0 {
			attrs = append(attrs, attribute.Int64(AttrLimitMs, ms(ev.Limit)))
		}
		if !ev.Step.IsZero() {
			attrs = append(attrs, attribute.String(AttrStepName, ev.Step.Label()))
		}
		s.root.AddEvent("aborted", at, trace.WithAttributes(attrs...))
		s.end(ev)
	case event.Finished:
		if s.ended {
			return
		}
		if ev.ErrorID != "" {
			s.root.SetAttributes(attribute.String(AttrErrorID, ev.ErrorID))
		}
		s.end(ev)
		slot.Set(ev, nil)
	case event.ForceFinalized:
		// The runner ignored the abort past the grace period: a short
		// child of the (usually ended) root says so.
		start := ev.Time.Add(-ev.Elapsed)
		_, sp := t.tracer.Start(s.ctx, "force_finalized", trace.WithTimestamp(start),
			trace.WithAttributes(attribute.String(AttrStopReason, string(ev.StopReason)), attribute.String(AttrStepName, ev.Step.Label())))
		sp.SetStatus(codes.Error, "the runner ignored the abort")
		sp.End(at)
		slot.Set(ev, nil)
	}
}

// start opens the root span of a turn at its TurnStarted. Whether the turn
// is traced is decided here, once: a root the sampler dropped does not
// record, its children would not either, so nothing is kept for the turn
// (its slot stays empty) and its later events cost Handle one slot lookup
// each, no span and no allocation. The attributes are built only for a
// root that records (the sampler, a trace id ratio, does not read them).
func (t *Tracer) start(ev event.Event) {
	ctx := context.WithValue(context.Background(), runIDKey{}, ev.RunID)
	ctx, root := t.tracer.Start(ctx, "turn", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(ev.Time))
	if !root.IsRecording() {
		slot.Set(ev, nil)
		return
	}
	root.SetAttributes(
		attribute.String(AttrRunID, ev.RunID), attribute.String(AttrSession, ev.SessionKey),
		attribute.String(AttrChannel, ev.Channel), attribute.String(AttrRunner, ev.Runner),
		attribute.Int64(AttrQueuedMs, ms(ev.Queued)),
	)
	slot.Set(ev, &turnSpans{ctx: ctx, root: root})
}

// resume ends a pause at now, adding it to the step's and the turn's.
// pause starts counting paused time at now, unless it already is.
func (s *turnSpans) pause(now time.Time) {
	if s.pausedAt.IsZero() {
		s.pausedAt = now
	}
}

func (s *turnSpans) resume(now time.Time) {
	if s.pausedAt.IsZero() {
		return
	}
	d := max(0, now.Sub(s.pausedAt))
	s.pausedAt = time.Time{}
	s.turnPaused += d
	if s.step != nil {
		s.stepPaused += d
	}
}

// endStep ends the open step span at now, if any.
func (s *turnSpans) endStep(now time.Time, aborted bool) {
	if s.step == nil {
		return
	}
	// A pause that goes on past the step: the step gets its share, the
	// turn stays paused from now.
	paused := !s.pausedAt.IsZero()
	s.resume(now)
	if paused {
		s.pausedAt = now
	}
	s.step.SetAttributes(attribute.Int64(AttrPausedMs, ms(s.stepPaused)))
	if aborted {
		s.step.SetAttributes(attribute.Bool(AttrStepAborted, true))
	}
	s.step.End(trace.WithTimestamp(now))
	s.step, s.stepPaused = nil, 0
}

// end ends the turn at its terminal event ev.
func (s *turnSpans) end(ev event.Event) {
	s.endStep(ev.Time, ev.Kind == event.Aborted)
	s.resume(ev.Time)
	s.root.SetAttributes(attribute.String(AttrStopReason, string(ev.StopReason)),
		attribute.Int64(AttrPausedMs, ms(s.turnPaused)), attribute.Int(AttrSteps, s.steps))
	if IsError(ev.StopReason) {
		s.root.SetStatus(codes.Error, string(ev.StopReason))
	}
	s.root.End(trace.WithTimestamp(ev.Time))
	s.ended = true
}
