package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"go.yaml.in/yaml/v3"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/gateway/maintenance"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/ops/alerts"
	"github.com/turnguard/turnguard/ops/metrics"
	"github.com/turnguard/turnguard/store"
)

// ms converts a duration to whole milliseconds.
func ms(d time.Duration) int64 { return d.Milliseconds() }

// StepView is a step as the API shows it.
type StepView struct {
	Kind      string    `json:"kind,omitempty"`
	Name      string    `json:"name,omitempty"`
	Seq       uint32    `json:"seq,omitempty"`
	StartedAt time.Time `json:"startedAt,omitzero"`
	// ElapsedMs is how long the current step has run (current step only).
	ElapsedMs *int64 `json:"elapsedMs,omitempty"`
}

func stepView(s event.Step) *StepView {
	if s.IsZero() {
		return nil
	}
	return &StepView{Kind: s.Kind, Name: s.Name, Seq: s.Seq, StartedAt: s.StartedAt}
}

// Deadlines is the time left before each deadline of a turn, in
// milliseconds; negative once passed; null when the deadline does not
// apply (step timeout disabled or the turn paused; no max turn time).
type Deadlines struct {
	StepTimeoutInMs *int64 `json:"stepTimeoutInMs"`
	TimeoutInMs     *int64 `json:"timeoutInMs"`
	MaxTurnTimeInMs *int64 `json:"maxTurnTimeInMs"`
}

// TurnView is one live turn of /api/turns.
type TurnView struct {
	RunID      string `json:"runId"`
	SessionKey string `json:"sessionKey"`
	Channel    string `json:"channel"`
	ChatRef    string `json:"chatRef,omitempty"`
	// Attempt is the turn's attempt number: 1, or 2 and up for a turn
	// dispatched again after a restart or a takeover
	// (agents.defaults.resume); omitted for a turn run elsewhere.
	Attempt     int       `json:"attempt,omitempty"`
	State       string    `json:"state"`                // running | aborted (stopping: the runner has not returned yet)
	StopReason  string    `json:"stopReason,omitempty"` // of an aborted turn
	StartedAt   time.Time `json:"startedAt"`
	ElapsedMs   int64     `json:"elapsedMs"`
	CurrentStep *StepView `json:"currentStep"` // null between steps
	LastStep    *StepView `json:"lastStep"`    // the last completed step, null if none
	Paused      bool      `json:"paused"`
	// Stalled: the current step has run at least progressNotifyAfterSeconds.
	Stalled bool `json:"stalled"`
	// Class is what the turn is doing, as the deadline scheduler decides
	// it (maintenance.Decide): working (steps completing), long_running (one
	// step long, but heartbeating), stalled (no progress, inside its
	// liveness window) or stuck (past a deadline, its runner not stopping);
	// empty for a turn run elsewhere.
	Class string `json:"class,omitempty"`
	// Warning says, for a stalled turn, which step and for how long.
	Warning        string    `json:"warning,omitempty"`
	Deadlines      Deadlines `json:"deadlines"`
	RunnerReturned bool      `json:"runnerReturned"`
	// TraceID is the turn's OpenTelemetry trace id (32 hex digits) while
	// tracing is on; omitted otherwise.
	TraceID string `json:"traceId,omitempty"`
	// Elsewhere: run by another replica (cluster mode), read from the
	// store: its steps as last recorded and its wall-clock deadline;
	// paused, stalled and the step and ceiling deadlines are its owner's to
	// know (that replica's /api/turns). An abort through this replica
	// reaches it.
	Elsewhere bool `json:"elsewhere,omitempty"`
}

func turnView(s abort.Snapshot) TurnView {
	v := TurnView{
		RunID: s.RunID, SessionKey: s.SessionKey, Channel: s.Channel, ChatRef: s.ChatRef, Attempt: s.Attempt, State: s.State,
		StopReason: string(s.StopReason), StartedAt: s.StartedAt, ElapsedMs: ms(s.Elapsed),
		CurrentStep: stepView(s.CurrentStep), LastStep: stepView(s.LastStep), Paused: s.Paused, Stalled: s.Stalled,
		Class: s.Class, RunnerReturned: s.Returned,
	}
	if v.CurrentStep != nil {
		e := ms(s.StepElapsed)
		v.CurrentStep.ElapsedMs = &e
	}
	if s.Stalled {
		v.Warning = fmt.Sprintf("%s has been running for %s", s.CurrentStep.Label(), messages.Duration(s.StepElapsed))
	}
	wall := ms(s.UntilWall)
	v.Deadlines.TimeoutInMs = &wall
	if s.UntilStep != 0 {
		d := ms(s.UntilStep)
		v.Deadlines.StepTimeoutInMs = &d
	}
	if s.UntilCeiling != 0 {
		d := ms(s.UntilCeiling)
		v.Deadlines.MaxTurnTimeInMs = &d
	}
	return v
}

