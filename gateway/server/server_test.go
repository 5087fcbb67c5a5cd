package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/gorilla/websocket"
)

const secret = "s3cret-token-value"

// echoWS is a stand-in for the protocol: it upgrades and echoes one frame.
func echoWS(t *testing.T) http.Handler {
	up := websocket.Upgrader{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			t.Errorf("upgrade: %v", err)
			return
		}
		defer c.Close()
		typ, msg, err := c.ReadMessage()
		if err != nil {
			return
		}
		_ = c.WriteMessage(typ, append([]byte("echo:"), msg...))
	})
}

var page = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	io.WriteString(w, "<html>chat page "+r.URL.Path+"</html>")
})

func TestRoutes(t *testing.T) {
	notReady := errors.New("shutting down")
	tests := []struct {
		name     string
		opts     Options
		method   string
		path     string
		upgrade  bool
		wantCode int
		wantBody string
	}{
		{"healthz", Options{}, "GET", "/healthz", false, 200, `{"ok":true}`},
		{"readyz ready", Options{Ready: func() error { return nil }}, "GET", "/readyz", false, 200, `{"ready":true}`},
		{"readyz without check", Options{}, "GET", "/readyz", false, 200, `{"ready":true}`},
		{"readyz not ready", Options{Ready: func() error { return notReady }}, "GET", "/readyz", false, 503, `{"ready":false,"reason":"shutting down"}`},
		{"page", Options{Page: page}, "GET", "/", false, 200, "chat page /"},
		{"page head", Options{Page: page}, "HEAD", "/", false, 200, "chat page /"},
		{"page query", Options{Page: page}, "GET", "/?token=x", false, 200, "chat page /"},
		{"assets", Options{Page: page}, "GET", "/assets/chat.js", false, 200, "chat page /assets/chat.js"},
		{"no page", Options{}, "GET", "/", false, 404, "404 page not found"},
		{"post to root", Options{Page: page}, "POST", "/", false, 405, "method not allowed"},
		{"upgrade without protocol", Options{Page: page}, "GET", "/", true, 503, "the WebSocket protocol is not available"},
		{"unknown path", Options{Page: page}, "GET", "/nope", false, 404, "404 page not found"},
		{"mounted", Options{Mount: func(r chi.Router) {
			r.Get("/metrics", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "metrics here") })
		}}, "GET", "/metrics", false, 200, "metrics here"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := NewRouter(tc.opts)
			req := httptest.NewRequest(tc.method, tc.path, nil)
			if tc.upgrade {
				req.Header.Set("Connection", "Upgrade")
				req.Header.Set("Upgrade", "websocket")
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.wantCode {
				t.Fatalf("%s %s: status %d, want %d (body %q)", tc.method, tc.path, rec.Code, tc.wantCode, rec.Body)
			}
			if got := strings.TrimSpace(rec.Body.String()); !strings.Contains(got, tc.wantBody) {
				t.Errorf("%s %s: body %q, want it to contain %q", tc.method, tc.path, got, tc.wantBody)
			}
		})
	}
}

// TestUpgradeOnRoot checks over real TCP that "/" serves both: a WebSocket
// client reaches the protocol, a browser gets the page.
func TestUpgradeOnRoot(t *testing.T) {
	srv := httptest.NewServer(NewRouter(Options{WebSocket: echoWS(t), Page: page}))
	defer srv.Close()

	c, resp, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http")+"/", nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade status %d", resp.StatusCode)
	}
	if err := c.WriteMessage(websocket.TextMessage, []byte(`{"type":"req"}`)); err != nil {
		t.Fatal(err)
	}
	_, msg, err := c.ReadMessage()
	if err != nil || string(msg) != `echo:{"type":"req"}` {
		t.Fatalf("read %q, %v", msg, err)
	}

	res, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), "chat page") {
		t.Fatalf("GET /: %d %q", res.StatusCode, body)
	}
}

