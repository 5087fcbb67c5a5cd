// Package server owns turnguard's HTTP listener: the chi router that serves
// the web chat page and, on the same path, the WebSocket protocol ("/" with
// an Upgrade header goes to the protocol, without one to the page); the
// health and readiness probes (/healthz, /readyz); the rule that a listener
// off loopback needs a token (Listen refuses to start otherwise); and
// constant-time token comparison (TokenEqual, RequireToken) for everything
// that checks a token.
//
// Later routes (/metrics, /api/*, /admin) are added through Options.Mount;
// they are protected with RequireToken and the operator token.
package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/gorilla/websocket"
)

// Options configure the router.
type Options struct {
	// WebSocket serves protocol connections: every request to "/" that asks
	// for a WebSocket upgrade. nil answers such requests 503.
	WebSocket http.Handler
	// Page serves the web chat: GET / and its assets under /assets/. nil
	// answers 404.
	Page http.Handler
	// Ready reports whether the gateway accepts work; a non-nil error makes
	// /readyz answer 503 with the error's text. nil means always ready.
	Ready func() error
	// Mount, when set, adds routes to the router (/metrics, /api/*,
	// /admin). It is called once, after the built-in routes.
	Mount func(r chi.Router)
	// Log receives recovered handler panics. nil means slog.Default().
	Log *slog.Logger
	// AllowHost, when set, is asked about every request before routing; a
	// request it refuses is answered 403 and reaches no handler. With no
	// token configured the gateway sets it to LocalRequest, the guard
	// against DNS rebinding. nil serves every Host. POST
	// TelegramWebhookPath is never refused (it authenticates itself).
	AllowHost func(r *http.Request) bool
}

// NewRouter returns the gateway's HTTP handler:
//
//	GET  /healthz   200 {"ok":true} while the process serves requests
//	GET  /readyz    200 {"ready":true}, or 503 {"ready":false,"reason":…}
//	     /          a WebSocket upgrade → Options.WebSocket;
//	                GET or HEAD → Options.Page (the web chat)
//	GET  /assets/*  Options.Page (the web chat's files)
//
// Anything else is 404, or what Options.Mount adds. A panicking handler is
// logged and answered 500 rather than crashing the process.
func NewRouter(opts Options) http.Handler {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	r := chi.NewRouter()
	r.Use(recoverer(opts.Log))
	if opts.AllowHost != nil {
		r.Use(hostGuard(opts.AllowHost, opts.Log))
	}
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"ok": true})
	})
	r.Get("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if opts.Ready != nil {
			if err := opts.Ready(); err != nil {
				writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": err.Error()})
				return
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"ready": true})
	})
	page := opts.Page
	if page == nil {
		page = http.NotFoundHandler()
	}
	r.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		if websocket.IsWebSocketUpgrade(req) {
			if opts.WebSocket == nil {
				http.Error(w, "the WebSocket protocol is not available", http.StatusServiceUnavailable)
				return
			}
			opts.WebSocket.ServeHTTP(w, req)
			return
		}
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		page.ServeHTTP(w, req)
	})
	r.Method(http.MethodGet, "/assets/*", page)
	r.Method(http.MethodHead, "/assets/*", page)
	if opts.Mount != nil {
		opts.Mount(r)
	}
	return r
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func recoverer(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				if p := recover(); p != nil {
					if p == http.ErrAbortHandler {
						panic(p)
					}
					log.Error("http handler panicked", "method", r.Method, "path", r.URL.Path, "panic", p)
					// Headers may already be out; this is best-effort.
					http.Error(w, "internal error", http.StatusInternalServerError)
				}
			}()
			next.ServeHTTP(w, r)
		})
	}
}

// ErrTokenRequired is returned (wrapped in a *ListenError) by Listen for an
// address off loopback when no token is configured.
var ErrTokenRequired = errors.New("server.token is required when server.listen is not a loopback address")

// ListenError is a listener that could not be started. Its message names the
// address and says what to do; it never contains the token.
type ListenError struct {
	Listen string
	Err    error
}

func (e *ListenError) Error() string {
	if errors.Is(e.Err, ErrTokenRequired) {
		return fmt.Sprintf("refusing to listen on %s: server.token is required when server.listen is not a loopback address "+
			"(set server.token or GATEWAY_SERVER__TOKEN, or listen on 127.0.0.1)", e.Listen)
	}
	return fmt.Sprintf("listen on %s: %v", e.Listen, e.Err)
}

func (e *ListenError) Unwrap() error { return e.Err }