// TurnsResponse is the body of GET /api/turns.
type TurnsResponse struct {
	Now     time.Time `json:"now"`
	Count   int       `json:"count"`
	Stalled int       `json:"stalled"`
	// Classes counts this replica's live turns by class (TurnView.Class),
	// every class present.
	Classes map[string]int `json:"classes"`
	Turns   []TurnView     `json:"turns"` // oldest first (then by run id)
}

func (h *Handler) turns(w http.ResponseWriter, r *http.Request) {
	live := h.opts.Engine.Live()
	slices.SortStableFunc(live, func(a, b abort.Snapshot) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.RunID, b.RunID)
	})
	out := TurnsResponse{Now: time.Now().UTC(), Count: len(live), Turns: make([]TurnView, 0, len(live)),
		Classes: map[string]int{}}
	for _, c := range maintenance.Classes {
		out.Classes[c.String()] = 0
	}
	for _, s := range live {
		if s.Class != "" {
			out.Classes[s.Class]++
		}
		tv := turnView(s)
		if h.opts.TraceID != nil {
			tv.TraceID = h.opts.TraceID(s.RunID)
		}
		if tv.Stalled {
			out.Stalled++
		}
		out.Turns = append(out.Turns, tv)
	}
	h.turnsElsewhere(r.Context(), &out, live)
	writeJSON(w, http.StatusOK, out)
}

// turnsElsewhere adds to out the turns other replicas run (cluster mode),
// from the store, as /api/approvals adds their questions: every replica's
// /api/turns lists the cluster's live turns (issue 20, one view from every
// replica). live are this replica's own.
func (h *Handler) turnsElsewhere(ctx context.Context, out *TurnsResponse, live []abort.Snapshot) {
	rl, ok := h.opts.Store.(runningLister)
	if !ok || !h.opts.Config.Current().Cluster.Enabled {
		return
	}
	running, err := rl.RunningTurns(ctx)
	if err != nil {
		h.log.Warn("cannot list the other replicas' running turns", "err", err)
		return
	}
	now := out.Now
	for _, st := range running {
		if slices.ContainsFunc(live, func(s abort.Snapshot) bool { return s.RunID == st.RunID }) {
			continue
		}
		tv := TurnView{RunID: st.RunID, SessionKey: st.SessionKey, Channel: st.Channel, ChatRef: st.ChatRef,
			State: "running", StartedAt: st.StartedAt, ElapsedMs: ms(now.Sub(st.StartedAt)),
			CurrentStep: stepView(st.CurrentStep), LastStep: stepView(st.LastStep), Elsewhere: true}
		if !st.Deadline.IsZero() {
			d := ms(st.Deadline.Sub(now))
			tv.Deadlines.TimeoutInMs = &d
		}
		out.Turns = append(out.Turns, tv)
	}
	slices.SortStableFunc(out.Turns, func(a, b TurnView) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.RunID, b.RunID)
	})
	out.Count = len(out.Turns)
}

// runningLister lists the turns the store holds as running (both stores
// implement it).
type runningLister interface {
	RunningTurns(ctx context.Context) ([]store.Turn, error)
}

// AbortResponse is the body of POST /api/turns/{runId}/abort.
type AbortResponse struct {
	Aborted    bool   `json:"aborted"`
	RunID      string `json:"runId"`
	SessionKey string `json:"sessionKey"`
	StopReason string `json:"stopReason"`
}

