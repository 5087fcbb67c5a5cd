package ws

import (
	"log/slog"
	"strconv"
	"sync"
	"time"
)

// Failed authentication is throttled per client IP: each address may fail
// authFailBurst times, then once per authFailEvery. While an address has no
// attempts left its connects are refused before the token is even looked
// at (AUTH_RATE_LIMITED, with retryAfterMs), so guessing runs at one try per
// authFailEvery instead of thousands per second. The refusal is by address:
// a local attacker can lock out other local clients for as long as the
// attack lasts (docs/security.md).
const (
	authFailBurst   = 10
	authFailEvery   = 6 * time.Second // 10 per minute
	authLogInterval = time.Minute     // failures are logged once, then summarised per interval
	authMaxAddrs    = 4096            // addresses tracked; beyond, new ones share one allowance
)

// authGuard tracks failed authentications per IP and logs them rate-limited.
type authGuard struct {
	log *slog.Logger

	mu      sync.Mutex
	addrs   map[string]*bucket
	failed  int                 // failures since the last log line
	refused int                 // connects refused while locked out since then
	from    map[string]struct{} // addresses of those
	timer   *time.Timer         // the summary at the end of the interval; nil when none is due
	stopped bool
}

func newAuthGuard(log *slog.Logger) *authGuard {
	return &authGuard{log: log, addrs: map[string]*bucket{}, from: map[string]struct{}{}}
}

// locked reports whether ip has no attempts left and how long until it has.
// A lockout is counted for the log summary.
func (g *authGuard) locked(ip string, now time.Time) (bool, time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.addrs[g.key(ip)]
	if b == nil {
		return false, 0
	}
	if wait := b.wait(now); wait > 0 {
		g.refused++
		g.from[ip] = struct{}{}
		g.summarySoon()
		return true, wait
	}
	return false, 0
}

// failed records a failed authentication from ip and logs it: the first of
// an interval at once, the rest in one summary line at its end.
func (g *authGuard) fail(ip, client, reason string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.key(ip)
	b := g.addrs[k]
	if b == nil {
		nb := newBucket(1/authFailEvery.Seconds(), authFailBurst)
		b = &nb
		g.addrs[k] = b
	}
	b.take(now)
	if g.timer == nil && !g.stopped {
		g.log.Warn("websocket client failed authentication (further failures are summarised every minute)",
			"ip", ip, "client", clip(client, 60), "reason", reason)
		g.timer = time.AfterFunc(authLogInterval, g.summary)
		return
	}
	g.failed++
	g.from[ip] = struct{}{}
}

// summarySoon arms the summary, with g.mu held.
func (g *authGuard) summarySoon() {
	if g.timer == nil && !g.stopped {
		g.timer = time.AfterFunc(authLogInterval, g.summary)
	}
}

// summary logs what the last interval suppressed, and forgets addresses
// whose allowance is full again.
func (g *authGuard) summary() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.timer = nil
	if g.failed > 0 || g.refused > 0 {
		g.log.Warn("websocket authentication failures in the last "+authLogInterval.String(),
			"failed", g.failed, "refusedWhileLockedOut", g.refused, "addresses", len(g.from))
		g.failed, g.refused = 0, 0
		clear(g.from)
		g.timer = time.AfterFunc(authLogInterval, g.summary) // the next interval is summarised too
	}
	now := time.Now()
	for k, b := range g.addrs {
		if b.full(now) {
			delete(g.addrs, k)
		}
	}
}

// key is ip, or one shared key once too many addresses are tracked.
func (g *authGuard) key(ip string) string {
	if _, ok := g.addrs[ip]; ok || len(g.addrs) < authMaxAddrs {
		return ip
	}
	return "*"
}

func (g *authGuard) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped = true
	if g.timer != nil {
		g.timer.Stop()
	}
}

// retryMs is a wait in whole milliseconds, at least 1, as retryAfterMs.
func retryMs(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// lockedMessage is the error of a connect refused during a lockout.
func lockedMessage(wait time.Duration) string {
	return "unauthorized: too many failed attempts from this address; retry in " +
		strconv.FormatInt(int64((wait+time.Second-1)/time.Second), 10) + "s"
}
