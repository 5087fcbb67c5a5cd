package ws

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/turnguard/turnguard/config"
)

func TestHandshakeHelloIsComplete(t *testing.T) {
	for _, fixture := range []string{"cli", "tui", "probe"} {
		t.Run(fixture, func(t *testing.T) {
			e := newTCPEnv(t, envOpts{adjust: func(c *config.Config) { c.Server.TickIntervalMs = 15000 },
				opts: Options{Token: "T", Version: "turnguard 0.1.0"}})
			c := e.connectRaw("")
			ch := c.read()
			if ch.Event != "connect.challenge" || ch.Seq != nil {
				t.Fatalf("first frame: %s", ch.raw)
			}
			if ch.str("nonce") == "" {
				t.Fatalf("challenge without nonce: %s", ch.raw)
			}
			if ts, ok := ch.get("ts").(float64); !ok || ts != float64(int64(ts)) || ts < 1.7e12 {
				t.Fatalf("challenge ts is not integer unix ms: %s", ch.raw)
			}
			hello := c.call("connect", connectFixture(t, fixture, ""))
			if !hello.OK {
				t.Fatalf("connect: %s", hello.raw)
			}
			want := map[string]any{
				"type":                           "hello-ok",
				"protocol":                       float64(4),
				"server.version":                 "turnguard 0.1.0",
				"snapshot.stateVersion.presence": float64(0),
				"snapshot.sessionDefaults.mainSessionKey": "agent:main:main",
				"snapshot.health.ok":                      true,
				"snapshot.authMode":                       "token",
				"auth.role":                               "operator",
				"policy.tickIntervalMs":                   float64(15000),
				"policy.maxPayload":                       float64(1 << 20),
			}
			for path, v := range want {
				if got := hello.get(path); got != v {
					t.Errorf("hello %s = %v, want %v", path, got, v)
				}
			}
			for _, path := range []string{"server.connId", "features.methods", "features.events", "snapshot.presence",
				"snapshot.uptimeMs", "auth.scopes", "policy.maxBufferedBytes"} {
				if hello.get(path) == nil {
					t.Errorf("hello has no %s: %s", path, hello.raw)
				}
			}
			methods, _ := hello.get("features.methods").([]any)
			for _, m := range []string{"chat.send", "chat.abort", "chat.history", "agent", "agent.wait", "sessions.subscribe"} {
				if !strings.Contains(hello.str("features.methods"), m) {
					t.Errorf("features.methods %v lacks %s", methods, m)
				}
			}
			if r := c.call("health", nil); !r.OK || r.get("ok") != true {
				t.Fatalf("health after hello: %s", r.raw)
			}
		})
	}
}

// TestHandshakeRefusals: every way a handshake can fail gets a clear error
// response (when there is a request to answer) and the documented close
// code.
func TestHandshakeRefusals(t *testing.T) {
	cases := []struct {
		name      string
		frame     string // sent after the challenge
		binary    bool
		wantCode  string // error.code of the response ("" = no response expected)
		wantMsg   string // prefix of error.message
		wantDet   string // error.details.code
		wantClose int
	}{
		{name: "protocol too new", frame: `{"type":"req","id":"1","method":"connect","params":{"minProtocol":5,"maxProtocol":6,"auth":{"token":"T"}}}`,
			wantCode: "INVALID_REQUEST", wantMsg: "protocol mismatch", wantDet: "PROTOCOL_MISMATCH", wantClose: 1002},
		{name: "protocol too old", frame: `{"type":"req","id":"1","method":"connect","params":{"minProtocol":2,"maxProtocol":3,"auth":{"token":"T"}}}`,
			wantCode: "INVALID_REQUEST", wantMsg: "protocol mismatch", wantDet: "PROTOCOL_MISMATCH", wantClose: 1002},
		{name: "wrong token", frame: `{"type":"req","id":"1","method":"connect","params":{"minProtocol":4,"maxProtocol":4,"auth":{"token":"nope"}}}`,
			wantCode: "INVALID_REQUEST", wantMsg: "unauthorized: gateway token mismatch", wantDet: "AUTH_TOKEN_MISMATCH", wantClose: 1008},
		{name: "no token", frame: `{"type":"req","id":"1","method":"connect","params":{"minProtocol":4,"maxProtocol":4}}`,
			wantCode: "INVALID_REQUEST", wantMsg: "unauthorized: gateway token missing", wantDet: "AUTH_TOKEN_MISSING", wantClose: 1008},
		{name: "request before connect", frame: `{"type":"req","id":"1","method":"health"}`,
			wantCode: "INVALID_REQUEST", wantMsg: "connect required", wantClose: 1008},
		{name: "connect without protocol range", frame: `{"type":"req","id":"1","method":"connect","params":{"auth":{"token":"T"}}}`,
			wantCode: "INVALID_REQUEST", wantMsg: "invalid connect params: minProtocol and maxProtocol are required", wantClose: 1008},
		{name: "connect params of wrong type", frame: `{"type":"req","id":"1","method":"connect","params":{"minProtocol":"4","maxProtocol":4}}`,
			wantCode: "INVALID_REQUEST", wantMsg: "invalid connect params: minProtocol must be a number", wantClose: 1008},
		{name: "malformed JSON", frame: `{"type":"req","id":`,
			wantCode: "INVALID_REQUEST", wantMsg: "invalid frame: malformed JSON", wantClose: 1008},
		{name: "binary frame", frame: `{}`, binary: true, wantClose: 1003},
		{name: "oversized frame", frame: `{"type":"req","id":"1","method":"connect","params":{"x":"` + strings.Repeat("a", 70<<10) + `"}}`,
			wantClose: 1009},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTCPEnv(t, envOpts{opts: Options{Token: "T"}})
			c := e.connectRaw("")
			c.read() // challenge
			mt := websocket.TextMessage
			if tc.binary {
				mt = websocket.BinaryMessage
			}
			if err := c.ws.WriteMessage(mt, []byte(tc.frame)); err != nil {
				t.Fatal(err)
			}
			code, _ := c.closed()
			if code != tc.wantClose {
				t.Errorf("close code %d, want %d", code, tc.wantClose)
			}
			var res *frame
			for i := range c.pending {
				if c.pending[i].Type == "res" {
					res = &c.pending[i]
				}
			}
			if tc.wantCode == "" {
				if res != nil {
					t.Errorf("unexpected response %s", res.raw)
				}
				return
			}
			if res == nil {
				t.Fatalf("no error response before the close; frames:\n%s", c.dump())
			}
			if res.OK || res.Error.Code != tc.wantCode || !strings.HasPrefix(res.Error.Message, tc.wantMsg) {
				t.Errorf("response %s, want %s %q…", res.raw, tc.wantCode, tc.wantMsg)
			}
			if tc.wantDet != "" {
				det, _ := json.Marshal(res.Error.Details)
				if !strings.Contains(string(det), `"code":"`+tc.wantDet+`"`) {
					t.Errorf("details %s, want code %s", det, tc.wantDet)
				}
			}
			if strings.Contains(e.logs.String(), "nope") {
				t.Error("the presented token appears in the log")
			}
		})
	}
}

