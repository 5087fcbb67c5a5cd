package ws

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
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

// heapNow is the live heap after a collection.
func heapNow() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestHistoryFloodFromNonReaderIsBounded reproduces the memory
// amplification attack: a client that never reads asks 30 times for the
// history of a 3 MB session. Before, every answer (3 MB each) was queued —
// 256 frames allowed, bytes not counted — and the heap grew by ~90 MB.
// Now each answer is at most server.maxAnswerBytes (1 MiB), the client's
// queue at most server.sendQueueBytes (8 MiB): it is closed with 1013 and
// the heap stays bounded. The legitimate user still gets the history's
// newest messages, after a marker saying how many are not shown.
func TestHistoryFloodFromNonReaderIsBounded(t *testing.T) {
	e := newTCPEnv(t, envOpts{adjust: func(c *config.Config) {
		c.Server.MaxMessageChars = 1_000_000
		c.Server.MaxPayloadBytes = 2 << 20
	}})
	fillBigSession(e)
	user, _ := e.connect("cli", "-")
	growth, attacker := historyFlood(e, 30, 20*time.Second)
	if e.srv.Stats().SlowClosed == 0 {
		t.Fatalf("the client that never reads was not closed (heap grew by %d MB)", growth>>20)
	}
	if growth > 48<<20 {
		t.Errorf("heap grew by %d MB while a client that never reads asked for the history 30 times", growth>>20)
	}
	if code, _ := attacker.closed(); code != 1013 {
		t.Errorf("attacker closed with %d, want 1013", code)
	}

	h := user.call("chat.history", map[string]any{"sessionKey": "big", "limit": 200})
	if !h.OK || len(h.raw) > 1<<20 {
		t.Fatalf("history answer: ok=%v, %d bytes", h.OK, len(h.raw))
	}
	if h.get("truncated") != true {
		t.Errorf("a cut history does not say so: truncated=%v", h.get("truncated"))
	}
	msgs, _ := h.get("messages").([]any)
	if len(msgs) < 2 || !strings.Contains(lookup(msgs[0], "content.0.text").(string), "earlier messages are not shown") {
		t.Fatalf("history does not start with the marker: %.300s", h.raw)
	}
	if last := lookup(msgs[len(msgs)-1], "content.0.text").(string); !strings.Contains(last, "2xxxx") {
		t.Errorf("the newest message is not the last one: %.80s", last)
	}
	if e.srv.Stats().Buffered < 0 {
		t.Errorf("buffered bytes went negative: %d", e.srv.Stats().Buffered)
	}
}

// historyFlood connects a client that never reads, has it ask for the
// history of session "big" n times, and samples the heap until the server
// closes that client or wait passes. It returns the peak heap growth over
// the heap before the flood.
func historyFlood(e *env, n int, wait time.Duration) (int64, *client) {
	before := heapNow()
	attacker, _ := e.connect("cli", "-")
	for range n {
		attacker.request("chat.history", map[string]any{"sessionKey": "big", "limit": 200})
	}
	var peak uint64
	closed := e.srv.Stats().SlowClosed
	for deadline := time.Now().Add(wait); e.srv.Stats().SlowClosed == closed && time.Now().Before(deadline); {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		peak = max(peak, m.HeapAlloc)
		time.Sleep(5 * time.Millisecond) // real time: the server works on a real socket; sampling the heap while it does
	}
	growth := int64(peak) - int64(before)
	e.t.Logf("heap before %d MB, peak while flooded %d MB (growth %d MB), buffered %d bytes",
		before>>20, peak>>20, growth>>20, e.srv.Stats().Buffered)
	return growth, attacker
}

