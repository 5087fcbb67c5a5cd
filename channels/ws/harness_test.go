package ws

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"

	"github.com/turnguard/turnguard/internal/testlog"
)

// env is a gateway engine with the demo runner and a ws Server, reachable
// either over real TCP (httptest) or, inside a synctest bubble, over an
// in-memory pipe (so timers are fake and blocking is durable).
type env struct {
	t    testing.TB
	eng  *gateway.Engine
	srv  *Server
	cfg  *config.Source
	demo *demo.Runner
	http *httptest.Server // nil for pipe envs
	logs *syncBuffer
	dial func(remote string) (*websocket.Conn, *http.Response, error)
}

type envOpts struct {
	adjust func(*config.Config)
	opts   Options
	admit  func() error       // gateway.Options.Admit
	runner runner.Runner      // instead of the demo runner (which is still built, unused)
	queue  gateway.QueueStore // gateway.Options.Queue (the store's durable queue)
	// history is gateway.Options.History (the store's history loader).
	history gateway.HistoryLoader
	// details is gateway.Options.TurnDetails (the store's reader).
	details gateway.TurnDetailsLoader
	// cluster is gateway.Options.Cluster (nil: one process).
	cluster gateway.Cluster
}

func baseConfig(adjust func(*config.Config)) *config.Config {
	c := config.Default()
	c.Store.Path = ":memory:"
	if adjust != nil {
		adjust(c)
	}
	return c
}

func newEngineEnv(t testing.TB, o envOpts) *env {
	t.Helper()
	c := baseConfig(o.adjust)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	src := config.NewSource(c)
	d := demo.New(demo.WithScenarioStep(10 * time.Millisecond))
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var rn runner.Runner = d
	if o.runner != nil {
		rn = o.runner
	}
	eng, err := gateway.New(gateway.Options{Config: src, Runners: map[string]runner.Runner{"demo": rn}, Log: log, Admit: o.admit,
		History: o.history, TurnDetails: o.details, Cluster: o.cluster, Queue: o.queue})
	if err != nil {
		t.Fatal(err)
	}
	eng.Start(context.Background())
	if o.opts.Version == "" {
		o.opts.Version = "turnguard test"
	}
	o.opts.Log = log
	srv := NewServer(eng, src, o.opts)
	return &env{t: t, eng: eng, srv: srv, cfg: src, demo: d, logs: logs}
}

// newTCPEnv serves on a real loopback socket.
func newTCPEnv(t testing.TB, o envOpts) *env {
	t.Helper()
	e := newEngineEnv(t, o)
	e.http = httptest.NewServer(e.srv)
	e.dial = func(string) (*websocket.Conn, *http.Response, error) {
		d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
		return d.Dial("ws"+strings.TrimPrefix(e.http.URL, "http")+"/", nil)
	}
	t.Cleanup(func() {
		e.demo.Release()
		e.eng.Shutdown(context.Background())
		e.srv.Shutdown(context.Background())
		e.http.Close()
	})
	return e
}

// newPipeEnv serves over net.Pipe; call it inside synctest.Test.
func newPipeEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	e := newEngineEnv(t, o)
	e.dial = func(remote string) (*websocket.Conn, *http.Response, error) {
		cli, srv := net.Pipe()
		go servePipe(e.srv, srv, remote)
		d := websocket.Dialer{
			HandshakeTimeout: 5 * time.Second,
			NetDialContext:   func(context.Context, string, string) (net.Conn, error) { return cli, nil },
		}
		return d.Dial("ws://localhost/", nil)
	}
	t.Cleanup(func() {
		e.demo.Release()
		e.eng.Shutdown(context.Background())
		e.srv.Shutdown(context.Background())
	})
	return e
}

// servePipe plays net/http's part for one request on conn: parse it and
// hand ServeHTTP a ResponseWriter that can be hijacked.
func servePipe(h http.Handler, conn net.Conn, remote string) {
	br := bufio.NewReader(conn)
	req, err := http.ReadRequest(br)
	if err != nil {
		conn.Close()
		return
	}
	if remote == "" {
		remote = "192.0.2.1:40000"
	}
	req.RemoteAddr = remote
	w := &pipeWriter{conn: conn, br: br, header: http.Header{}}
	h.ServeHTTP(w, req)
	if !w.hijacked {
		resp := &http.Response{StatusCode: w.status, ProtoMajor: 1, ProtoMinor: 1, Header: w.header,
			Body: io.NopCloser(&w.body), ContentLength: int64(w.body.Len())}
		resp.Write(conn)
		conn.Close()
	}
}

