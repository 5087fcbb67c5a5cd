// Package ws owns the OpenClaw gateway protocol v4 over WebSocket: the
// handshake (connect.challenge → connect → hello-ok), ticks, the methods the
// OpenClaw CLI and TUI call (chat.send, chat.abort, chat.history, agent,
// agent.wait, sessions.*, …) and the translation of the engine's turn events
// into `chat` and `agent` protocol events. docs/protocol.md describes what is
// spoken on the wire; ../shared/openclaw-protocol.md is the measured
// reference it follows.
//
// Each connection has one reader goroutine (the ServeHTTP call) and one
// writer goroutine that owns the socket's write side, the per-connection
// frame seq and the ticks. Everything else — the engine's bus, the keepalive
// timers, method handlers — hands frames to the writer through a bounded
// queue (see conn.push), so a slow client never blocks a turn.
//
// The server subscribes once to the engine's bus and encodes each event once;
// the encoded payload is shared by every connection watching the session.
package ws

import (
	"cmp"
	"context"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/gateway/server"
)

// ProtocolVersion is the OpenClaw gateway protocol version spoken.
const ProtocolVersion = 4

// Built-in limits that are not configuration keys.
const (
	preConnectLimit   = 64 << 10              // bytes: largest frame before hello
	handshakeTimeout  = 10 * time.Second      // time from open to a valid connect
	writeWait         = 10 * time.Second      // longest a batch of writes may block
	closeGrace        = 2 * time.Second       // wait for the client's close reply
	keepaliveInterval = 20 * time.Second      // longest silence of a running turn
	deltaInterval     = 50 * time.Millisecond // shortest time between two deltas of a run
	maxWatched        = 1024                  // sessions one connection may watch by name
	maxWaiters        = 64                    // concurrent agent / agent.wait calls per connection
	defaultWaitMs     = 30000                 // agent.wait default timeoutMs
	maxWaitMs         = 24 * 3600 * 1000      // agent.wait longest timeoutMs
)

// Options configure a Server.
type Options struct {
	// Token is the shared token a client must present in connect.auth.token.
	// "" means no authentication is required (the HTTP server only allows
	// that on loopback).
	Token string
	// OperatorToken is the token of operators: a connection that
	// authenticates with it is an operator — it may abort any run and, with
	// an approvals scope, answer any question. Different from Token it is a
	// second accepted token; equal to Token (config's default when
	// server.operatorToken is not set) the holder of server.token is the
	// operator, as on /api and /admin, where the same token grants the
	// same powers. "" means no operator over WebSocket.
	OperatorToken string
	// Version is reported in hello-ok server.version and status
	// (e.g. "turnguard 0.1.0").
	Version string
	// Log receives connection-level events; nil means slog.Default().
	Log *slog.Logger
	// Keepalive is the longest a running turn may stay silent towards its
	// watchers: after this much silence a lifecycle "running" event is sent
	// so the TUI's own 30 s "taking longer than expected" line never
	// appears. 0 means 20 s.
	Keepalive time.Duration
	// DeltaInterval is the shortest time between two chat deltas of one run
	// (the interval also grows with the reply, see runState.interval); text
	// streamed in between goes out together. 0 means 50 ms; negative sends
	// every chunk at once (the old behaviour, kept as the benchmark's
	// baseline).
	DeltaInterval time.Duration
	// Resumed, optional, reports whether the interrupted turn runID was
	// dispatched again (store.Resumes.Resumed): chat.history marks its
	// notice resumed so that no Retry is offered. nil: never.
	Resumed func(ctx context.Context, runID string) (bool, error)
}

