package ws

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/turnguard/turnguard/config"
)

// dialAs opens a WebSocket to e's TCP server with the given Host and Origin
// headers (an empty one is not sent). The TCP peer is always 127.0.0.1: a
// DNS rebinding attack reaches the loopback listener with a foreign Host.
func (e *env) dialAs(host, origin string) (*websocket.Conn, *http.Response, error) {
	h := http.Header{}
	if host != "" {
		h.Set("Host", host)
	}
	if origin != "" {
		h.Set("Origin", origin)
	}
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	return d.Dial("ws"+strings.TrimPrefix(e.http.URL, "http")+"/", h)
}

// TestDNSRebindingRefusedWithoutToken: with no token (the default make run)
// a page served from evil.example whose name was rebound to 127.0.0.1
// cannot open the WebSocket; the gateway's own page (Host and Origin
// 127.0.0.1 / localhost) and the Node clients (no Origin) still can, and
// so can a name the operator lists in server.allowedHosts.
func TestDNSRebindingRefusedWithoutToken(t *testing.T) {
	e := newTCPEnv(t, envOpts{adjust: func(c *config.Config) { c.Server.AllowedHosts = []string{"gateway.lan"} }})
	port := e.http.URL[strings.LastIndex(e.http.URL, ":")+1:]
	refused := []struct{ name, host, origin string }{
		{"rebound page", "evil.example:" + port, "http://evil.example:" + port},
		{"rebound name, no origin", "evil.example:" + port, ""},
		{"loopback host, foreign origin", "127.0.0.1:" + port, "http://evil.example:" + port},
		{"look-alike suffix", "localhost.evil.example:" + port, "http://localhost.evil.example:" + port},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			ws, resp, err := e.dialAs(tc.host, tc.origin)
			if err == nil {
				ws.Close()
				t.Fatalf("attacker's upgrade with Host %q Origin %q was accepted", tc.host, tc.origin)
			}
			if resp == nil || resp.StatusCode != http.StatusForbidden {
				t.Fatalf("attacker got %v, %v; want HTTP 403", resp, err)
			}
			body, _ := io.ReadAll(resp.Body)
			if !strings.Contains(string(body), "server.allowedHosts") {
				t.Errorf("403 body does not say what to do: %q", body)
			}
		})
	}
	accepted := []struct{ name, host, origin string }{
		{"web chat page on 127.0.0.1", "127.0.0.1:" + port, "http://127.0.0.1:" + port},
		{"web chat page on localhost", "localhost:" + port, "http://localhost:" + port},
		{"Node CLI/TUI", "127.0.0.1:" + port, ""},
		{"listed name", "gateway.lan:" + port, "http://gateway.lan:" + port},
	}
	for _, tc := range accepted {
		t.Run(tc.name, func(t *testing.T) {
			ws, _, err := e.dialAs(tc.host, tc.origin)
			if err != nil {
				t.Fatalf("legitimate upgrade refused: %v", err)
			}
			c := &client{t: t, ws: ws}
			t.Cleanup(func() { ws.Close() })
			c.read() // challenge
			if hello := c.call("connect", connectFixture(t, "cli", "-")); !hello.OK {
				t.Fatalf("connect: %s", hello.raw)
			}
			if h := c.call("chat.history", map[string]any{"sessionKey": "main"}); !h.OK {
				t.Fatalf("chat.history: %s", h.raw)
			}
		})
	}
}

// TestForeignHostAllowedWithToken: with a token the token is the guard; any
// Host may upgrade, and a client without the token is refused at connect.
func TestForeignHostAllowedWithToken(t *testing.T) {
	e := newTCPEnv(t, envOpts{opts: Options{Token: "a-long-enough-token"}})
	ws, _, err := e.dialAs("gateway.example.com", "")
	if err != nil {
		t.Fatalf("upgrade with a token configured: %v", err)
	}
	c := &client{t: t, ws: ws}
	t.Cleanup(func() { ws.Close() })
	c.read()
	if hello := c.call("connect", connectFixture(t, "cli", "-")); hello.OK {
		t.Fatalf("connect without the token succeeded: %s", hello.raw)
	}
}

// TestDefaultFrameLimitFitsTheLongestMessage: with the default
// configuration a client sending 3 MiB frames (the attack sent 25 MB ones
// from 20 clients) is closed with 1009 after at most 1 MiB is read, while
// the longest message a user may send — server.maxMessageChars (100,000)
// four-byte characters, 400 KB of JSON — is still accepted.
func TestDefaultFrameLimitFitsTheLongestMessage(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	if got := e.cfg.Current().Server.MaxPayloadBytes; got != 1<<20 {
		t.Fatalf("default server.maxPayloadBytes = %d, want 1 MiB", got)
	}
	user, _ := e.connect("cli", "-")
	msg := strings.Repeat("😀", e.cfg.Current().Server.MaxMessageChars)
	if res := user.call("chat.send", map[string]any{"sessionKey": "big", "message": msg, "idempotencyKey": "big-1"}); !res.OK {
		t.Fatalf("the longest allowed message was refused: %.200s", res.raw)
	}
	for i := range 3 {
		attacker, _ := e.connect("cli", "-")
		big := `{"type":"req","id":"x","method":"chat.send","params":{"message":"` + strings.Repeat("a", 3<<20) + `"}}`
		go attacker.ws.WriteMessage(websocket.TextMessage, []byte(big))
		if code, _ := attacker.closed(); code != websocket.CloseMessageTooBig {
			t.Fatalf("attacker %d: close %d, want 1009", i, code)
		}
	}
	if res := user.call("health", nil); !res.OK {
		t.Fatalf("the legitimate client after the attack: %s", res.raw)
	}
}
