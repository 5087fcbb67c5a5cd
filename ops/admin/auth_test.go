package admin_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/turnguard/turnguard/messages"
)

// TestAuthorization: the operator routes need the bearer operator token
// (compared in constant time by server.TokenEqual); with no token
// configured only loopback clients that name a loopback host get in; a
// POST must be JSON and same-origin.
func TestAuthorization(t *testing.T) {
	type req struct {
		method, path, auth, remote, host, origin, contentType string
	}
	tests := []struct {
		name      string
		noToken   bool // neither server.token nor server.operatorToken configured
		req       req
		wantCode  int
		wantInErr string
	}{
		{name: "no header", req: req{path: "/api/turns"}, wantCode: 401, wantInErr: "Bearer"},
		{name: "wrong token", req: req{path: "/api/turns", auth: "Bearer nope"}, wantCode: 401},
		{name: "token prefix", req: req{path: "/api/turns", auth: "Bearer " + opToken[:5]}, wantCode: 401},
		{name: "gateway token is not the operator token", req: req{path: "/api/turns", auth: "Bearer " + secrets[0]}, wantCode: 401},
		{name: "basic scheme", req: req{path: "/api/turns", auth: "Basic " + opToken}, wantCode: 401},
		{name: "right token", req: req{path: "/api/turns", auth: "Bearer " + opToken}, wantCode: 200},
		{name: "right token, extra space", req: req{path: "/api/turns", auth: "Bearer  " + opToken + " "}, wantCode: 200},
		{name: "diagnose needs it", req: req{path: "/api/diagnose"}, wantCode: 401},
		{name: "stall history needs it", req: req{path: "/api/stall-history"}, wantCode: 401},
		{name: "metrics needs it", req: req{path: "/metrics"}, wantCode: 401},
		{name: "unknown endpoint, no token: nothing revealed", req: req{path: "/api/secrets"}, wantCode: 401},
		{name: "unknown endpoint", req: req{path: "/api/secrets", auth: "Bearer " + opToken}, wantCode: 404, wantInErr: "no such API endpoint"},
		{name: "abort needs it", req: req{method: "POST", path: "/api/turns/x/abort", contentType: "application/json"}, wantCode: 401},
		{name: "abort must be JSON", req: req{method: "POST", path: "/api/turns/x/abort", auth: "Bearer " + opToken},
			wantCode: 415, wantInErr: "application/json"},
		{name: "abort from another origin", req: req{method: "POST", path: "/api/turns/x/abort", auth: "Bearer " + opToken,
			contentType: "application/json", origin: "https://evil.example"}, wantCode: 403, wantInErr: "cross-origin"},
		{name: "abort from the same origin", req: req{method: "POST", path: "/api/turns/x/abort", auth: "Bearer " + opToken,
			contentType: "application/json", origin: "http://127.0.0.1:18789", host: "127.0.0.1:18789"}, wantCode: 404},
		{name: "no token configured: loopback", noToken: true,
			req: req{path: "/api/turns", remote: "127.0.0.1:40000", host: "127.0.0.1:18789"}, wantCode: 200},
		{name: "no token configured: localhost over IPv6", noToken: true,
			req: req{path: "/api/diagnose", remote: "[::1]:40000", host: "localhost:18789"}, wantCode: 200},
		{name: "no token configured: a remote client", noToken: true,
			req: req{path: "/api/turns", remote: "192.0.2.7:40000", host: "127.0.0.1:18789"}, wantCode: 403, wantInErr: "loopback"},
		{name: "no token configured: a foreign host name (DNS rebinding)", noToken: true,
			req: req{path: "/api/turns", remote: "127.0.0.1:40000", host: "evil.example:18789"}, wantCode: 403},
		{name: "no token configured: metrics on loopback", noToken: true,
			req: req{path: "/metrics", remote: "127.0.0.1:40000", host: "localhost:18789"}, wantCode: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := testConfig(t)
				if tt.noToken {
					c.Server.Token, c.Server.OperatorToken = "", ""
				}
				e := newEnv(t, c)
				method := tt.req.method
				if method == "" {
					method = http.MethodGet
				}
				r := httptest.NewRequest(method, tt.req.path, strings.NewReader("{}"))
				if tt.req.auth != "" {
					r.Header.Set("Authorization", tt.req.auth)
				}
				if tt.req.remote != "" {
					r.RemoteAddr = tt.req.remote
				}
				if tt.req.host != "" {
					r.Host = tt.req.host
				}
				if tt.req.origin != "" {
					r.Header.Set("Origin", tt.req.origin)
				}
				if tt.req.contentType != "" {
					r.Header.Set("Content-Type", tt.req.contentType)
				}
				rec := httptest.NewRecorder()
				e.h.ServeHTTP(rec, r)
				body := drain(rec.Body)
				if rec.Code != tt.wantCode {
					t.Fatalf("%s %s: %d %s, want %d", method, tt.req.path, rec.Code, body, tt.wantCode)
				}
				if tt.wantInErr != "" && !strings.Contains(body, tt.wantInErr) && !strings.Contains(rec.Header().Get("WWW-Authenticate"), tt.wantInErr) {
					t.Errorf("answer %q lacks %q", body, tt.wantInErr)
				}
				// What the /admin page shows a person: plain words, never the
				// header an API client is told to send (issue 22).
				if rec.Code == 401 || rec.Code == 403 && tt.noToken {
					var refused struct{ Error, Message string }
					if err := json.Unmarshal([]byte(body), &refused); err != nil || refused.Error == "" {
						t.Errorf("refusal %q: no error for an API client (%v)", body, err)
					}
					want := messages.AdminTokenNeeded
					if rec.Code == 403 {
						want = messages.AdminLoopbackOnly
					}
					if refused.Message != want || strings.Contains(refused.Message, "Bearer") || strings.Contains(refused.Message, "Authorization") {
						t.Errorf("refusal message for a person %q, want %q", refused.Message, want)
					}
				}
				if rec.Code == 401 && rec.Header().Get("WWW-Authenticate") == "" {
					t.Errorf("401 without WWW-Authenticate")
				}
				for _, s := range secrets {
					if strings.Contains(body, s) {
						t.Errorf("the answer contains the secret %q", s)
					}
				}
			})
		})
	}
}