// BenchmarkHistoryFloodHeap: the heap growth while a client that never reads
// asks 30 times for the history of a 3 MB session, with the byte budgets
// (defaults) and, as the baseline in the same run, with budgets so large
// they never bind (the old behaviour: every answer queued). One op is one
// flood; peak-MB is the growth, closed whether the server closed the client
// (1013) within 3 s.
func BenchmarkHistoryFloodHeap(b *testing.B) {
	for _, bc := range []struct {
		name   string
		adjust func(*config.Config)
	}{
		{"budgets", func(*config.Config) {}},
		{"unbounded", func(c *config.Config) {
			c.Server.SendQueueBytes, c.Server.SendBufferBytes, c.Server.MaxAnswerBytes = 1<<30, 16<<30, 64<<20
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var growth, closed float64
			for range b.N {
				e := newTCPEnv(b, envOpts{adjust: func(c *config.Config) {
					c.Server.MaxMessageChars = 1_000_000
					c.Server.MaxPayloadBytes = 2 << 20
					bc.adjust(c)
				}})
				fillBigSession(e)
				before := e.srv.Stats().SlowClosed
				g, _ := historyFlood(e, 30, 3*time.Second)
				growth += float64(g)
				if e.srv.Stats().SlowClosed > before {
					closed++
				}
			}
			b.ReportMetric(growth/float64(b.N)/(1<<20), "peak-MB")
			b.ReportMetric(closed/float64(b.N), "closed")
		})
	}
}

// fillBigSession gives session "big" three 1 MB messages.
func fillBigSession(e *env) {
	user, _ := e.connect("cli", "-")
	for i := range 3 {
		run := fmt.Sprintf("big-%d", i)
		msg := fmt.Sprintf("%d%s", i, strings.Repeat("x", 1_000_000-1))
		if res := user.call("chat.send", map[string]any{"sessionKey": "big", "message": msg, "idempotencyKey": run}); !res.OK {
			e.t.Fatalf("send: %.200s", res.raw)
		}
		user.chat(run, "final")
	}
}

// TestSessionsListAnswerIsCapped: with 20,000 sessions, sessions.list
// without a limit answers at most server.maxAnswerBytes (the most recent
// sessions, truncated:true) instead of 5 MB; the TUI's own call (limit 1)
// is unchanged.
func TestSessionsListAnswerIsCapped(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	for i := range 20000 {
		e.eng.Reset(fmt.Sprintf("agent:main:s%05d", i))
	}
	c, _ := e.connect("tui", "-")
	all := c.call("sessions.list", map[string]any{})
	if !all.OK || len(all.raw) > e.cfg.Current().Server.MaxAnswerBytes {
		t.Fatalf("sessions.list: ok=%v, %d bytes (limit %d)", all.OK, len(all.raw), e.cfg.Current().Server.MaxAnswerBytes)
	}
	if all.get("truncated") != true {
		t.Errorf("a cut list does not say so")
	}
	rows, _ := all.get("sessions").([]any)
	if len(rows) < 1000 || all.get("count") != float64(len(rows)) {
		t.Errorf("%d rows, count %v", len(rows), all.get("count"))
	}
	tui := c.call("sessions.list", map[string]any{"agentId": "main", "limit": 1})
	if rows, _ := tui.get("sessions").([]any); len(rows) != 1 || tui.get("truncated") != nil {
		t.Errorf("the TUI's sessions.list: %.300s", tui.raw)
	}
}

// deviceKey is a deterministic Ed25519 device key for tests.
func deviceKey(n byte) ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{n}, ed25519.SeedSize))
}

// connectDevice connects like the TUI, signing the challenge with key as
// the real client does; tamper, when set, edits the params (and the device
// block) before they are sent.
func (e *env) connectDevice(key ed25519.PrivateKey, token string, tamper func(p map[string]any, dev map[string]any)) *client {
	e.t.Helper()
	return e.connectSigned("tui", key, token, tamper)
}

// connectSigned connects with the params of testdata/connect_<fixture>.json
// and a device block signing the challenge with key: the v3 text
// (docs/protocol.md §3) with signedAt = the challenge's ts, as the TUI and
// the web chat (channels/webchat/static/chat.js) build it.
func (e *env) connectSigned(fixture string, key ed25519.PrivateKey, token string, tamper func(p map[string]any, dev map[string]any)) *client {
	e.t.Helper()
	var auth map[string]any
	if token != "" {
		auth = map[string]any{"token": token}
	}
	return e.connectSignedAuth(fixture, key, auth, token, tamper)
}

// connectDeviceAuth is connectDevice with connect's auth block (nil: none)
// and the token the signature covers given apart.
func (e *env) connectDeviceAuth(key ed25519.PrivateKey, auth map[string]any, token string, tamper func(p map[string]any, dev map[string]any)) *client {
	e.t.Helper()
	return e.connectSignedAuth("tui", key, auth, token, tamper)
}

