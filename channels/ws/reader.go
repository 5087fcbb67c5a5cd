package ws

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
)

// reader is the read side of one connection: the handshake, the rate limit
// and the dispatch of requests. It runs on the ServeHTTP goroutine.
type reader struct {
	c        *conn
	hello    bool
	idle     time.Duration // read deadline after hello, extended by every frame and pong
	bucket   bucket
	rejected refusals // requests refused by the rate limit
	flood    int      // refusals without a quiet second that close the connection
	pings    bucket   // pings answered
	pingsOff refusals // pings not answered
}

// Built-in limits on client pings: a client never needs more than a few
// (the OpenClaw clients send none); each answered ping costs a write.
const (
	pingRate  = 5   // pings answered per second
	pingBurst = 10  // … and in a burst
	pingFlood = 100 // unanswered pings without a quiet second close the connection
)

// floodQuiet is how long a client must stay within its limits for the
// count of its refusals to start again: a client that backs off is never
// closed, one that keeps pushing is, whatever its rate.
const floodQuiet = time.Second

// refusals counts refusals that follow each other with less than floodQuiet
// between them.
type refusals struct {
	n    int
	last time.Time
}

// add counts a refusal at now and returns the length of the current run.
func (f *refusals) add(now time.Time) int {
	if now.Sub(f.last) >= floodQuiet {
		f.n = 0
	}
	f.n++
	f.last = now
	return f.n
}

func newReader(c *conn) *reader {
	return &reader{c: c, pings: newBucket(pingRate, pingBurst)}
}

// onPing answers a client's ping with a pong while the client keeps within
// pingRate; beyond it pings go unanswered, and a sustained ping flood
// closes the connection with 1008. It runs on the reader goroutine.
func (r *reader) onPing(data string) error {
	c := r.c
	if c.isClosing() {
		return nil
	}
	now := time.Now()
	if ok, _ := r.pings.take(now); !ok {
		if r.pingsOff.add(now) >= pingFlood {
			c.s.log.Warn("closing websocket client that keeps flooding pings", "conn", c.id, "ip", c.ip)
			c.closeWith(ClosePolicy, "ping flood", false)
		}
		return nil
	}
	err := c.ws.WriteControl(websocket.PongMessage, []byte(data), now.Add(writeWait))
	if err != nil && !errors.Is(err, websocket.ErrCloseSent) && !isTimeout(err) {
		return err
	}
	return nil
}

func (r *reader) loop() {
	c := r.c
	c.ws.SetReadLimit(preConnectLimit)
	c.ws.SetReadDeadline(time.Now().Add(handshakeTimeout))
	c.ws.SetPingHandler(r.onPing)
	closingSeen := false
	for {
		mt, data, err := c.ws.ReadMessage()
		if err != nil {
			switch {
			case !r.hello && isTimeout(err) && !c.isClosing():
				c.s.log.Debug("websocket client sent no connect in time", "conn", c.id, "ip", c.ip)
				c.closeWith(ClosePolicy, "connect timeout", true)
			case errors.Is(err, websocket.ErrReadLimit):
				// gorilla/websocket has sent 1009. Swallow the rest of the
				// frame for a moment so the client reads the close frame
				// instead of a connection reset.
				c.s.log.Info("websocket frame too large; closed with 1009", "conn", c.id, "ip", c.ip)
				nc := c.ws.NetConn()
				nc.SetReadDeadline(time.Now().Add(closeGrace))
				io.CopyN(io.Discard, nc, 64<<20)
			default:
				c.s.log.Debug("websocket read ended", "conn", c.id, "err", err)
			}
			return
		}
		if c.isClosing() {
			if !closingSeen {
				closingSeen = true
				c.ws.SetReadDeadline(time.Now().Add(closeGrace))
			}
			continue // waiting for the client's close frame
		}
		if r.hello {
			c.ws.SetReadDeadline(time.Now().Add(r.idle))
		}
		if mt != websocket.TextMessage {
			c.closeWith(CloseUnsupportedData, "binary frames are not supported", true)
			continue
		}
		if !utf8.Valid(data) {
			// RFC 6455 §8.1: a text frame must be UTF-8; invalid bytes would
			// become U+FFFD in keys and texts, unaddressable and look-alike.
			c.closeWith(CloseInvalidPayload, "invalid UTF-8", true)
			continue
		}
		if !r.hello {
			r.handshake(data)
			continue
		}
		r.handle(data)
	}
}

