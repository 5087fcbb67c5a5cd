// Package tracing owns the gateway's OpenTelemetry traces: every turn is one
// trace, built from the engine's events by a bus subscriber (Tracer) and
// exported over OTLP (New), and the trace id of a turn, which is derived from
// its run id (TraceID) so that the admin API, the log (LogHandler) and every
// replica name it alike without asking anyone.
//
// The trace of a turn: a root span "turn" from TurnStarted to the turn's
// terminal event (Finished or Aborted), with the session, channel, runner,
// queue wait and stop reason as attributes; one child span per step, named
// after the step (its label), with its kind, name, sequence number and the
// time it spent paused; span events on the root for pauses, progress
// notices, recoveries, approvals asked and settled, and the abort; a short
// "force_finalized" child when a runner ignored its abort past the grace
// period (it may come after the root ended). The root's status is Error for
// a stop that is not the user's (anything but stop, user and superseded),
// Unset otherwise.
//
// Tracing is off unless telemetry.otlp.endpoint is set; then nothing here is
// built and nothing subscribes to the bus, so a turn pays nothing for it.
// Exporting never holds a turn up: spans go through the SDK's batch
// processor, which drops when its queue is full, and an exporter failure is
// logged once, then at most every ErrorLogInterval with a count.
package tracing

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/turnguard/turnguard/config"
)

// ScopeName is the instrumentation scope of the turn spans.
const ScopeName = "github.com/turnguard/turnguard/ops/tracing"

// ErrorLogInterval is how often, at most, exporter failures are logged after
// the first one.
const ErrorLogInterval = 10 * time.Minute

// ShutdownTimeout bounds Shutdown's flush when its context has no deadline.
const ShutdownTimeout = 5 * time.Second

// Options configure New.
type Options struct {
	// Telemetry is the telemetry.* configuration. Its OTLP endpoint is used
	// unless Exporter is set.
	Telemetry config.Telemetry
	// Version is the gateway's version (service.version); Instance names
	// this process (service.instance.id: the replica id), optional.
	Version, Instance string
	// Exporter, when set, replaces the OTLP exporter and is called
	// synchronously as each span ends (tests: tracetest.InMemoryExporter).
	Exporter sdktrace.SpanExporter
	// Batch sends Exporter's spans through the batch processor, as the
	// OTLP exporter's are (benchmarks), instead of synchronously.
	Batch bool
	// Log receives the exporter's failures (rate-limited).
	Log *slog.Logger
}

// Tracer turns a bus's events into spans. Create it with New, subscribe its
// Handle to the engine's bus, and Shutdown at exit.
type Tracer struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
}

// New builds the tracer provider and its exporter. It does not connect: the
// OTLP exporters dial lazily, and a receiver that is down only makes exports
// fail (logged, never blocking a turn).
func New(ctx context.Context, opts Options) (*Tracer, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	t := opts.Telemetry
	var sp sdktrace.SpanProcessor
	switch {
	case opts.Exporter != nil && opts.Batch:
		sp = sdktrace.NewBatchSpanProcessor(opts.Exporter)
	case opts.Exporter != nil:
		sp = sdktrace.NewSimpleSpanProcessor(opts.Exporter)
	default:
		exp, err := newExporter(ctx, t.OTLP)
		if err != nil {
			return nil, fmt.Errorf("tracing: OTLP exporter for %s: %w", endpointForLog(t.OTLP.Endpoint), err)
		}
		sp = sdktrace.NewBatchSpanProcessor(exp, sdktrace.WithBatchTimeout(2*time.Second))
	}
	setErrorHandler(opts.Log)
	attrs := []attribute.KeyValue{attribute.String("service.name", t.ServiceName)}
	if opts.Version != "" {
		attrs = append(attrs, attribute.String("service.version", opts.Version))
	}
	if opts.Instance != "" {
		attrs = append(attrs, attribute.String("service.instance.id", opts.Instance))
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(sp),
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
		sdktrace.WithIDGenerator(idGenerator{}),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.SampleRatio))),
	)
	return &Tracer{provider: tp, tracer: tp.Tracer(ScopeName)}, nil
}