// Server is the WebSocket endpoint. Create with NewServer; it is an
// http.Handler for the upgrade request.
type Server struct {
	eng     *gateway.Engine
	cfg     *config.Source
	opts    Options
	log     *slog.Logger
	started time.Time
	up      websocket.Upgrader
	unsub   func()

	mu      sync.Mutex
	conns   map[*conn]struct{}
	perIP   map[string]int
	closing bool
	wg      sync.WaitGroup // one per connection

	watchMu  sync.RWMutex
	watchers map[string]map[*conn]struct{} // canonical session key → connections watching it by name
	watchAll map[*conn]struct{}            // connections that called sessions.subscribe
	// The watcher index that every event reads, without a lock: the
	// number of connections in watchAll, and the keys of watchers (changed
	// under watchMu with the maps).
	watchAllN   atomic.Int32
	watchedKeys sync.Map      // canonical session key → struct{}
	watchedN    atomic.Int32  // keys in watchedKeys
	watchGen    atomic.Uint64 // changes (after watchedKeys) whenever a key is added or removed; starts at 1

	runs sync.Map // run id → *runState: the live turns (read per event without a lock)

	runsMu     sync.Mutex
	agentWaits map[string][]*agentWaiter // agent calls waiting for a run's end, by run id

	auth     *authGuard // failed authentications per IP
	stats    stats
	buffered atomic.Int64 // bytes queued for (or being written to) every connection
}

// bufferBudget is server.sendBufferBytes, the most bytes buffered for all
// connections together.
func (s *Server) bufferBudget() int64 {
	if b := s.cfg.Current().Server.SendBufferBytes; b > 0 {
		return int64(b)
	}
	return 64 << 20
}

// fairShare is a connection's share of the process send budget: the
// budget divided among the open connections.
func (s *Server) fairShare() int64 {
	s.mu.Lock()
	n := int64(max(len(s.conns), 1))
	s.mu.Unlock()
	return s.bufferBudget() / n
}

// shed closes with 1013 the connections holding more than their fair share
// of the process send budget, the largest first, until what is buffered is
// within the budget again (their queues are dropped at once; a batch being
// written to one is released when its write ends, within writeWait).
// pushLocked asks for it when a connection within its share had to queue a
// frame past the process budget; except is that connection. It takes one
// connection's lock at a time and must be called without any held.
func (s *Server) shed(except *conn) {
	budget := s.bufferBudget()
	if s.buffered.Load() <= budget {
		return
	}
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		if c != except {
			conns = append(conns, c)
		}
	}
	share := budget / int64(max(len(s.conns), 1))
	s.mu.Unlock()
	held := make(map[*conn]int, len(conns))
	for _, c := range conns {
		c.mu.Lock()
		if !c.closing && int64(c.bytes) > share {
			held[c] = c.bytes
		}
		c.mu.Unlock()
	}
	conns = slices.DeleteFunc(conns, func(c *conn) bool { _, ok := held[c]; return !ok })
	slices.SortFunc(conns, func(a, b *conn) int { return cmp.Compare(held[b], held[a]) })
	for _, c := range conns {
		if s.buffered.Load() <= budget {
			return
		}
		c.mu.Lock()
		closed := !c.closing && int64(c.bytes) > share
		if closed {
			c.failLocked(CloseSlowConsumer, "slow consumer")
		}
		c.mu.Unlock()
		if closed {
			c.signal()
			s.stats.slowClosed.Add(1)
			s.log.Warn("closing slow websocket client: it holds more than its share of the process send budget",
				"conn", c.id, "ip", c.ip, "bytes", held[c], "share", share, "budget", budget)
		}
	}
}

// stats are counters for diagnostics and tests.
type stats struct {
	droppedDeltas atomic.Uint64 // deltas not sent to a slow client (merged or dropped)
	slowClosed    atomic.Uint64 // connections closed as slow consumers
	frames        atomic.Uint64 // frames written
	writes        atomic.Uint64 // socket writes (a write carries one or more frames)
}

// Stats are the server's counters since it started.
type Stats struct {
	Clients       int    `json:"clients"`
	Frames        uint64 `json:"frames"`        // frames written
	Writes        uint64 `json:"writes"`        // socket writes; Frames/Writes is the batching factor
	DroppedDeltas uint64 `json:"droppedDeltas"` // chat deltas a slow client did not get (their text went into a later frame)
	SlowClosed    uint64 `json:"slowClosed"`    // connections closed with 1013 "slow consumer"
	Buffered      int64  `json:"buffered"`      // bytes queued for clients now
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	return Stats{Clients: s.Clients(), Frames: s.stats.frames.Load(), Writes: s.stats.writes.Load(),
		DroppedDeltas: s.stats.droppedDeltas.Load(), SlowClosed: s.stats.slowClosed.Load(),
		Buffered: s.buffered.Load()}
}