// Listen opens the TCP listener for addr ("host:port"). When token is empty
// it refuses, before binding, any address that is not loopback: an empty
// host, 0.0.0.0, [::], a non-loopback IP, or a name that resolves to any
// non-loopback address ("localhost" is loopback). It checks the bound
// address again afterwards. Errors are *ListenError.
func Listen(ctx context.Context, addr, token string) (net.Listener, error) {
	if token == "" {
		loop, err := isLoopbackHost(ctx, addr)
		if err != nil {
			return nil, &ListenError{Listen: addr, Err: err}
		}
		if !loop {
			return nil, &ListenError{Listen: addr, Err: ErrTokenRequired}
		}
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, &ListenError{Listen: addr, Err: err}
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && token == "" && !tcp.IP.IsLoopback() {
		ln.Close()
		return nil, &ListenError{Listen: addr, Err: ErrTokenRequired}
	}
	return ln, nil
}

// isLoopbackHost reports whether every address the host of addr stands for
// is a loopback address.
func isLoopbackHost(ctx context.Context, addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("must be host:port: %w", err)
	}
	if host == "" {
		return false, nil // every interface
	}
	if strings.EqualFold(host, "localhost") {
		return true, nil
	}
	h, _, _ := strings.Cut(host, "%") // an IPv6 zone
	if ip := net.ParseIP(h); ip != nil {
		return ip.IsLoopback(), nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return false, fmt.Errorf("resolve %s: %w", host, err)
	}
	for _, ip := range ips {
		if !ip.IP.IsLoopback() {
			return false, nil
		}
	}
	return len(ips) > 0, nil
}

// TokenEqual reports whether got equals want, in time that depends on
// neither their contents nor their lengths (both are hashed first). An empty
// want never matches: "no token configured" is not "any token".
func TokenEqual(got, want string) bool {
	if want == "" {
		return false
	}
	g := sha256.Sum256([]byte(got))
	w := sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// RequireToken is middleware for operator routes (/api, /admin, /metrics):
// the request must carry "Authorization: Bearer <token>", compared with
// TokenEqual. A missing or wrong token is 401 with a WWW-Authenticate
// header; an empty token (none configured) refuses every request with 403,
// so an operator route is never open by accident.
func RequireToken(token string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if token == "" {
				http.Error(w, "forbidden: no operator token is configured (server.operatorToken)", http.StatusForbidden)
				return
			}
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || !TokenEqual(strings.TrimSpace(got), token) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="turnguard"`)
				http.Error(w, "unauthorized: a valid bearer token is required", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// HTTPServer returns the *http.Server for h with the gateway's limits: 10 s
// to read request headers, 2 min idle keep-alive. There is no read or write
// timeout on whole requests, since WebSocket connections (hijacked from it)
// live for hours. Errors of the server itself go to log.
func HTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	if log == nil {
		log = slog.Default()
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// TelegramWebhookPath is where Telegram POSTs updates in webhook mode. The
// host guard does not apply to POSTs there: Telegram reaches the gateway
// through a tunnel or proxy that forwards the public Host, and the webhook
// authenticates every request itself by its secret header
// (channels.telegram.webhookSecret, required in webhook mode).
const TelegramWebhookPath = "/telegram/webhook"

// hostGuard refuses requests allow says no to (see LocalRequest), except
// POST TelegramWebhookPath.
func hostGuard(allow func(*http.Request) bool, log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			webhook := r.Method == http.MethodPost && r.URL.Path == TelegramWebhookPath
			if !webhook && !allow(r) {
				log.Debug("request for a host name that is not served without a token refused", "host", clipHost(r.Host), "ip", r.RemoteAddr)
				http.Error(w, ErrForeignHost.Error(), http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// ErrForeignHost is the answer to a request refused by LocalRequest.
var ErrForeignHost = errors.New("forbidden: without server.token this gateway answers only requests addressed to " +
	"localhost, 127.0.0.1 or [::1] (add other names to server.allowedHosts, or set server.token)")

// LocalRequest reports whether r is addressed to this gateway by a local
// name: its Host is localhost, a loopback IP (127.0.0.0/8, [::1]) or one of
// names (case-insensitive, any port), and its Origin, when it has one, is
// too. This is what a gateway without a token serves: a web page that a
// DNS rebinding attack has pointed at 127.0.0.1 still says Host:
// evil.example, so it reaches nothing.
func LocalRequest(r *http.Request, names []string) bool {
	if !LocalHost(r.Host, names) {
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && LocalHost(u.Host, names)
}

// LocalHost reports whether hostport ("name", "name:port", "[::1]:port")
// names a loopback address or one of names.
func LocalHost(hostport string, names []string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if host == "" {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	for _, n := range names {
		if strings.EqualFold(host, strings.TrimSuffix(n, ".")) {
			return true
		}
	}
	return false
}

func clipHost(h string) string {
	if len(h) > 100 {
		return h[:100] + "…"
	}
	return h
}