// connectSignedAuth is connectSigned with connect's auth block (nil: none)
// and the token the signature covers given apart.
func (e *env) connectSignedAuth(fixture string, key ed25519.PrivateKey, auth map[string]any, token string, tamper func(p map[string]any, dev map[string]any)) *client {
	e.t.Helper()
	c := e.connectRaw("")
	ch := c.read()
	p := connectFixture(e.t, fixture, "-")
	if auth != nil {
		p["auth"] = auth
	}
	pub := key.Public().(ed25519.PublicKey)
	sum := sha256.Sum256(pub)
	id := hex.EncodeToString(sum[:])
	ts := int64(ch.get("ts").(float64))
	cl := p["client"].(map[string]any)
	var scopes []string
	for _, s := range p["scopes"].([]any) {
		scopes = append(scopes, s.(string))
	}
	msg := strings.Join([]string{"v3", id, cl["id"].(string), cl["mode"].(string), p["role"].(string), strings.Join(scopes, ","),
		strconv.FormatInt(ts, 10), token, ch.str("nonce"), strings.ToLower(cl["platform"].(string)), strings.ToLower(cl["deviceFamily"].(string))}, "|")
	dev := map[string]any{"id": id, "publicKey": base64.RawURLEncoding.EncodeToString(pub),
		"signature": base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, []byte(msg))), "signedAt": ts, "nonce": ch.str("nonce")}
	p["device"] = dev
	if tamper != nil {
		tamper(p, dev)
	}
	if hello := c.call("connect", p); !hello.OK {
		e.t.Fatalf("connect: %s", hello.raw)
	}
	return c
}

// TestAbortOwnershipIsNotSelfDeclared: run ownership used to be the
// client's self-declared instanceId, so anyone with the shared token could
// stop another user's run by sending that user's instanceId. Now it is the
// identity the client proved: a signed device key, else its connection.
// Copying the victim's instanceId, its device id and public key, or
// replaying its signature of an earlier challenge all give FORBIDDEN; the
// victim itself, reconnected, may still stop its run.
func TestAbortOwnershipIsNotSelfDeclared(t *testing.T) {
	e := newTCPEnv(t, envOpts{opts: Options{Token: "shared-token-123456"}})
	const token = "shared-token-123456"
	victimKey := deviceKey(7)
	var victimDevice map[string]any
	victim := e.connectDevice(victimKey, token, func(_, dev map[string]any) { victimDevice = dev })
	victim.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "victim-run"})

	attacks := []struct {
		name   string
		tamper func(p, dev map[string]any)
	}{
		{"same instanceId, no device", func(p, _ map[string]any) { delete(p, "device") }},
		{"same instanceId, own device key", nil},
		{"victim's device id and key, own signature", func(_, dev map[string]any) {
			dev["id"], dev["publicKey"] = victimDevice["id"], victimDevice["publicKey"]
		}},
		{"victim's whole device block replayed", func(_, dev map[string]any) {
			for k, v := range victimDevice {
				dev[k] = v
			}
		}},
	}
	for i, a := range attacks {
		attacker := e.connectDevice(deviceKey(byte(20+i)), token, a.tamper) // the fixture's instanceId is the victim's
		if r := attacker.call("chat.abort", map[string]any{"sessionKey": "main", "runId": "victim-run"}); r.OK || r.Error.Code != CodeForbidden {
			t.Fatalf("%s: the attacker's abort was answered %s", a.name, r.raw)
		}
	}
	victim.ws.Close()
	back := e.connectDevice(victimKey, token, nil)
	if r := back.call("chat.abort", map[string]any{"sessionKey": "main"}); !r.OK || r.get("aborted") != true {
		t.Fatalf("the victim, reconnected: %s", r.raw)
	}
}

