// Package metrics owns turnguard's Prometheus metrics and the /metrics
// endpoint that exposes them (text exposition format, through
// prometheus/client_golang on a registry of its own, never the global one).
//
// Three kinds of source feed it, none of which can slow a turn:
//
//   - Handle, subscribed to the engine's event bus, counts turn transitions
//     (turns started and finished by stop reason, step durations by kind,
//     progress notices, recoveries, force-finalizations). It only
//     increments counters and observes histograms: it never blocks.
//   - Observer, passed to the engine as its maintenance.Observer, records how
//     late after its deadline each deadline abort happened.
//   - Gauges read at scrape time (AddSources): live turns, WebSocket
//     clients, the store's write queue and its overflow, outbox messages by
//     status.
//
// Channels report their own I/O through hooks: TelegramCall (or the
// TelegramTransport round tripper) counts Bot API calls by method and
// result, and Outbox wraps a channel's outbox to count deliveries, retries
// and failures. The start-up recovery and a cluster takeover count their
// resume decisions through ResumeDecision.
//
// Every metric name starts with "turnguard_"; docs/operations.md lists
// them. Label values are bounded: stop reasons and results are fixed sets,
// step kinds and Bot API methods that do not look like identifiers are
// reported as "other".
package metrics

import (
	"context"
	"net/http"
	"runtime"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/maintenance"
	"github.com/turnguard/turnguard/store"
)

// Namespace prefixes every metric name.
const Namespace = "turnguard"

// Histogram buckets, in seconds.
var (
	// StepBuckets span quick tool calls to long builds.
	StepBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}
	// LateBuckets span a punctual scheduler (well under a millisecond) to a
	// badly overloaded one (seconds).
	LateBuckets = []float64{0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}
)

// Metrics holds the registry and every collector. Create it with New; its
// methods are safe for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	turnsStarted  *prometheus.CounterVec
	turnsFinished *prometheus.CounterVec
	stepDuration  *prometheus.HistogramVec
	// The step_duration_seconds series of the two common kinds, looked up
	// once: Handle observes every step completion, and the vec's lookup
	// hashes the label and takes the vec's lock.
	stepLLM, stepTool atomic.Pointer[prometheus.Observer]
	abortLate         *prometheus.HistogramVec
	progress          *prometheus.CounterVec
	recovered         *prometheus.CounterVec
	budgetWarnings    *prometheus.CounterVec
	forceFinalized    *prometheus.CounterVec
	telegramCalls     *prometheus.CounterVec
	deliveries        *prometheus.CounterVec
	resumes           *prometheus.CounterVec
}

// New returns the metrics with a fresh registry that already holds the Go
// runtime and process collectors and turnguard_build_info{version=…}.
func New(version string) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.turnsStarted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "turns_started_total",
		Help: "Turns started, by channel.",
	}, []string{"channel"})
	m.turnsFinished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "turns_finished_total",
		Help: "Turns ended, by channel and stop reason (stop, error, timeout, step_timeout, max_turn_time, user, shutdown).",
	}, []string{"channel", "stop_reason"})
	m.stepDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "step_duration_seconds",
		Help:    "Duration of completed steps (LLM calls, tool calls), by step kind.",
		Buckets: StepBuckets,
	}, []string{"kind"})
	m.abortLate = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "abort_late_seconds",
		Help:    "How long after its deadline each deadline abort happened, by stop reason.",
		Buckets: LateBuckets,
	}, []string{"stop_reason"})
	m.progress = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "progress_notices_total",
		Help: `"Still working" notices sent for slow steps, by channel.`,
	}, []string{"channel"})
	m.recovered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "progress_recovered_total",
		Help: "Slow steps that made progress again after a notice, by channel.",
	}, []string{"channel"})
	m.budgetWarnings = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "budget_warnings_total",
		Help: "Turns warned that they will be stopped (budgetWarningRatio of their time limit used), by channel.",
	}, []string{"channel"})
	m.forceFinalized = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "force_finalized_total",
		Help: "Turns whose runner ignored the abort past the grace period and were force-finalized, by the abort's stop reason.",
	}, []string{"stop_reason"})
	m.telegramCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "telegram_api_calls_total",
		Help: "Telegram Bot API calls, by method and result (ok, rate_limited, client_error, server_error, network_error, canceled).",
	}, []string{"method", "result"})
	m.deliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "deliveries_total",
		Help: "Outbox deliveries of final replies and notices, by channel and result (delivered, retry, failed).",
	}, []string{"channel", "result"})
	m.resumes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "resume_decisions_total",
		Help: "Turns cut off by a restart or a takeover with agents.defaults.resume on, by outcome: " +
			"resumed (dispatched again), asked (the person is asked first: a tool call was cut off), " +
			"exhausted (its last attempt: ended for good), skipped (too old, or its message or attempts unreadable).",
	}, []string{"outcome"})
	for _, o := range ResumeOutcomes {
		m.resumes.WithLabelValues(o) // every outcome present from the start, at 0
	}

	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help:        "Always 1; the labels describe the running binary.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version(), "revision": BuildRevision()},
	})
	build.Set(1)

	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		build, m.turnsStarted, m.turnsFinished, m.stepDuration, m.abortLate, m.progress, m.recovered,
		m.budgetWarnings, m.forceFinalized, m.telegramCalls, m.deliveries, m.resumes,
	)
	return m
}

