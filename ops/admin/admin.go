// Package admin owns the operator's HTTP surface: the diagnostics API
// (/api/turns, /api/turns/{runId}/abort, /api/diagnose, /api/stall-history,
// /api/errors, /api/approvals),
// the /metrics route, and the admin dashboard at /admin — one embedded
// static page (no build step, no external assets) that shows the live turns
// with their stall warnings, recent aborts and the stall history, updates
// itself by polling the API, and can abort a turn.
//
// Authentication. Every /api route and /metrics require
// "Authorization: Bearer <server.operatorToken>", compared in constant
// time (server.TokenEqual). When no operator token is configured — which
// the server allows only on a loopback listener — they are served without
// one, but only to loopback clients that address the gateway by a loopback
// name (so a web page elsewhere cannot reach them through DNS rebinding).
// The dashboard page itself holds no data and is served to anyone; it reads
// the token from its URL fragment (/admin#token=…, never sent to the
// server), keeps it in the tab's session storage, and sends it as a bearer
// token. No cookie is used, so the API is not exposed to cross-site
// requests; in addition a POST must be JSON and, if the browser sends an
// Origin, come from the gateway's own origin.
//
// Responses are JSON with camelCase keys; durations are milliseconds
// (…Ms), times RFC 3339. docs/operations.md documents each endpoint. No
// response contains a secret: the configuration is shown through
// config.Redacted.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/gateway/errlog"
	"github.com/turnguard/turnguard/gateway/maintenance"
	"github.com/turnguard/turnguard/gateway/server"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/ops/alerts"
	"github.com/turnguard/turnguard/store"
)

// Engine is what the API asks of the turn engine; *gateway.Engine
// implements it.
type Engine interface {
	Live() []abort.Snapshot
	Abort(ctx context.Context, sessionKey, runID string, reason event.StopReason, requester string, operator bool) (gateway.AbortResult, error)
	Scheduler() *maintenance.Scheduler
	Errors() []errlog.Record
	ErrorDetail(id string) (errlog.Record, bool)
	PendingApprovals(sessionKey string) []event.Approval
	ApprovalSession(id string) (sessionKey, runID string, ok bool)
	Resolve(ctx context.Context, req gateway.ResolveRequest) (gateway.ResolveResult, error)
}

// Store is what the API asks of persistence; *store.SQLite implements it.
type Store interface {
	StallHistory(ctx context.Context, f store.Filter) ([]store.Episode, error)
	Counts(ctx context.Context) (store.OutboxCounts, error)
	Stats() store.Stats
	// Turn reads a turn's record (the abort of a turn another replica
	// runs: its session is found here).
	Turn(ctx context.Context, runID string) (store.Turn, error)
}

// Metrics reads counters for /api/diagnose; *metrics.Metrics implements it.
type Metrics interface {
	Values(name, key string) (map[string]float64, error)
}

// Options configure the handler. Engine and Config are required.
type Options struct {
	Engine Engine
	Config *config.Source
	// Store backs /api/stall-history and the store and outbox figures of
	// /api/diagnose. nil: stall history answers 503.
	Store Store
	// Metrics supplies the counters of /api/diagnose (optional).
	Metrics Metrics
	// MetricsHandler serves /metrics (optional; nil: no /metrics route).
	MetricsHandler http.Handler
	// Alerts reports the alerter's counters (optional).
	Alerts interface{ Stats() alerts.Stats }
	// WSClients is the number of open WebSocket connections (optional).
	WSClients func() int
	// Runners reports the runners' last probes for /api/diagnose
	// (optional).
	Runners func() []RunnerHealth
	// OperatorToken guards the API; "" serves loopback clients only.
	OperatorToken string
	// Version is the gateway's version, shown by /api/diagnose.
	Version string
	// StartedAt is when the gateway started (default: when New is called).
	StartedAt time.Time
	// Log receives operator actions (aborts) and API errors.
	Log *slog.Logger
	// TraceID, when set (tracing is on), names the trace of a turn by its
	// run id: /api/turns and the dashboard show it.
	TraceID func(runID string) string
}