// abort stops a live turn with stop reason "user", as an operator (any
// turn, whoever started it). Its user gets the stop notice through their
// channel, as for /stop.
func (h *Handler) abort(w http.ResponseWriter, r *http.Request) {
	runID := chi.URLParam(r, "runId")
	live := h.opts.Engine.Live()
	i := slices.IndexFunc(live, func(s abort.Snapshot) bool { return s.RunID == runID })
	var snap abort.Snapshot
	switch {
	case i >= 0:
		snap = live[i]
	case h.opts.Store != nil:
		// Not running here: in a cluster another replica may run it (the
		// engine forwards the abort to it). Its session is in the store.
		t, err := h.opts.Store.Turn(r.Context(), runID)
		if err != nil || t.State != store.TurnRunning {
			writeError(w, http.StatusNotFound, "no live turn has that runId")
			return
		}
		snap = abort.Snapshot{RunID: runID, SessionKey: t.SessionKey, Channel: t.Channel}
	default:
		writeError(w, http.StatusNotFound, "no live turn has that runId")
		return
	}
	res, err := h.opts.Engine.Abort(r.Context(), snap.SessionKey, runID, event.ReasonUser, "operator", true)
	switch {
	case err != nil:
		h.log.Error("operator abort failed", "run", runID, "session", snap.SessionKey, "err", err)
		writeError(w, http.StatusInternalServerError, "abort failed: "+err.Error())
		return
	case !res.Aborted:
		writeError(w, http.StatusConflict, "the turn is no longer running (it finished or is already stopping)")
		return
	}
	h.log.Warn("operator aborted a turn", "run", runID, "session", snap.SessionKey, "channel", snap.Channel, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, AbortResponse{Aborted: true, RunID: runID, SessionKey: snap.SessionKey, StopReason: string(event.ReasonUser)})
}

// EpisodeView is one stall or abort episode of /api/stall-history.
type EpisodeView struct {
	RunID      string    `json:"runId"`
	SessionKey string    `json:"sessionKey"`
	Step       *StepView `json:"step"` // the slow step, or the one running at the abort
	Started    time.Time `json:"started"`
	Ended      time.Time `json:"ended,omitzero"` // absent while open
	// Outcome: recovered, finished, aborted, force_finalized or open.
	Outcome    string `json:"outcome"`
	StopReason string `json:"stopReason,omitempty"`
	Notices    int    `json:"notices"`
	DurationMs *int64 `json:"durationMs"` // null while open
}

// StallHistoryResponse is the body of GET /api/stall-history.
type StallHistoryResponse struct {
	Episodes []EpisodeView `json:"episodes"` // by start, oldest first
}

func (h *Handler) stallHistory(w http.ResponseWriter, r *http.Request) {
	if h.opts.Store == nil {
		writeError(w, http.StatusServiceUnavailable, "no store: the stall history is not kept")
		return
	}
	f, err := parseFilter(r, time.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	eps, err := h.opts.Store.StallHistory(r.Context(), f)
	if err != nil {
		h.log.Error("stall history query failed", "err", err)
		writeError(w, http.StatusInternalServerError, "reading the stall history failed")
		return
	}
	out := StallHistoryResponse{Episodes: make([]EpisodeView, 0, len(eps))}
	for _, e := range eps {
		v := EpisodeView{RunID: e.RunID, SessionKey: e.SessionKey, Step: stepView(e.Step), Started: e.Started,
			Ended: e.Ended, Outcome: string(e.Outcome), StopReason: string(e.StopReason), Notices: e.Notices}
		if !e.Ended.IsZero() {
			d := ms(e.Duration())
			v.DurationMs = &d
		}
		out.Episodes = append(out.Episodes, v)
	}
	writeJSON(w, http.StatusOK, out)
}

// parseFilter reads session, run, since, until and limit. since and until
// are RFC 3339 times or Go durations meaning "that long before now".
func parseFilter(r *http.Request, now time.Time) (store.Filter, error) {
	q := r.URL.Query()
	for k := range q {
		switch k {
		case "session", "run", "since", "until", "limit":
		default:
			return store.Filter{}, fmt.Errorf("unknown parameter %q (use session, run, since, until, limit)", k)
		}
	}
	f := store.Filter{SessionKey: q.Get("session"), RunID: q.Get("run")}
	var err error
	if f.Since, err = parseWhen("since", q.Get("since"), now); err != nil {
		return f, err
	}
	if f.Until, err = parseWhen("until", q.Get("until"), now); err != nil {
		return f, err
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return f, errors.New("since must be before until")
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > store.MaxLimit {
			return f, fmt.Errorf("limit must be a whole number from 1 to %d", store.MaxLimit)
		}
		f.Limit = n
	}
	return f, nil
}

func parseWhen(name, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%s must be an RFC 3339 time (2025-01-02T15:04:05Z) or a duration before now (90m)", name)
}

// BuildInfo describes the running binary.
type BuildInfo struct {
	Version   string `json:"version"`
	GoVersion string `json:"goVersion"`
	Revision  string `json:"revision,omitempty"` // VCS revision, when built from a checkout
	Modified  bool   `json:"modified,omitempty"` // the checkout had local changes
	OS        string `json:"os"`
	Arch      string `json:"arch"`
}

func buildInfo(version string) BuildInfo {
	b := BuildInfo{Version: version, GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	if r := metrics.BuildRevision(); r != "unknown" {
		b.Revision = r
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.modified" {
				b.Modified = s.Value == "true"
			}
		}
	}
	return b
}