// NewServer returns a server that runs turns on eng and reads its limits
// from cfg (server.*: tickIntervalMs, maxPayloadBytes, sendQueue,
// maxConnsPerIP, requestsPerSecond, requestBurst; each connection reads
// them when it opens). It subscribes to eng's bus at once; Shutdown
// unsubscribes.
func NewServer(eng *gateway.Engine, cfg *config.Source, opts Options) *Server {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Version == "" {
		opts.Version = "turnguard dev"
	}
	if opts.Keepalive <= 0 {
		opts.Keepalive = keepaliveInterval
	}
	if opts.DeltaInterval == 0 {
		opts.DeltaInterval = deltaInterval
	}
	s := &Server{
		eng: eng, cfg: cfg, opts: opts, log: opts.Log, started: time.Now(),
		conns: map[*conn]struct{}{}, perIP: map[string]int{},
		watchers: map[string]map[*conn]struct{}{}, watchAll: map[*conn]struct{}{},
		agentWaits: map[string][]*agentWaiter{},
		auth:       newAuthGuard(opts.Log),
	}
	s.watchGen.Store(1) // a run's cache starts at 0: stale
	s.up = websocket.Upgrader{
		HandshakeTimeout: handshakeTimeout,
		WriteBufferPool:  &sync.Pool{},
		// CheckOrigin stays the default: no Origin header (CLI, TUI) or an
		// Origin equal to the Host. A web page elsewhere cannot drive the
		// gateway from a user's browser.
	}
	unsub := eng.Bus().Subscribe("", s.onEvent)
	// Cluster mode: the turns other replicas run reach their watchers here
	// too; a session whose events were lost closes its watchers with 1012.
	unimport := eng.Import(s.onEvent, s.onGap)
	uncancel := eng.OnQueueCancel(s.onQueueCancel)
	s.unsub = func() { uncancel(); unimport(); unsub() }
	return s
}

// Clients returns the number of open WebSocket connections.
func (s *Server) Clients() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// ServeHTTP upgrades the request to a WebSocket connection and serves it
// until it closes. Before the upgrade it answers 503 while shutting down and
// 429 when the client's IP already has server.maxConnsPerIP connections.
// With no token configured it answers 403 to a request whose Host or
// Origin is not a local name (server.LocalRequest): the DNS rebinding guard.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ip := remoteIP(r.RemoteAddr)
	cfg := s.cfg.Current().Server
	limit := cfg.MaxConnsPerIP
	if s.opts.Token == "" && !server.LocalRequest(r, cfg.AllowedHosts) {
		// DNS rebinding: without a token, only local names (docs/security.md).
		s.log.Warn("websocket upgrade refused: a host name that is not served without a token",
			"ip", ip, "host", clip(r.Host, 100), "origin", clip(r.Header.Get("Origin"), 100))
		http.Error(w, server.ErrForeignHost.Error(), http.StatusForbidden)
		return
	}
	s.mu.Lock()
	switch {
	case s.closing:
		s.mu.Unlock()
		http.Error(w, "gateway is shutting down", http.StatusServiceUnavailable)
		return
	case limit > 0 && s.perIP[ip] >= limit:
		s.mu.Unlock()
		s.log.Warn("websocket connection refused: too many connections from one address", "ip", ip, "limit", limit)
		http.Error(w, "too many connections from this address", http.StatusTooManyRequests)
		return
	}
	s.perIP[ip]++
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	defer s.releaseIP(ip)

	hj := &hijacker{ResponseWriter: w}
	ws, err := s.up.Upgrade(hj, r, nil)
	if err != nil {
		s.log.Debug("websocket upgrade failed", "ip", ip, "err", err) // Upgrade already answered
		return
	}
	c := newConn(s, ws, hj.out, ip)
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		c.closeWith(websocket.CloseServiceRestart, "gateway restarting", true)
	} else {
		s.conns[c] = struct{}{}
		s.mu.Unlock()
	}
	c.serve()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.unwatch(c)
}