type pipeWriter struct {
	conn     net.Conn
	br       *bufio.Reader
	header   http.Header
	status   int
	body     bytes.Buffer
	hijacked bool
}

func (w *pipeWriter) Header() http.Header { return w.header }
func (w *pipeWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.body.Write(b)
}
func (w *pipeWriter) WriteHeader(code int) { w.status = code }
func (w *pipeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.hijacked = true
	return w.conn, bufio.NewReadWriter(w.br, bufio.NewWriter(w.conn)), nil
}

type syncBuffer = testlog.Buffer

// frame is an inbound frame as a client sees it.
type frame struct {
	Type    string          `json:"type"`
	Event   string          `json:"event"`
	ID      string          `json:"id"`
	OK      bool            `json:"ok"`
	Payload json.RawMessage `json:"payload"`
	Error   *rpcError       `json:"error"`
	Seq     *uint64         `json:"seq"`
	raw     string
}

// p decodes the payload into a generic map.
func (f frame) p() map[string]any {
	var m map[string]any
	json.Unmarshal(f.Payload, &m)
	return m
}

// get returns the value at a dotted path of the payload ("data.phase",
// "message.content.0.text"), or nil.
func (f frame) get(path string) any { return lookup(f.p(), path) }

func (f frame) str(path string) string {
	v := f.get(path)
	if v == nil {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

func lookup(v any, path string) any {
	for _, k := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			v = x[k]
		case []any:
			var i int
			if _, err := fmt.Sscan(k, &i); err != nil || i < 0 || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

// client is a test WebSocket client that checks the frame seq of every
// event it reads.
type client struct {
	t       testing.TB
	ws      *websocket.Conn
	nextID  int
	lastSeq uint64
	pending []frame // read but not yet consumed
	ticks   int
	all     []frame       // every frame read, in order
	wait    time.Duration // read limit per frame; 5 s when 0
}

func (e *env) connectRaw(remote string) *client {
	e.t.Helper()
	ws, _, err := e.dial(remote)
	if err != nil {
		e.t.Fatalf("dial: %v", err)
	}
	c := &client{t: e.t, ws: ws}
	e.t.Cleanup(func() { ws.Close() })
	return c
}

// connect dials, reads the challenge and completes connect with the
// fixture params (testdata/connect_<fixture>.json) and the given token
// ("" keeps the fixture's, "-" removes auth).
func (e *env) connect(fixture, token string) (*client, frame) {
	e.t.Helper()
	return e.connectAs(fixture, token, "")
}

// connectAs is connect from the remote address remote (pipe envs only;
// "" is 192.0.2.1:40000).
func (e *env) connectAs(fixture, token, remote string) (*client, frame) {
	e.t.Helper()
	c := e.connectRaw(remote)
	ch := c.read()
	if ch.Event != "connect.challenge" {
		e.t.Fatalf("first frame %s, want connect.challenge", ch.raw)
	}
	params := connectFixture(e.t, fixture, token)
	hello := c.call("connect", params)
	if !hello.OK {
		e.t.Fatalf("connect failed: %s", hello.raw)
	}
	return c, hello
}

func connectFixture(t testing.TB, name, token string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "connect_"+name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	switch token {
	case "":
	case "-":
		delete(m, "auth")
	default:
		m["auth"] = map[string]any{"token": token}
	}
	return m
}

func (c *client) send(v any) {
	c.t.Helper()
	if err := c.ws.WriteJSON(v); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// request sends a request and returns its id.
func (c *client) request(method string, params any) string {
	c.t.Helper()
	c.nextID++
	id := fmt.Sprintf("%d:test", c.nextID)
	m := map[string]any{"type": "req", "id": id, "method": method}
	if params != nil {
		m["params"] = params
	}
	c.send(m)
	return id
}

// readRaw reads one frame from the socket (5 s limit, fake time in a
// bubble), checking event seq continuity.
func (c *client) readRaw() (frame, error) {
	wait := c.wait
	if wait == 0 {
		wait = 5 * time.Second
	}
	c.ws.SetReadDeadline(time.Now().Add(wait))
	_, data, err := c.ws.ReadMessage()
	if err != nil {
		return frame{}, err
	}
	var f frame
	if err := json.Unmarshal(data, &f); err != nil {
		c.t.Fatalf("server sent invalid JSON %q: %v", data, err)
	}
	f.raw = string(data)
	if f.Seq != nil {
		if *f.Seq != c.lastSeq+1 {
			c.t.Fatalf("event seq gap: expected %d, got %d (%s)", c.lastSeq+1, *f.Seq, f.raw)
		}
		c.lastSeq = *f.Seq
	}
	if f.Event == "tick" {
		c.ticks++
	}
	c.all = append(c.all, f)
	return f, nil
}

func (c *client) read() frame {
	c.t.Helper()
	f, err := c.readRaw()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return f
}

// until returns the first frame (buffered or new) that matches, keeping the
// others buffered. Ticks are skipped.
func (c *client) until(what string, match func(frame) bool) frame {
	c.t.Helper()
	for i, f := range c.pending {
		if match(f) {
			c.pending = append(c.pending[:i:i], c.pending[i+1:]...)
			return f
		}
	}
	for {
		f, err := c.readRaw()
		if err != nil {
			c.t.Fatalf("waiting for %s: %v; frames so far:\n%s", what, err, c.dump())
		}
		if match(f) {
			return f
		}
		if f.Event != "tick" {
			c.pending = append(c.pending, f)
		}
	}
}

func (c *client) dump() string {
	var b strings.Builder
	for _, f := range c.all {
		b.WriteString(f.raw + "\n")
	}
	return b.String()
}

// call sends a request and waits for its (first) response.
func (c *client) call(method string, params any) frame {
	c.t.Helper()
	id := c.request(method, params)
	return c.response(id)
}

func (c *client) response(id string) frame {
	c.t.Helper()
	return c.until("response "+id, func(f frame) bool { return f.Type == "res" && f.ID == id })
}

// chatEvent waits for a chat event of run in state.
func (c *client) chat(run, state string) frame {
	c.t.Helper()
	return c.until("chat "+state+" of "+run, func(f frame) bool {
		return f.Event == "chat" && f.str("runId") == run && f.str("state") == state
	})
}

// closed reads until the connection closes and returns the close code and
// reason (pending frames are kept).
func (c *client) closed() (int, string) {
	c.t.Helper()
	for {
		f, err := c.readRaw()
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				return ce.Code, ce.Text
			}
			c.t.Fatalf("connection ended without a close frame: %v; frames:\n%s", err, c.dump())
		}
		if f.Event != "tick" {
			c.pending = append(c.pending, f)
		}
	}
}

// runEvents returns, in order, the chat/agent events of run read so far as
// short strings: "lifecycle:start", "tool:start:shell", "chat:delta", ….
func (c *client) runEvents(run string) []string {
	var out []string
	for _, f := range c.all {
		if f.str("runId") != run || f.Type != "event" {
			continue
		}
		switch f.Event {
		case "chat":
			out = append(out, "chat:"+f.str("state"))
		case "agent":
			s := f.str("stream") + ":" + f.str("data.phase")
			if n := f.str("data.name"); n != "" && f.str("stream") == "tool" {
				s += ":" + n
			}
			out = append(out, s)
		}
	}
	return out
}

// waitIdle waits (up to 5 s) until no turn is live: after an abort the
// session stays busy ("still stopping") until the runner has returned.
func (e *env) waitIdle() {
	e.t.Helper()
	busy := func() bool {
		if len(e.eng.Live()) > 0 {
			return true
		}
		for _, s := range e.eng.Sessions() {
			if s.ActiveRun != "" {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(5 * time.Second); busy(); {
		if time.Now().After(deadline) {
			e.t.Fatalf("turns still live after 5s: %d", len(e.eng.Live()))
		}
		time.Sleep(time.Millisecond) // real time: the demo runner returns on its own goroutine over a real socket's env
	}
}

// waitStep waits until the session's active run is inside step name (a
// client that reacts to a delta may otherwise race the runner's next step).
func (e *env) waitStep(sessionKey, name string) {
	e.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		if r, ok := e.eng.Active(sessionKey); ok {
			if cur, _ := r.CurrentStep(); cur.Name == name {
				return
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("session %s never reached step %s", sessionKey, name)
		}
		time.Sleep(time.Millisecond) // real time: the demo runner moves on its own goroutine
	}
}