// SchedulerView is the deadline scheduler's state.
type SchedulerView struct {
	Enabled   bool   `json:"enabled"`   // watchdog.enabled
	AutoAbort bool   `json:"autoAbort"` // watchdog.autoAbort
	Entries   int    `json:"entries"`   // turns it is watching
	Wakeups   uint64 `json:"wakeups"`
	Looks     uint64 `json:"looks"`
	Rearms    uint64 `json:"rearms"`
	// DeadlineAborts counts the aborts the scheduler made, by reason.
	DeadlineAborts  map[event.StopReason]uint64 `json:"deadlineAborts"`
	ProgressNotices uint64                      `json:"progressNotices"`
	ForceFinalized  uint64                      `json:"forceFinalized"`
}

// Counters are the gateway's event counters since it started.
type Counters struct {
	TurnsStarted       uint64            `json:"turnsStarted"`
	TurnsByStopReason  map[string]uint64 `json:"turnsByStopReason"` // every ending: stop, error and the aborts
	AbortsByReason     map[string]uint64 `json:"abortsByReason"`    // the endings other than stop and error
	ForceFinalizations uint64            `json:"forceFinalizations"`
	ProgressNotices    uint64            `json:"progressNotices"`
	Deliveries         uint64            `json:"deliveries"`       // outbox messages delivered
	DeliveryRetries    uint64            `json:"deliveryRetries"`  // failed attempts, to be retried
	DeliveryFailures   uint64            `json:"deliveryFailures"` // given up
	TelegramAPICalls   map[string]uint64 `json:"telegramApiCalls"` // by result
}

// StoreView is the event recorder's state.
type StoreView struct {
	Enqueued   uint64 `json:"enqueued"`
	Written    uint64 `json:"written"`
	Dropped    uint64 `json:"dropped"` // queue overflow
	Failed     uint64 `json:"failed"`
	QueueDepth int    `json:"queueDepth"`
}

// RunnerHealth is the last probe of a runner (runner.Prober).
type RunnerHealth struct {
	Runner    string    `json:"runner"`
	OK        bool      `json:"ok"`
	Problem   string    `json:"problem,omitempty"` // why it cannot work, for operators
	CheckedAt time.Time `json:"checkedAt"`
}

// Diagnosis is the body of GET /api/diagnose.
type Diagnosis struct {
	Build     BuildInfo           `json:"build"`
	StartedAt time.Time           `json:"startedAt"`
	UptimeMs  int64               `json:"uptimeMs"`
	Config    map[string]any      `json:"config"` // in effect, secrets redacted, shaped like the YAML file
	Scheduler SchedulerView       `json:"scheduler"`
	LiveTurns int                 `json:"liveTurns"`
	Stalled   int                 `json:"stalledTurns"`
	Counters  Counters            `json:"counters"`
	Outbox    *store.OutboxCounts `json:"outbox"`    // null without a store
	Store     *StoreView          `json:"store"`     // null without a store
	WSClients int                 `json:"wsClients"` //
	Alerts    *alerts.Stats       `json:"alerts"`    // null when alerts are not running
	// Runners is the last probe of each runner that can be probed (the
	// openai runner: does its provider answer?); a failed one is also in
	// Problems.
	Runners []RunnerHealth `json:"runners,omitempty"`
	// Problems lists the parts that could not be read; the rest is still
	// reported.
	Problems []string `json:"problems,omitempty"`
}