func TestPanickingHandlerIsLogged(t *testing.T) {
	var logs bytes.Buffer
	h := NewRouter(Options{
		Log: slog.New(slog.NewTextHandler(&logs, nil)),
		Mount: func(r chi.Router) {
			r.Get("/boom", func(http.ResponseWriter, *http.Request) { panic("kaboom") })
		},
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/boom", nil))
	if rec.Code != 500 {
		t.Fatalf("status %d, want 500", rec.Code)
	}
	if !strings.Contains(logs.String(), "kaboom") || !strings.Contains(logs.String(), "/boom") {
		t.Fatalf("log %q does not name the panic and path", logs.String())
	}
}

func TestListen(t *testing.T) {
	tests := []struct {
		name      string
		addr      string
		token     string
		wantErr   error // nil: must listen
		wantInErr string
	}{
		{"loopback v4 without token", "127.0.0.1:0", "", nil, ""},
		{"loopback other v4 without token", "127.0.0.2:0", "", nil, ""},
		{"localhost without token", "localhost:0", "", nil, ""},
		{"all interfaces without token", "0.0.0.0:0", "", ErrTokenRequired, "refusing to listen on 0.0.0.0:0: server.token is required"},
		{"empty host without token", ":0", "", ErrTokenRequired, "server.token is required when server.listen is not a loopback address"},
		{"v6 any without token", "[::]:0", "", ErrTokenRequired, "GATEWAY_SERVER__TOKEN"},
		{"all interfaces with token", "0.0.0.0:0", secret, nil, ""},
		{"not host:port", "127.0.0.1", "", nil, "must be host:port"},
		{"bad port", "127.0.0.1:99999", secret, nil, "listen on 127.0.0.1:99999"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := Listen(context.Background(), tc.addr, tc.token)
			if tc.wantErr == nil && tc.wantInErr == "" {
				if err != nil {
					t.Fatalf("Listen(%q): %v", tc.addr, err)
				}
				ln.Close()
				return
			}
			if err == nil {
				ln.Close()
				t.Fatalf("Listen(%q) with token %q listened, want an error", tc.addr, tc.token)
			}
			var le *ListenError
			if !errors.As(err, &le) {
				t.Fatalf("error %T, want *ListenError", err)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("error %v, want %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantInErr) {
				t.Errorf("error %q does not contain %q", err, tc.wantInErr)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error %q contains the token", err)
			}
		})
	}
}

func TestListenRefusesBeforeBinding(t *testing.T) {
	// A port already taken on every interface: refusing must not depend on
	// (or report) the bind.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	_, port, _ := net.SplitHostPort(taken.Addr().String())
	_, err = Listen(context.Background(), "0.0.0.0:"+port, "")
	if !errors.Is(err, ErrTokenRequired) {
		t.Fatalf("error %v, want ErrTokenRequired", err)
	}
}

func TestTokenEqual(t *testing.T) {
	tests := []struct {
		got, want string
		equal     bool
	}{
		{secret, secret, true},
		{"s3cret-token-valuf", secret, false},
		{"s3cret", secret, false},     // a prefix
		{secret + "x", secret, false}, // longer
		{"", secret, false},           // missing
		{"", "", false},               // nothing configured never matches
		{"anything", "", false},       // nothing configured never matches
		{"ünïcode-tøken", "ünïcode-tøken", true},
	}
	for _, tc := range tests {
		if got := TokenEqual(tc.got, tc.want); got != tc.equal {
			t.Errorf("TokenEqual(%q, %q) = %v, want %v", tc.got, tc.want, got, tc.equal)
		}
	}
}

func TestRequireToken(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "admin page") })
	tests := []struct {
		name     string
		token    string
		header   string
		wantCode int
		wantBody string
	}{
		{"right token", secret, "Bearer " + secret, 200, "admin page"},
		{"wrong token", secret, "Bearer nope", 401, "unauthorized"},
		{"no header", secret, "", 401, "unauthorized"},
		{"basic auth", secret, "Basic " + secret, 401, "unauthorized"},
		{"prefix of token", secret, "Bearer s3cret", 401, "unauthorized"},
		{"none configured", "", "Bearer ", 403, "no operator token is configured"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest("GET", "/api/x", nil)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			rec := httptest.NewRecorder()
			RequireToken(tc.token)(ok).ServeHTTP(rec, req)
			if rec.Code != tc.wantCode || !strings.Contains(rec.Body.String(), tc.wantBody) {
				t.Fatalf("status %d body %q, want %d containing %q", rec.Code, rec.Body, tc.wantCode, tc.wantBody)
			}
			if rec.Code == 401 && rec.Header().Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			if strings.Contains(rec.Body.String(), secret) {
				t.Error("response contains the token")
			}
		})
	}
}

