package ws

import (
	"container/list"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// Failed authentication is throttled per client network: all of
// 127.0.0.0/8 is one network (a local process can bind any of its
// addresses), an IPv4 address otherwise, an IPv6 /64 (what one host or
// subscriber owns). Each network may fail authFailBurst times, then once
// per authFailEvery. While a network has no attempts left its connects are
// refused before the token is even looked at (AUTH_RATE_LIMITED, with
// retryAfterMs), so guessing runs at one try per authFailEvery instead of
// thousands per second. The refusal is by network: a local attacker can
// lock out other local clients for as long as the attack lasts
// (docs/security.md).
//
// Across networks, a process-wide bucket allows authGlobalRate failures per
// second (authGlobalBurst at once): a network that has failed (until its
// allowance is full again at a minute's summary) has its token checked only
// while that bucket has a failure to spare, so an
// attacker rotating through many networks gets one try from each network
// it has not used yet and, beyond, what the process-wide bucket allows. A
// network that has not failed is always checked, so the right token from
// it gets in whatever others are doing.
//
// At most authMaxAddrs networks are tracked; a new one then replaces the
// one that failed least recently.
const (
	authFailBurst   = 10
	authFailEvery   = 6 * time.Second // 10 per minute
	authGlobalRate  = 5               // failures per second, all networks together
	authGlobalBurst = 50
	authLogInterval = time.Minute // failures are logged once, then summarised per interval
	authMaxAddrs    = 4096        // networks tracked; beyond, the least recently failed is forgotten
)

// authGuard tracks failed authentications per network and logs them
// rate-limited.
type authGuard struct {
	log *slog.Logger

	mu      sync.Mutex
	nets    map[string]*list.Element // network → its element in lru
	lru     list.List                // *netFailures, the most recently failed first
	global  bucket                   // failures of every network together
	failed  int                      // failures since the last log line
	refused int                      // connects refused while locked out since then
	from    map[string]struct{}      // networks of those (at most authMaxAddrs)
	timer   *time.Timer              // the summary at the end of the interval; nil when none is due
	stopped bool
}

// netFailures is the failure allowance of one network.
type netFailures struct {
	key string
	b   bucket
}

func newAuthGuard(log *slog.Logger) *authGuard {
	return &authGuard{log: log, nets: map[string]*list.Element{}, from: map[string]struct{}{},
		global: newBucket(authGlobalRate, authGlobalBurst)}
}

// netKey is the network ip is throttled as: "127.0.0.0/8" for IPv4
// loopback, the address for other IPv4 addresses, its /64 for IPv6 (an
// IPv4-mapped address is IPv4). A string that is not an IP is its own key.
func netKey(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	a = a.Unmap().WithZone("")
	if a.Is4() {
		if a.IsLoopback() {
			return "127.0.0.0/8"
		}
		return a.String()
	}
	p, _ := a.Prefix(64)
	return p.String()
}

// locked reports whether a connect from ip must be refused before its token
// is checked, and how long until it may be: its network has no attempts
// left, or it has failed (and is still tracked) and the process-wide bucket
// has no failure to spare (one is taken for this attempt). A network that
// has not failed is never locked. A refusal is counted for the log
// summary.
func (g *authGuard) locked(ip string, now time.Time) (bool, time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := netKey(ip)
	el := g.nets[k]
	if el == nil {
		return false, 0
	}
	nf := el.Value.(*netFailures)
	wait := nf.b.wait(now)
	if wait == 0 {
		if ok, w := g.global.take(now); !ok {
			wait = w
		}
	}
	if wait > 0 {
		g.refused++
		g.note(k)
		g.summarySoon()
		return true, wait
	}
	return false, 0
}

// fail records a failed authentication from ip and logs it: the first of
// an interval at once, the rest in one summary line at its end.
func (g *authGuard) fail(ip, client, reason string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := netKey(ip)
	el := g.nets[k]
	if el == nil {
		if g.lru.Len() >= authMaxAddrs {
			old := g.lru.Back()
			delete(g.nets, old.Value.(*netFailures).key)
			g.lru.Remove(old)
		}
		el = g.lru.PushFront(&netFailures{key: k, b: newBucket(1/authFailEvery.Seconds(), authFailBurst)})
		g.nets[k] = el
		// A network's first failure counts against the process too (locked
		// took one for every later failure).
		g.global.take(now)
	} else {
		g.lru.MoveToFront(el)
	}
	el.Value.(*netFailures).b.take(now)
	if g.timer == nil && !g.stopped {
		g.log.Warn("websocket client failed authentication (further failures are summarised every minute)",
			"ip", ip, "client", clip(client, 60), "reason", reason)
		g.timer = time.AfterFunc(authLogInterval, g.summary)
		return
	}
	g.failed++
	g.note(k)
}

// note counts network k for the summary, with g.mu held.
func (g *authGuard) note(k string) {
	if len(g.from) < authMaxAddrs {
		g.from[k] = struct{}{}
	}
}

// summarySoon arms the summary, with g.mu held.
func (g *authGuard) summarySoon() {
	if g.timer == nil && !g.stopped {
		g.timer = time.AfterFunc(authLogInterval, g.summary)
	}
}

// summary logs what the last interval suppressed, and forgets networks
// whose allowance is full again.
func (g *authGuard) summary() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.timer = nil
	if g.failed > 0 || g.refused > 0 {
		g.log.Warn("websocket authentication failures in the last "+authLogInterval.String(),
			"failed", g.failed, "refusedWhileLockedOut", g.refused, "networks", len(g.from))
		g.failed, g.refused = 0, 0
		clear(g.from)
		g.timer = time.AfterFunc(authLogInterval, g.summary) // the next interval is summarised too
	}
	now := time.Now()
	for k, el := range g.nets {
		if el.Value.(*netFailures).b.full(now) {
			delete(g.nets, k)
			g.lru.Remove(el)
		}
	}
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