// connectParams are the params of connect. Fields the server does not use
// (client.version, device, …) are accepted and ignored.
type connectParams struct {
	MinProtocol *int `json:"minProtocol"`
	MaxProtocol *int `json:"maxProtocol"`
	Client      struct {
		ID           string `json:"id"`
		Mode         string `json:"mode"`
		InstanceID   string `json:"instanceId"` // self-declared: not an identity
		Platform     string `json:"platform"`
		DeviceFamily string `json:"deviceFamily"`
	} `json:"client"`
	Caps []string `json:"caps"`
	Auth struct {
		Token string `json:"token"`
		// What the client signs when it sends no token (see
		// signedTokens); never a credential here: turnguard issues
		// neither.
		DeviceToken    string `json:"deviceToken"`
		BootstrapToken string `json:"bootstrapToken"`
	} `json:"auth"`
	Role   string          `json:"role"`
	Scopes []string        `json:"scopes"`
	Device json.RawMessage `json:"device"` // verified when present; see verifiedDevice
}

// handshake handles the one frame allowed before hello: connect. Anything
// else, bad params, a protocol range without 4 or a bad token is answered
// with an error response and the connection is closed.
func (r *reader) handshake(data []byte) {
	c := r.c
	req, err := parseFrame(data)
	if err != nil {
		c.push(resFrame(req.ID, nil, invalid("%s", err.Error())))
		c.closeWith(ClosePolicy, "invalid frame before connect", true)
		return
	}
	if req.Method != "connect" {
		c.push(resFrame(req.ID, nil, invalid("connect required: the first request must be connect, not %s", clip(req.Method, 60))))
		c.closeWith(ClosePolicy, "connect required", true)
		return
	}
	var p connectParams
	if rerr := decodeParams("connect", req.Params, &p); rerr != nil {
		c.push(resFrame(req.ID, nil, rerr))
		c.closeWith(ClosePolicy, "invalid connect params", true)
		return
	}
	if p.MinProtocol == nil || p.MaxProtocol == nil {
		c.push(resFrame(req.ID, nil, invalid("invalid connect params: minProtocol and maxProtocol are required")))
		c.closeWith(ClosePolicy, "invalid connect params", true)
		return
	}
	if *p.MinProtocol > ProtocolVersion || *p.MaxProtocol < ProtocolVersion {
		c.push(resFrame(req.ID, nil, &rpcError{Code: CodeInvalidRequest, Message: "protocol mismatch", Details: map[string]any{
			"code": "PROTOCOL_MISMATCH", "expectedProtocol": ProtocolVersion,
			"clientMinProtocol": *p.MinProtocol, "clientMaxProtocol": *p.MaxProtocol,
		}}))
		c.closeWith(CloseProtocolMismatch, "protocol mismatch", true)
		return
	}
	now := time.Now()
	if c.s.requiresAuth() {
		if locked, wait := c.s.auth.locked(c.ip, now); locked {
			c.push(resFrame(req.ID, nil, &rpcError{Code: CodeInvalidRequest, Message: lockedMessage(wait),
				Details: map[string]any{"code": "AUTH_RATE_LIMITED"}, Retryable: true, RetryAfterMs: retryMs(wait)}))
			c.closeWith(ClosePolicy, "too many failed attempts", true)
			return
		}
	}
	operator, rerr := c.s.authenticate(p.Auth.Token)
	if rerr != nil {
		c.s.auth.fail(c.ip, p.Client.ID, rerr.Details.(map[string]any)["code"].(string), now)
		c.push(resFrame(req.ID, nil, rerr))
		c.closeWith(ClosePolicy, "unauthorized", true)
		return
	}

	c.operator = operator
	c.toolEvents = slices.Contains(p.Caps, "tool-events")
	c.clientID = clip(p.Client.ID, 60)
	c.approvalsScope = approvalScope(p.Scopes)
	c.nativeApprovals = approvalClient(p)
	c.owner = ownerOf(verifiedDevice(p, c.nonce), operator)
	cfg := c.s.cfg.Current().Server
	tick := time.Duration(cfg.TickIntervalMs) * time.Millisecond
	if tick <= 0 {
		tick = 30 * time.Second
	}
	r.idle = 2*tick + 10*time.Second
	r.bucket = newBucket(cfg.RequestsPerSecond, cfg.RequestBurst)
	r.flood = max(10*cfg.RequestBurst, 100)
	r.hello = true

	c.push(resFrame(req.ID, c.s.helloOK(c, p, cfg.MaxPayloadBytes, tick), nil))
	if cfg.MaxPayloadBytes > 0 {
		c.ws.SetReadLimit(int64(cfg.MaxPayloadBytes))
	}
	c.ws.SetPongHandler(func(string) error {
		return c.ws.SetReadDeadline(time.Now().Add(r.idle))
	})
	c.ws.SetReadDeadline(time.Now().Add(r.idle))
	c.tickEvery.Store(int64(tick))
	c.signal()
	c.s.log.Debug("websocket client connected", "conn", c.id, "ip", c.ip, "client", clip(p.Client.ID, 60), "mode", clip(p.Client.Mode, 20), "operator", operator)
}