// Revision is the VCS revision the binary was built from, when the build
// sets it: the Makefile passes -ldflags "-X
// github.com/turnguard/turnguard/ops/metrics.Revision=$(git rev-parse HEAD)",
// which works where Go's own stamping does not (GOFLAGS=-buildvcs=false, a
// build outside a checkout).
var Revision string

// BuildRevision is the revision the binary was built from: Revision when
// set, else the vcs.revision Go stamped (go build in a checkout), else
// "unknown". It backs turnguard_build_info and /api/diagnose.
func BuildRevision() string {
	if Revision != "" {
		return Revision
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// Sources are read when /metrics is scraped. A nil field adds no metric.
type Sources struct {
	// ActiveTurns is the number of live turns (the engine's registry).
	ActiveTurns func() int
	// WSClients is the number of open WebSocket connections.
	WSClients func() int
	// TurnClasses counts the live turns by stall class (working,
	// long_running, stalled, stuck: the engine's TurnClasses, from the
	// deadline scheduler's own decision).
	TurnClasses func() map[string]int
	// Store reports the event recorder's queue and overflow.
	Store interface{ Stats() store.Stats }
	// Outbox counts outbox messages by status. It is queried with a short
	// timeout; a failed query leaves the metric out of that scrape.
	Outbox interface {
		Counts(ctx context.Context) (store.OutboxCounts, error)
	}
}

// outboxQueryTimeout bounds the outbox query of one scrape.
const outboxQueryTimeout = 2 * time.Second

// AddSources registers the scrape-time gauges for src. Call it once, when
// the components exist (after the engine and channels are built).
func (m *Metrics) AddSources(src Sources) {
	if src.ActiveTurns != nil {
		f := src.ActiveTurns
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "active_turns",
			Help: "Live turns: running, or aborted and waiting for their runner to return.",
		}, func() float64 { return float64(f()) }))
	}
	if src.TurnClasses != nil {
		m.reg.MustRegister(&classCollector{src: src.TurnClasses, desc: prometheus.NewDesc(
			prometheus.BuildFQName(Namespace, "", "turns_by_class"),
			"Live turns by stall class: working (steps completing), long_running (one step long, but heartbeating), "+
				"stalled (no heartbeat, inside its liveness window), stuck (past its deadline, its runner not stopping).",
			[]string{"class"}, nil)})
	}
	if src.WSClients != nil {
		f := src.WSClients
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "ws_clients",
			Help: "Open WebSocket connections (OpenClaw clients and web chat tabs).",
		}, func() float64 { return float64(f()) }))
	}
	if st := src.Store; st != nil {
		m.reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: Namespace, Name: "store_queue_depth",
				Help: "Turn events waiting for the store's writer.",
			}, func() float64 { return float64(st.Stats().QueueDepth) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: Namespace, Name: "store_events_dropped_total",
				Help: "Turn events not recorded because the store's queue was full (overflow) or the store was closed.",
			}, func() float64 { return float64(st.Stats().Dropped) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: Namespace, Name: "store_events_failed_total",
				Help: "Turn events accepted by the store but not written (invalid, or the write failed).",
			}, func() float64 { return float64(st.Stats().Failed) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: Namespace, Name: "store_events_written_total",
				Help: "Turn events written to the store.",
			}, func() float64 { return float64(st.Stats().Written) }),
		)
	}
	if src.Outbox != nil {
		m.reg.MustRegister(&outboxCollector{src: src.Outbox, desc: prometheus.NewDesc(
			prometheus.BuildFQName(Namespace, "", "outbox_messages"),
			"Outbox messages (final replies and notices) by status: pending, delivered, failed.",
			[]string{"status"}, nil)})
	}
}

// classCollector reads the turns by class at scrape time: one gauge per
// class, every class of maintenance.Classes (0 when none).
type classCollector struct {
	src  func() map[string]int
	desc *prometheus.Desc
}

func (c *classCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *classCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.src()
	for _, cl := range maintenance.Classes {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n[cl.String()]), cl.String())
	}
}

// outboxCollector queries the outbox counts at scrape time.
type outboxCollector struct {
	src interface {
		Counts(ctx context.Context) (store.OutboxCounts, error)
	}
	desc *prometheus.Desc
}

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), outboxQueryTimeout)
	defer cancel()
	n, err := c.src.Counts(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for _, s := range []struct {
		status string
		n      int
	}{{"pending", n.Pending}, {"delivered", n.Delivered}, {"failed", n.Failed}} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(s.n), s.status)
	}
}

// Handler serves the registry in the Prometheus text format (or what the
// scraper negotiates). Collection errors are reported in the response and
// the remaining metrics still served.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Gatherer returns the registry, for tests and for Values.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.reg }