// Handler serves the operator routes. Create it with New and add its
// routes with Mount.
type Handler struct {
	opts Options
	log  *slog.Logger
	page http.Handler
}

// New returns the handler.
func New(opts Options) (*Handler, error) {
	if opts.Engine == nil || opts.Config == nil || opts.Config.Current() == nil {
		return nil, errors.New("admin: engine and config are required")
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.StartedAt.IsZero() {
		opts.StartedAt = time.Now()
	}
	return &Handler{opts: opts, log: opts.Log, page: pageHandler()}, nil
}

// Mount adds the routes to r (pass it as server.Options.Mount):
//
//	GET  /api/turns                  live turns (token)
//	POST /api/turns/{runId}/abort    abort a live turn as operator (token)
//	GET  /api/diagnose               configuration, build, scheduler, counters (token)
//	GET  /api/stall-history          stall and abort episodes (token)
//	GET  /api/errors                 recent turn failures, newest first (token)
//	GET  /api/errors/{id}            one failure by the error id its user was shown (token)
//	GET  /api/approvals              open questions of every conversation (token)
//	POST /api/approvals/{id}         answer one as operator: {"optionId": "…"} (token)
//	GET  /metrics                    Prometheus metrics (token), if MetricsHandler is set
//	GET  /admin, /admin/assets/NAME  the dashboard page (no data; no token)
func (h *Handler) Mount(r chi.Router) {
	r.Group(func(r chi.Router) {
		r.Use(h.authorize)
		r.Get("/api/turns", h.turns)
		r.Post("/api/turns/{runId}/abort", h.abort)
		r.Get("/api/diagnose", h.diagnose)
		r.Get("/api/stall-history", h.stallHistory)
		r.Get("/api/errors", h.errors)
		r.Get("/api/errors/{id}", h.errorDetail)
		r.Get("/api/approvals", h.approvals)
		r.Post("/api/approvals/{id}", h.resolveApproval)
		r.Get("/api/*", func(w http.ResponseWriter, _ *http.Request) {
			writeError(w, http.StatusNotFound, "no such API endpoint")
		})
		if h.opts.MetricsHandler != nil {
			r.Method(http.MethodGet, "/metrics", h.opts.MetricsHandler)
		}
	})
	r.Get("/admin", h.page.ServeHTTP)
	r.Get("/admin/", h.page.ServeHTTP)
	r.Get("/admin/assets/*", h.page.ServeHTTP)
}

// authorize lets a request through if it carries the operator token, or, with
// no token configured, if it comes from loopback and names a loopback host.
// POST requests must also be JSON and, when they carry an Origin, same-origin.
func (h *Handler) authorize(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := h.opts.OperatorToken
		if token == "" {
			if !loopbackClient(r) {
				writeJSON(w, http.StatusForbidden, apiError{Message: messages.AdminLoopbackOnly,
					Error: "forbidden: no operator token is configured (server.operatorToken), so the operator API answers only loopback clients"})
				return
			}
		} else {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || !server.TokenEqual(strings.TrimSpace(got), token) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="turnguard"`)
				writeJSON(w, http.StatusUnauthorized, apiError{Message: messages.AdminTokenNeeded,
					Error: "unauthorized: send Authorization: Bearer <server.operatorToken>"})
				return
			}
		}
		if r.Method == http.MethodPost {
			if origin := r.Header.Get("Origin"); origin != "" && !sameOrigin(origin, r.Host) {
				writeError(w, http.StatusForbidden, "forbidden: cross-origin request")
				return
			}
			if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				writeError(w, http.StatusUnsupportedMediaType, "send Content-Type: application/json")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// loopbackClient reports whether r comes from a loopback address and is
// addressed to a loopback host (localhost, 127.0.0.0/8, ::1).
func loopbackClient(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return false
	}
	return loopbackName(r.Host)
}

func loopbackName(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, host)
}

// writeJSON writes v with status; API answers are never cached.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// apiError is the body of every error answer.
// apiError is the body of a refused API request: Error for an API client
// (precise, naming headers and keys), Message, when set, for a person (the
// /admin page shows it instead of Error).
type apiError struct {
	Error   string `json:"error"`
	Message string `json:"message,omitempty"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Error: msg})
}