func (h *Handler) diagnose(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	d := Diagnosis{
		Build: buildInfo(h.opts.Version), StartedAt: h.opts.StartedAt.UTC(), UptimeMs: ms(now.Sub(h.opts.StartedAt)),
	}
	cfg, err := configMap(h.opts.Config.Current().String())
	if err != nil {
		d.Problems = append(d.Problems, "config: "+err.Error())
	}
	d.Config = cfg

	sched := h.opts.Engine.Scheduler()
	st, pol := sched.Stats(), sched.Policy()
	d.Scheduler = SchedulerView{Enabled: pol.Enabled, AutoAbort: pol.AutoAbort, Entries: st.Entries, Wakeups: st.Wakeups,
		Looks: st.Looks, Rearms: st.Rearms, DeadlineAborts: st.Aborts, ProgressNotices: st.Progress, ForceFinalized: st.ForceFinalized}
	for _, s := range h.opts.Engine.Live() {
		d.LiveTurns++
		if s.Stalled {
			d.Stalled++
		}
	}
	d.Counters, err = h.counters(st)
	if err != nil {
		d.Problems = append(d.Problems, "metrics: "+err.Error())
	}
	if h.opts.Store != nil {
		ss := h.opts.Store.Stats()
		d.Store = &StoreView{Enqueued: ss.Enqueued, Written: ss.Written, Dropped: ss.Dropped, Failed: ss.Failed, QueueDepth: ss.QueueDepth}
		if c, err := h.opts.Store.Counts(r.Context()); err != nil {
			h.log.Warn("diagnose: outbox counts", "err", err)
			d.Problems = append(d.Problems, "outbox: reading the counts failed")
		} else {
			d.Outbox = &c
		}
	}
	if h.opts.WSClients != nil {
		d.WSClients = h.opts.WSClients()
	}
	if h.opts.Alerts != nil {
		s := h.opts.Alerts.Stats()
		d.Alerts = &s
	}
	if h.opts.Runners != nil {
		d.Runners = h.opts.Runners()
		for _, r := range d.Runners {
			if !r.OK {
				d.Problems = append(d.Problems, "runner "+r.Runner+": "+r.Problem)
			}
		}
	}
	writeJSON(w, http.StatusOK, d)
}

// counters reads the event counters from the metrics, or, without them,
// what the scheduler counts.
func (h *Handler) counters(st maintenance.StatsSnapshot) (Counters, error) {
	c := Counters{TurnsByStopReason: map[string]uint64{}, AbortsByReason: map[string]uint64{}, TelegramAPICalls: map[string]uint64{}}
	if h.opts.Metrics == nil {
		for r, n := range st.Aborts {
			c.AbortsByReason[string(r)] = n
		}
		c.ForceFinalizations, c.ProgressNotices = st.ForceFinalized, st.Progress
		return c, nil
	}
	var errs []error
	read := func(name, key string) map[string]float64 {
		v, err := h.opts.Metrics.Values(name, key)
		if err != nil {
			errs = append(errs, err)
		}
		return v
	}
	for _, n := range read("turnguard_turns_started_total", "") {
		c.TurnsStarted += uint64(n)
	}
	for r, n := range read("turnguard_turns_finished_total", "stop_reason") {
		c.TurnsByStopReason[r] = uint64(n)
		if r != string(event.ReasonStop) && r != string(event.ReasonError) {
			c.AbortsByReason[r] = uint64(n)
		}
	}
	for _, n := range read("turnguard_force_finalized_total", "") {
		c.ForceFinalizations += uint64(n)
	}
	for _, n := range read("turnguard_progress_notices_total", "") {
		c.ProgressNotices += uint64(n)
	}
	for r, n := range read("turnguard_deliveries_total", "result") {
		switch r {
		case "delivered":
			c.Deliveries = uint64(n)
		case "retry":
			c.DeliveryRetries = uint64(n)
		case "failed":
			c.DeliveryFailures = uint64(n)
		}
	}
	for r, n := range read("turnguard_telegram_api_calls_total", "result") {
		c.TelegramAPICalls[r] = uint64(n)
	}
	return c, errors.Join(errs...)
}

// configMap turns the redacted YAML rendering of the configuration
// (config.Config.String) into a map, so the JSON has the file's keys.
func configMap(redactedYAML string) (map[string]any, error) {
	var m map[string]any
	if err := yaml.Unmarshal([]byte(redactedYAML), &m); err != nil {
		return nil, fmt.Errorf("rendering the configuration: %w", err)
	}
	return m, nil
}