func TestProbeBodiesAreJSON(t *testing.T) {
	h := NewRouter(Options{Ready: func() error { return errors.New("store not open") }})
	for _, path := range []string{"/healthz", "/readyz"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", path, ct)
		}
		var v map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Errorf("%s: body %q is not JSON: %v", path, rec.Body, err)
		}
	}
}

// TestRouterRefusesForeignHostWithoutToken: every route the page uses (the
// page, its assets, the probes, the WebSocket) refuses a request addressed
// to a name that is not local when the gateway runs without a token
// (AllowHost = LocalRequest): the DNS rebinding guard.
func TestRouterRefusesForeignHostWithoutToken(t *testing.T) {
	page := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "page") })
	h := NewRouter(Options{Page: page, WebSocket: page,
		AllowHost: func(r *http.Request) bool { return LocalRequest(r, []string{"gateway.lan"}) }})
	srv := httptest.NewServer(h)
	defer srv.Close()
	tests := []struct {
		path, host, origin string
		want               int
	}{
		{"/", "evil.example:18789", "", http.StatusForbidden},
		{"/assets/chat.js", "evil.example", "", http.StatusForbidden},
		{"/healthz", "evil.example", "", http.StatusForbidden},
		{"/", "127.0.0.1:18789", "http://evil.example:18789", http.StatusForbidden},
		{"/", "127.0.0.1:18789", "", http.StatusOK},
		{"/", "localhost:18789", "http://localhost:18789", http.StatusOK},
		{"/", "[::1]:18789", "", http.StatusOK},
		{"/", "GATEWAY.LAN:18789", "", http.StatusOK},
		{"/healthz", "127.0.0.5", "", http.StatusOK},
	}
	for _, tc := range tests {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+tc.path, nil)
		req.Host = tc.host
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s Host %q Origin %q: %d %q, want %d", tc.path, tc.host, tc.origin, resp.StatusCode, body, tc.want)
		}
	}
}

// TestTelegramWebhookIsNotHostGuarded: in webhook mode without
// server.token, a tunnel or proxy forwards Telegram's POST with the public
// Host; the DNS rebinding guard used to answer it 403, and updates stopped
// arriving without a word. The webhook authenticates itself (its secret
// header), so POST /telegram/webhook passes the guard with any Host; other
// methods on it and every other route are still guarded.
func TestTelegramWebhookIsNotHostGuarded(t *testing.T) {
	hook := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "update taken") })
	h := NewRouter(Options{
		AllowHost: func(r *http.Request) bool { return LocalRequest(r, nil) },
		Mount: func(r chi.Router) {
			r.Method(http.MethodPost, TelegramWebhookPath, hook)
			r.Method(http.MethodGet, TelegramWebhookPath, hook)
			r.Method(http.MethodPost, "/api/x", hook)
		},
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	tests := []struct {
		method, path string
		want         int
	}{
		{http.MethodPost, "/telegram/webhook", http.StatusOK},
		{http.MethodGet, "/telegram/webhook", http.StatusForbidden},
		{http.MethodPost, "/telegram/webhook/", http.StatusForbidden},
		{http.MethodPost, "/api/x", http.StatusForbidden},
	}
	for _, tc := range tests {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(`{"update_id":1}`))
		req.Host = "bot.example.com"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s with the public Host: %d %q, want %d", tc.method, tc.path, resp.StatusCode, body, tc.want)
		}
	}
}