func TestProtocolMismatchDetails(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c := e.connectRaw("")
	c.read()
	r := c.call("connect", map[string]any{"minProtocol": 5, "maxProtocol": 7})
	det, _ := json.Marshal(r.Error.Details)
	if string(det) != `{"clientMaxProtocol":7,"clientMinProtocol":5,"code":"PROTOCOL_MISMATCH","expectedProtocol":4}` {
		t.Fatalf("details %s", det)
	}
}

func TestTokensAndOperator(t *testing.T) {
	cases := []struct {
		name, token, opToken, present string
		ok, operator                  bool
	}{
		{name: "no auth configured, no token", present: "-", ok: true},
		{name: "no auth configured, any token", present: "whatever", ok: true},
		{name: "shared token", token: "T", present: "T", ok: true},
		{name: "operator token", token: "T", opToken: "OP", present: "OP", ok: true, operator: true},
		{name: "operator token without shared token", opToken: "OP", present: "OP", ok: true, operator: true},
		// config's default (server.operatorToken unset): the holder of
		// server.token is the operator, as on /api and /admin (issue 22).
		{name: "operator token equal to the shared token: its holder is the operator", token: "T", opToken: "T", present: "T", ok: true, operator: true},
		{name: "wrong token", token: "T", opToken: "OP", present: "OPX"},
		{name: "prefix of token", token: "TT", present: "T"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTCPEnv(t, envOpts{opts: Options{Token: tc.token, OperatorToken: tc.opToken}})
			c := e.connectRaw("")
			c.read()
			r := c.call("connect", connectFixture(t, "cli", tc.present))
			if r.OK != tc.ok {
				t.Fatalf("connect ok=%v, want %v: %s", r.OK, tc.ok, r.raw)
			}
			if tc.ok && r.get("auth.operator") != tc.operator {
				t.Fatalf("operator %v, want %v", r.get("auth.operator"), tc.operator)
			}
		})
	}
}

func TestConnectionLimitPerIP(t *testing.T) {
	e := newTCPEnv(t, envOpts{adjust: func(c *config.Config) { c.Server.MaxConnsPerIP = 2 }})
	e.connect("cli", "")
	e.connect("cli", "")
	_, resp, err := e.dial("")
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third connection: %v %v, want HTTP 429", err, resp)
	}
	if n := e.srv.Clients(); n != 2 {
		t.Fatalf("Clients() = %d, want 2", n)
	}
}

func TestCrossOriginBrowserRefused(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	d := websocket.Dialer{}
	_, resp, err := d.Dial("ws"+strings.TrimPrefix(e.http.URL, "http")+"/", http.Header{"Origin": {"https://evil.example"}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-origin upgrade: %v %v, want 403", err, resp)
	}
}