// Handle counts one turn event. It is an event.Handler: subscribe it to the
// engine's bus for all sessions. It never blocks.
func (m *Metrics) Handle(ev event.Event) {
	switch ev.Kind {
	case event.TurnStarted:
		m.turnsStarted.WithLabelValues(label(ev.Channel)).Inc()
	case event.StepCompleted:
		// The hot path: no label to bound, no vec lookup (the series is kept).
		if !ev.Step.StartedAt.IsZero() && !ev.Time.IsZero() {
			if d := ev.Time.Sub(ev.Step.StartedAt); d >= 0 {
				m.stepObserver(ev.Step.Kind).Observe(d.Seconds())
			}
		}
	case event.Progress:
		m.progress.WithLabelValues(label(ev.Channel)).Inc()
	case event.Recovered:
		m.recovered.WithLabelValues(label(ev.Channel)).Inc()
	case event.BudgetWarning:
		m.budgetWarnings.WithLabelValues(label(ev.Channel)).Inc()
	case event.Aborted, event.Finished:
		m.turnsFinished.WithLabelValues(label(ev.Channel), reasonLabel(ev.StopReason)).Inc()
	case event.ForceFinalized:
		m.forceFinalized.WithLabelValues(reasonLabel(ev.StopReason)).Inc()
	}
}

// stepObserver is the step_duration_seconds series of step kind k.
func (m *Metrics) stepObserver(k string) prometheus.Observer {
	var slot *atomic.Pointer[prometheus.Observer]
	switch k {
	case event.StepLLM:
		slot = &m.stepLLM
	case event.StepTool:
		slot = &m.stepTool
	default:
		return m.stepDuration.WithLabelValues(label(k))
	}
	if o := slot.Load(); o != nil {
		return *o
	}
	o := m.stepDuration.WithLabelValues(k) // both kinds are identifiers: their own label
	slot.Store(&o)
	return o
}

// Observer returns the maintenance observer to pass to the engine
// (gateway.Options.Observer): it records abort lateness.
func (m *Metrics) Observer() maintenance.Observer {
	return maintenance.Observer{AbortLate: m.AbortLate}
}

// AbortLate records that a deadline abort for reason happened late after
// its deadline.
func (m *Metrics) AbortLate(reason event.StopReason, late time.Duration) {
	m.abortLate.WithLabelValues(reasonLabel(reason)).Observe(max(late, 0).Seconds())
}

// The outcomes of ResumeDecision.
const (
	ResumeResumed   = "resumed"
	ResumeAsked     = "asked"
	ResumeExhausted = "exhausted"
	ResumeSkipped   = "skipped"
)

// ResumeOutcomes are the outcome label's values.
var ResumeOutcomes = []string{ResumeResumed, ResumeAsked, ResumeExhausted, ResumeSkipped}

// ResumeDecision counts one decision about a turn cut off by a restart or
// a takeover (agents.defaults.resume on): outcome is one of
// ResumeOutcomes (anything else counts as skipped). Safe for concurrent
// use; nil m counts nothing.
func (m *Metrics) ResumeDecision(outcome string) {
	if m == nil {
		return
	}
	if !slices.Contains(ResumeOutcomes, outcome) {
		outcome = ResumeSkipped
	}
	m.resumes.WithLabelValues(outcome).Inc()
}

// label bounds a label value: "" is "none", anything that is not a short
// identifier is "other".
func label(s string) string {
	switch {
	case s == "":
		return "none"
	case isIdentifier(s):
		return s
	}
	return "other"
}

// isIdentifier reports whether s is what a label taken from outside (a step
// kind, a channel name, a Bot API method) must look like to be used as is:
// ^[A-Za-z][A-Za-z0-9_]{0,39}$, checked without a regexp (label is called
// for every event).
func isIdentifier(s string) bool {
	if len(s) > 40 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case i > 0 && (c >= '0' && c <= '9' || c == '_'):
		default:
			return false
		}
	}
	return s != ""
}

func reasonLabel(r event.StopReason) string {
	if r.Valid() {
		return string(r)
	}
	return "other"
}

// Values returns the current value of each series of the counter or gauge
// family name (e.g. "turnguard_turns_finished_total"), summed by the value
// of label key (all series under "" when key is ""). Unknown families give
// an empty map. It is for diagnostics: /api/diagnose shows these numbers.
func (m *Metrics) Values(name, key string) (map[string]float64, error) {
	fams, err := m.reg.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			out[labelValue(s, key)] += value(f.GetType(), s)
		}
	}
	return out, nil
}

func labelValue(s *dto.Metric, key string) string {
	if key == "" {
		return ""
	}
	for _, l := range s.GetLabel() {
		if l.GetName() == key {
			return l.GetValue()
		}
	}
	return ""
}

func value(t dto.MetricType, s *dto.Metric) float64 {
	switch t {
	case dto.MetricType_COUNTER:
		return s.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return s.GetGauge().GetValue()
	case dto.MetricType_HISTOGRAM:
		return float64(s.GetHistogram().GetSampleCount())
	}
	return 0
}