// TestInvalidUTF8FrameClosedWith1007: a text frame that is not UTF-8 is
// closed with 1007 (before and after connect) instead of being decoded
// with U+FFFD in its strings.
func TestInvalidUTF8FrameClosedWith1007(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	bad := []byte("{\"type\":\"req\",\"id\":\"1\",\"method\":\"chat.send\",\"params\":{\"sessionKey\":\"ma\xffin\",\"message\":\"hi\",\"idempotencyKey\":\"k\"}}")
	before := e.connectRaw("")
	before.read()
	before.ws.WriteMessage(websocket.TextMessage, bad)
	after, _ := e.connect("cli", "-")
	after.ws.WriteMessage(websocket.TextMessage, bad)
	for name, c := range map[string]*client{"before connect": before, "after connect": after} {
		if code, why := c.closed(); code != websocket.CloseInvalidFramePayloadData || why != "invalid UTF-8" {
			t.Errorf("%s: close %d %q, want 1007 invalid UTF-8", name, code, why)
		}
	}
	if n := len(e.eng.Sessions()); n != 0 {
		t.Errorf("%d sessions were created from an invalid frame", n)
	}
}

// TestLookAlikeSessionKeysRejected: keys with bidi overrides, zero-width
// characters, a BOM or U+FFFD (a lone surrogate escape) would name a
// session that looks like another or cannot be typed again; they are
// refused with a clear error. Ordinary non-ASCII keys still work.
func TestLookAlikeSessionKeysRejected(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	c, _ := e.connect("cli", "-")
	for _, key := range []string{"main\u202e", "ma\u200bin", "\ufeffmain", "agent:main:\u2066x\u2069", "ma\u00adin", "main\ufffd"} {
		r := c.call("chat.history", map[string]any{"sessionKey": key})
		if r.OK || r.Error.Code != CodeInvalidRequest || !strings.Contains(r.Error.Message, "invisible or direction-changing") {
			t.Errorf("key %+q: %s", key, r.raw)
		}
		r = c.call("chat.send", map[string]any{"sessionKey": key, "message": "hi", "idempotencyKey": "k" + key})
		if r.OK || r.Error.Code != CodeInvalidRequest {
			t.Errorf("chat.send key %+q: %s", key, r.raw)
		}
	}
	// A lone surrogate in JSON decodes to U+FFFD.
	c.ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"req","id":"s","method":"chat.history","params":{"sessionKey":"ma\udc00in"}}`))
	if r := c.response("s"); r.OK || !strings.Contains(r.Error.Message, "U+FFFD") {
		t.Errorf("lone surrogate: %s", r.raw)
	}
	for _, key := range []string{"main", "agent:main:café", "日本語", "agent:main:👍"} {
		if r := c.call("chat.history", map[string]any{"sessionKey": key}); !r.OK {
			t.Errorf("ordinary key %q refused: %s", key, r.raw)
		}
	}
	for _, si := range e.eng.Sessions() {
		if firstInvisible(si.Key) >= 0 {
			t.Errorf("a session with an invisible character exists: %+q", si.Key)
		}
	}
}

// TestProcessSendBudgetClosesSlowClients: six clients that never read,
// each within its own budget (4 MiB), together ask for 36 MiB of history;
// the process-wide budget (server.sendBufferBytes, 4 MiB here) closes the
// ones that would take the total past it with 1013, and what is buffered
// never exceeds the budget plus one answer per client.
func TestProcessSendBudgetClosesSlowClients(t *testing.T) {
	e := newTCPEnv(t, envOpts{adjust: func(c *config.Config) {
		c.Server.MaxMessageChars = 1_000_000
		c.Server.MaxPayloadBytes = 2 << 20
		c.Server.SendQueueBytes = 4 << 20
		c.Server.SendBufferBytes = 4 << 20
	}})
	user, _ := e.connect("cli", "-")
	for i := range 2 {
		run := fmt.Sprintf("big-%d", i)
		user.call("chat.send", map[string]any{"sessionKey": "big", "message": strings.Repeat("y", 900_000), "idempotencyKey": run})
		user.chat(run, "final")
	}
	const clients = 6
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond): // real time: sampling the server's buffered bytes while it works on real sockets
				if b := e.srv.Stats().Buffered; b > peak.Load() {
					peak.Store(b)
				}
			}
		}
	}()
	for range clients {
		c, _ := e.connect("cli", "-")
		for range 6 {
			c.request("chat.history", map[string]any{"sessionKey": "big"})
		}
	}
	limit := int64(4<<20 + clients*(1<<20))
	deadline := time.Now().Add(10 * time.Second)
	for e.srv.Stats().SlowClosed == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // real time: the server works on real sockets
	}
	close(stop)
	<-sampled
	t.Logf("peak buffered %d bytes, %d slow clients closed", peak.Load(), e.srv.Stats().SlowClosed)
	if e.srv.Stats().SlowClosed == 0 {
		t.Fatal("no client was closed although the process budget was exceeded")
	}
	if peak.Load() > limit {
		t.Fatalf("buffered %d bytes, over the budget's bound %d", peak.Load(), limit)
	}
	if r := user.call("health", nil); !r.OK {
		t.Fatalf("the user who reads: %s", r.raw)
	}
}

// TestDeviceSignatureCoversTheTokenTheClientSent: the real client signs
// auth.token ?? auth.deviceToken ?? auth.bootstrapToken. A TUI holding a
// stored device token (from an OpenClaw gateway it used before) sends no
// auth.token and signs its deviceToken; it used to be verified against ""
// only, so its identity was its connection and it could not stop its own
// run after reconnecting.
func TestDeviceSignatureCoversTheTokenTheClientSent(t *testing.T) {
	for _, field := range []string{"deviceToken", "bootstrapToken"} {
		t.Run(field, func(t *testing.T) {
			e := newTCPEnv(t, envOpts{})
			key := deviceKey(3)
			auth := map[string]any{field: "stored-" + field}
			first := e.connectDeviceAuth(key, auth, "stored-"+field, nil)
			first.call("chat.send", map[string]any{"sessionKey": "main", "message": "/steps shell:hang", "idempotencyKey": "r-" + field})
			first.ws.Close()
			other := e.connectDeviceAuth(deviceKey(4), auth, "stored-"+field, nil)
			if r := other.call("chat.abort", map[string]any{"sessionKey": "main"}); r.OK || r.Error.Code != CodeForbidden {
				t.Fatalf("another device's abort: %s", r.raw)
			}
			again := e.connectDeviceAuth(key, auth, "stored-"+field, nil)
			if r := again.call("chat.abort", map[string]any{"sessionKey": "main"}); !r.OK || r.get("aborted") != true {
				t.Fatalf("the same device, reconnected: %s", r.raw)
			}
		})
	}
}

// TestHTMLHeavyAnswersFitTheirBudget: json.Marshal writes <, > and & as
// \u003c (6 bytes) while the answer budget counted them as 1, so a history
// of 100,000-character "<<<…" messages answered 6 MB against a 1 MiB
// budget (and sessions.list of "<…" keys likewise). Answers are encoded as
// the event frames are, without HTML escapes, and stay within
// server.maxAnswerBytes.
func TestHTMLHeavyAnswersFitTheirBudget(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	budget := e.cfg.Current().Server.MaxAnswerBytes
	user, _ := e.connect("cli", "-")
	for i := range 12 {
		run := fmt.Sprintf("html-%d", i)
		msg := strings.Repeat("<&>", 33_000)
		if res := user.call("chat.send", map[string]any{"sessionKey": "html", "message": msg, "idempotencyKey": run}); !res.OK {
			t.Fatalf("send: %.200s", res.raw)
		}
		user.chat(run, "final")
	}
	h := user.call("chat.history", map[string]any{"sessionKey": "html", "limit": 200})
	if !h.OK || len(h.raw) > budget {
		t.Fatalf("chat.history: ok=%v, %d bytes, budget %d", h.OK, len(h.raw), budget)
	}
	if msgs, _ := h.get("messages").([]any); len(msgs) < 5 || h.get("truncated") != true {
		t.Errorf("chat.history: %d messages, truncated=%v", len(msgs), h.get("truncated"))
	}
	for i := range 3000 {
		e.eng.Reset(fmt.Sprintf("agent:main:%s%04d", strings.Repeat("<", 240), i))
	}
	l := user.call("sessions.list", map[string]any{})
	if !l.OK || len(l.raw) > budget {
		t.Fatalf("sessions.list: ok=%v, %d bytes, budget %d", l.OK, len(l.raw), budget)
	}
}