func (s *Server) releaseIP(ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perIP[ip]--; s.perIP[ip] <= 0 {
		delete(s.perIP, ip)
	}
}

// Shutdown tells every connection that the gateway is going away (a
// `shutdown` event), flushes what is queued for it — call it after the
// engine's Shutdown, so the aborted events of the running turns are among
// that — and closes it with 1012 (service restart; clients reconnect). New
// upgrades are refused with 503. It returns when every connection has ended
// or ctx is done; connections still open then are cut.
func (s *Server) Shutdown(ctx context.Context) {
	s.mu.Lock()
	s.closing = true
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	s.unsub()
	s.auth.stop()
	for _, c := range conns {
		c.push(outFrame{data: eventHead("shutdown", mustJSON(map[string]any{"reason": "gateway shutting down"})), seq: true})
		c.closeWith(websocket.CloseServiceRestart, "gateway restarting", true)
	}
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		for _, c := range conns {
			c.ws.NetConn().Close()
		}
		<-done
	}
	s.runs.Range(func(id, rs any) bool {
		s.runs.Delete(id)
		rs.(*runState).stop()
		return true
	})
}

// watch makes c receive the events of session key. It reports false when c
// already watches maxWatched sessions by name (it then keeps the ones it
// has).
func (s *Server) watch(c *conn, key string) bool {
	s.watchMu.RLock()
	_, ok := s.watchers[key][c]
	s.watchMu.RUnlock()
	if ok {
		return true
	}
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if c.watched >= maxWatched {
		return false
	}
	m := s.watchers[key]
	if m == nil {
		m = map[*conn]struct{}{}
		s.watchers[key] = m
		s.watchedKeys.Store(key, struct{}{})
		s.watchedN.Add(1)
		s.watchGen.Add(1)
		s.eng.Watching(key, true) // cluster mode: the owner publishes its live events
	}
	if _, ok := m[c]; !ok {
		m[c] = struct{}{}
		c.watched++
		c.watchKeys = append(c.watchKeys, key)
	}
	return true
}

// watchEverything makes c receive the events of every session (on) or only
// of the sessions it named (off).
func (s *Server) watchEverything(c *conn, on bool) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if on {
		s.watchAll[c] = struct{}{}
	} else {
		delete(s.watchAll, c)
	}
	s.setWatchAllNLocked()
	c.all = on
}

// setWatchAllNLocked publishes len(s.watchAll) to the lock-free index and
// tells the engine when the first connection follows every session or the
// last stops. Called with watchMu held.
func (s *Server) setWatchAllNLocked() {
	n := int32(len(s.watchAll))
	if old := s.watchAllN.Swap(n); (old == 0) != (n == 0) {
		s.eng.WatchingAll(n > 0)
	}
}

func (s *Server) unwatch(c *conn) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	delete(s.watchAll, c)
	s.setWatchAllNLocked()
	for _, k := range c.watchKeys {
		if m := s.watchers[k]; m != nil {
			delete(m, c)
			if len(m) == 0 {
				delete(s.watchers, k)
				s.watchedKeys.Delete(k)
				s.watchedN.Add(-1)
				s.watchGen.Add(1)
				s.eng.Watching(k, false)
			}
		}
	}
	c.watchKeys, c.watched = nil, 0
}

// fanout hands frames to every connection watching key. Frames marked
// toolOnly go only to connections that declared the tool-events cap.
func (s *Server) fanout(key string, frames []outFrame) {
	s.watchMu.RLock()
	defer s.watchMu.RUnlock()
	for c := range s.watchAll {
		c.pushAll(frames)
	}
	for c := range s.watchers[key] {
		if !c.all {
			c.pushAll(frames)
		}
	}
}

func remoteIP(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host
}
