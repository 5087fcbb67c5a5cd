package tracing

import (
	"context"
	"log/slog"
)

// LogKeyRun is the attribute under which the gateway logs a run id; LogKeyTraceID
// the one LogHandler adds with the turn's trace id.
const (
	LogKeyRun     = "run"
	LogKeyTraceID = "trace_id"
)

// LogHandler wraps h so that every record about a turn — one with a string
// attribute "run" at its top level, in the record or added by Logger.With —
// also carries "trace_id", the turn's TraceID, so a log line leads to its
// trace. Records without a run id pass through unchanged.
func LogHandler(h slog.Handler) slog.Handler { return &logHandler{inner: h} }

type logHandler struct {
	inner   slog.Handler
	hasRun  bool // a "run" was added by WithAttrs (trace_id with it)
	grouped bool // after WithGroup: the record's attributes are not top-level
}

func (h *logHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *logHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.hasRun || h.grouped {
		return h.inner.Handle(ctx, r)
	}
	var runID string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == LogKeyRun && a.Value.Kind() == slog.KindString {
			runID = a.Value.String()
			return false
		}
		return true
	})
	if runID != "" {
		r = r.Clone()
		r.AddAttrs(slog.String(LogKeyTraceID, TraceIDString(runID)))
	}
	return h.inner.Handle(ctx, r)
}

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := *h
	if !h.grouped && !h.hasRun {
		for _, a := range attrs {
			if a.Key == LogKeyRun && a.Value.Kind() == slog.KindString {
				attrs = append(attrs[:len(attrs):len(attrs)], slog.String(LogKeyTraceID, TraceIDString(a.Value.String())))
				n.hasRun = true
				break
			}
		}
	}
	n.inner = h.inner.WithAttrs(attrs)
	return &n
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	n := *h
	n.inner, n.grouped = h.inner.WithGroup(name), true
	return &n
}