// requiresAuth reports whether connect needs a token.
func (s *Server) requiresAuth() bool { return s.opts.Token != "" || s.opts.OperatorToken != "" }

// authenticate checks a presented token against the configured ones in
// constant time (both are hashed first, so not even their lengths leak). It
// returns whether the token is the operator token, or the error response.
func (s *Server) authenticate(token string) (operator bool, rerr *rpcError) {
	if s.opts.OperatorToken != "" && sameSecret(token, s.opts.OperatorToken) {
		return true, nil
	}
	if s.opts.Token == "" || sameSecret(token, s.opts.Token) {
		return false, nil
	}
	if token == "" {
		return false, &rpcError{Code: CodeInvalidRequest, Message: "unauthorized: gateway token missing (set auth.token)",
			Details: map[string]any{"code": "AUTH_TOKEN_MISSING"}}
	}
	return false, &rpcError{Code: CodeInvalidRequest, Message: "unauthorized: gateway token mismatch",
		Details: map[string]any{"code": "AUTH_TOKEN_MISMATCH"}}
}

func sameSecret(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

// handle serves one request after hello.
func (r *reader) handle(data []byte) {
	c := r.c
	now := time.Now()
	if ok, wait := r.bucket.take(now); !ok {
		n := r.rejected.add(now)
		id := json.RawMessage(nil)
		if req, err := parseFrame(data); err == nil {
			id = req.ID
		}
		c.push(resFrame(id, nil, &rpcError{Code: CodeUnavailable, Retryable: true, RetryAfterMs: max(wait.Milliseconds(), 1),
			Message: fmt.Sprintf("rate limit exceeded: at most %g requests per second", r.bucket.rate)}))
		// The count is not reset by the requests the refill lets through
		// (that kept the documented close from ever happening), only by a
		// quiet second.
		if n >= r.flood {
			c.s.log.Warn("closing websocket client that keeps exceeding the request rate", "conn", c.id, "ip", c.ip, "refused", n)
			c.closeWith(ClosePolicy, "rate limit exceeded", true)
		}
		return
	}
	// Frames the handler causes (a turn's first events) and its response
	// leave in one write.
	c.holdWake.Add(1)
	defer func() {
		c.holdWake.Add(-1)
		c.signal()
	}()
	req, err := parseFrame(data)
	if err != nil {
		c.push(resFrame(req.ID, nil, invalid("%s", err.Error())))
		return
	}
	h, ok := methods[req.Method]
	if !ok {
		c.push(resFrame(req.ID, nil, invalid("unknown method: %s", clip(req.Method, 100))))
		return
	}
	payload, rerr := h(c, req)
	if payload == deferred && rerr == nil {
		return // the handler responds itself
	}
	c.push(resFrame(req.ID, payload, rerr))
}

// bucket is a token bucket: rate tokens per second, at most burst.
type bucket struct {
	rate, burst, tokens float64
	last                time.Time
}

func newBucket(rate float64, burst int) bucket {
	if burst < 1 {
		burst = 1
	}
	return bucket{rate: rate, burst: float64(burst), tokens: float64(burst)}
}

// refill adds the tokens earned since the last call.
func (b *bucket) refill(now time.Time) {
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
}

// wait reports how long until a token is available (0: now).
func (b *bucket) wait(now time.Time) time.Duration {
	b.refill(now)
	if b.tokens >= 1 {
		return 0
	}
	return b.until()
}

// until is how long until the bucket holds a whole token, at least 1 ns
// while it does not (a shortfall too small for a Duration must not read as
// "now": take would still refuse).
func (b *bucket) until() time.Duration {
	return max(time.Duration((1-b.tokens)/b.rate*float64(time.Second)), 1)
}

// full reports whether the bucket has refilled completely.
func (b *bucket) full(now time.Time) bool {
	b.refill(now)
	return b.tokens >= b.burst
}

// take spends a token, or reports how long until one is available. A
// non-positive rate is unlimited.
func (b *bucket) take(now time.Time) (bool, time.Duration) {
	if b.rate <= 0 || math.IsInf(b.rate, 1) {
		return true, 0
	}
	b.refill(now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, b.until()
}
