package ws

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/internal/faketime"
)

// TestSustainedFloodClosesEvenWithRefills: a client that sends twice the
// allowed rate gets half its requests through, forever — the refill used to
// reset the count of refusals, so the documented 1008 never came. Now only
// a quiet second resets it: the flood is closed after 100 refusals, while
// a client that bursts and then backs off stays connected.
func TestSustainedFloodClosesEvenWithRefills(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) {
			c.Server.RequestsPerSecond = 2
			c.Server.RequestBurst = 3
		}})

		polite, _ := e.connectAs("cli", "", "192.0.2.7:1")
		refused := 0
		for range 10 { // 10 bursts of 20, each followed by a pause: 170 refusals in all
			for range 20 {
				if r := polite.call("health", nil); !r.OK {
					refused++
				}
			}
			faketime.Advance(2 * time.Second)
		}
		if refused < 100 {
			t.Fatalf("only %d refusals: the test needs more than the flood threshold", refused)
		}
		if r := polite.call("health", nil); !r.OK {
			t.Fatalf("a client that backs off between bursts: %s", r.raw)
		}

		flooder, _ := e.connectAs("cli", "", "192.0.2.8:1")
		closed := false
		for i := 0; i < 400 && !closed; i++ { // 4 requests a second for 100 s
			if err := flooder.ws.WriteJSON(map[string]any{"type": "req", "id": "f", "method": "health"}); err != nil {
				if code, why := flooder.closed(); code != ClosePolicy || why != "rate limit exceeded" {
					t.Fatalf("flooder closed %d %q", code, why)
				}
				closed = true
				break
			}
			for {
				f, err := flooder.readRaw()
				var ce *websocket.CloseError
				if errors.As(err, &ce) {
					if ce.Code != ClosePolicy || ce.Text != "rate limit exceeded" {
						t.Fatalf("flooder closed %d %q", ce.Code, ce.Text)
					}
					closed = true
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if f.Type == "res" {
					break
				}
			}
			faketime.Advance(250 * time.Millisecond)
		}
		if !closed {
			t.Fatal("a client sending twice the allowed rate for 100 s was never closed")
		}
		other, _ := e.connectAs("cli", "", "192.0.2.9:1")
		if r := other.call("health", nil); !r.OK {
			t.Fatalf("another client after the flood: %s", r.raw)
		}
	})
}

// TestPingFloodIsNotAnswered: pings cost the server a write each; a client
// sending 500 at once gets at most the burst (10) answered and is closed
// with 1008 "ping flood". Before, every ping was answered.
func TestPingFloodIsNotAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{})
		c, _ := e.connect("cli", "")
		var pongs atomic.Int32
		c.ws.SetPongHandler(func(string) error { pongs.Add(1); return nil })
		done := make(chan error, 1)
		go func() {
			for {
				if _, _, err := c.ws.ReadMessage(); err != nil {
					done <- err
					return
				}
			}
		}()
		sent := 0
		for range 500 {
			if err := c.ws.WriteControl(websocket.PingMessage, []byte("p"), time.Now().Add(time.Second)); err != nil {
				break
			}
			sent++
		}
		err := <-done
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != ClosePolicy || ce.Text != "ping flood" {
			t.Fatalf("after %d pings: %v, want close 1008 ping flood", sent, err)
		}
		if n := pongs.Load(); n > pingBurst {
			t.Fatalf("%d pongs for %d pings: pings are not limited", n, sent)
		}
		// A client pinging now and then is answered.
		other, _ := e.connect("cli", "")
		var got atomic.Int32
		other.ws.SetPongHandler(func(string) error { got.Add(1); return nil })
		go func() {
			for {
				if _, _, err := other.ws.ReadMessage(); err != nil {
					return
				}
			}
		}()
		for range 5 {
			other.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(time.Second))
			faketime.Advance(time.Second)
		}
		if got.Load() != 5 {
			t.Fatalf("a client pinging once a second got %d pongs for 5", got.Load())
		}
	})
}

// TestFailedLoginsAreThrottledPerAddress: an attacker guessing tokens
// gets 10 tries, then every connect from its address is refused before the
// token is checked (AUTH_RATE_LIMITED, retryable, retryAfterMs) — even one
// with the right token — until the allowance refills (one try per 6 s).
// A user at another address is not affected. The failures are logged once
// and then summarised per minute, not one INFO line per guess.
func TestFailedLoginsAreThrottledPerAddress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const token = "the-right-token-123"
		e := newPipeEnv(t, envOpts{opts: Options{Token: token}})
		attempt := func(remote, tok string) frame {
			c := e.connectRaw(remote)
			c.read() // challenge
			res := c.call("connect", connectFixture(t, "cli", tok))
			if !res.OK {
				c.closed()
			}
			return res
		}
		var codes []string
		for range 200 {
			res := attempt("192.0.2.66:4000", "guess")
			codes = append(codes, detailCode(res))
		}
		got := strings.Join(codes, " ")
		want := strings.TrimSpace(strings.Repeat("AUTH_TOKEN_MISMATCH ", 10) + strings.Repeat("AUTH_RATE_LIMITED ", 190))
		if got != want {
			t.Fatalf("attacker's answers:\n%s\nwant 10 mismatches, then rate limited", got)
		}
		locked := attempt("192.0.2.66:4001", token)
		if locked.OK || detailCode(locked) != "AUTH_RATE_LIMITED" || locked.Error.RetryAfterMs <= 0 || !locked.Error.Retryable {
			t.Fatalf("the right token from a locked-out address: %s", locked.raw)
		}
		if !strings.Contains(locked.Error.Message, "too many failed attempts") {
			t.Errorf("lockout message: %q", locked.Error.Message)
		}
		if user := attempt("192.0.2.10:5000", token); !user.OK {
			t.Fatalf("a user at another address: %s", user.raw)
		}
		faketime.Advance(authFailEvery)
		if again := attempt("192.0.2.66:4002", "guess2"); detailCode(again) != "AUTH_TOKEN_MISMATCH" {
			t.Fatalf("after %v the attacker should get one more try: %s", authFailEvery, again.raw)
		}
		faketime.Advance(authLogInterval)
		logs := e.logs.String()
		if n := strings.Count(logs, "authentication"); n > 3 {
			t.Errorf("%d log lines about failed authentication for 201 failures:\n%s", n, logs)
		}
		if !strings.Contains(logs, "websocket authentication failures in the last 1m0s") || strings.Contains(logs, token) {
			t.Errorf("no summary line (or the token leaked):\n%s", logs)
		}
	})
}

// detailCode is error.details.code of a failed response.
func detailCode(f frame) string {
	if f.Error == nil {
		return ""
	}
	if m, ok := f.Error.Details.(map[string]any); ok {
		s, _ := m["code"].(string)
		return s
	}
	return ""
}