// newExporter builds the OTLP exporter of o: gRPC or HTTP, to a host:port
// (TLS unless Insecure) or a URL (its scheme decides).
func newExporter(ctx context.Context, o config.TelemetryOTLP) (sdktrace.SpanExporter, error) {
	isURL := strings.Contains(o.Endpoint, "://")
	const timeout = 10 * time.Second
	if o.Protocol == config.OTLPHTTP {
		opts := []otlptracehttp.Option{otlptracehttp.WithTimeout(timeout), otlptracehttp.WithHeaders(o.Headers),
			otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: true, InitialInterval: time.Second, MaxInterval: 5 * time.Second, MaxElapsedTime: 15 * time.Second})}
		if isURL {
			u, err := url.Parse(o.Endpoint)
			if err != nil {
				return nil, err
			}
			if u.Path == "" || u.Path == "/" {
				u.Path = "/v1/traces"
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
		} else {
			opts = append(opts, otlptracehttp.WithEndpoint(o.Endpoint))
			if o.Insecure {
				opts = append(opts, otlptracehttp.WithInsecure())
			}
		}
		return otlptracehttp.New(ctx, opts...)
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithTimeout(timeout), otlptracegrpc.WithHeaders(o.Headers),
		otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: true, InitialInterval: time.Second, MaxInterval: 5 * time.Second, MaxElapsedTime: 15 * time.Second})}
	if isURL {
		opts = append(opts, otlptracegrpc.WithEndpointURL(o.Endpoint))
	} else {
		opts = append(opts, otlptracegrpc.WithEndpoint(o.Endpoint))
		if o.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
	}
	return otlptracegrpc.New(ctx, opts...)
}

// endpointForLog is the endpoint without user info or query (secrets).
func endpointForLog(e string) string {
	if u, err := url.Parse(e); err == nil && strings.Contains(e, "://") {
		return u.Scheme + "://" + u.Host + u.Path
	}
	return e
}

// errorState rate-limits the SDK's error reports (export failures).
type errorState struct {
	mu         sync.Mutex
	log        *slog.Logger
	last       time.Time
	suppressed int
}

var errState errorState

// setErrorHandler routes the OpenTelemetry SDK's errors — an export that
// failed, spans dropped — to log: the first at once, later ones at most
// every ErrorLogInterval, with how many were not logged.
func setErrorHandler(log *slog.Logger) {
	errState.mu.Lock()
	errState.log = log
	errState.mu.Unlock()
	otel.SetErrorHandler(otel.ErrorHandlerFunc(errState.handle))
}

func (s *errorState) handle(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if !s.last.IsZero() && now.Sub(s.last) < ErrorLogInterval {
		s.suppressed++
		return
	}
	s.log.Warn("tracing: exporting spans failed; turns go on, their spans may be lost", "err", err,
		"earlierFailuresNotLogged", s.suppressed)
	s.last, s.suppressed = now, 0
}

// Shutdown flushes the spans not yet exported and stops the exporter,
// waiting at most until ctx is done (ShutdownTimeout when ctx has no
// deadline). Spans still queued then are lost.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ShutdownTimeout)
		defer cancel()
	}
	if err := t.provider.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// TraceID returns the trace id of the turn with run id runID: the first 16
// bytes of SHA-256("turnguard turn " + runID). Derived, not drawn, so that
// the admin API, the log and a replica that takes the turn over know it
// without a lookup. Run ids are unique per turn (a uuid unless the client
// chose its key), so trace ids are too.
func TraceID(runID string) trace.TraceID {
	sum := sha256.Sum256([]byte("turnguard turn " + runID))
	var id trace.TraceID
	copy(id[:], sum[:16])
	if !id.IsValid() { // all zero: never in practice
		id[15] = 1
	}
	return id
}

// TraceIDString is TraceID in its 32-hex-digit form, as backends show it.
func TraceIDString(runID string) string { return TraceID(runID).String() }

type runIDKey struct{}

// idGenerator gives a turn's root span the turn's TraceID (the run id is in
// the start context) and every span a random span id.
type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	var tid trace.TraceID
	if runID, ok := ctx.Value(runIDKey{}).(string); ok {
		tid = TraceID(runID)
	} else {
		for !tid.IsValid() {
			putUint64(tid[:8], rand.Uint64())
			putUint64(tid[8:], rand.Uint64())
		}
	}
	return tid, newSpanID()
}

func (idGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID { return newSpanID() }

func newSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		putUint64(sid[:], rand.Uint64())
	}
	return sid
}

func putUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (56 - 8*i))
	}
}
