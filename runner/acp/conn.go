package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// JSON-RPC 2.0 error codes used in answers to the agent.
const (
	codeInvalidParams  = -32602
	codeMethodNotFound = -32601
	codeInternal       = -32603
	codeServerBusy     = -32000
)

// message is one JSON-RPC 2.0 message in either direction: a request (ID and
// Method), a notification (Method only) or a response (ID with Result or
// Error).
type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

// rpcError is a JSON-RPC error object. As a Go error it is what the agent
// answered to one of our requests.
type rpcError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// Error cuts the agent's message: it goes to the log.
func (e *rpcError) Error() string {
	return fmt.Sprintf("acp: agent error %d: %s", e.Code, cut(e.Message, 500))
}

// response is what a request of ours got: a result or an error.
type response struct {
	result json.RawMessage
	err    error
}

// errConnClosed is the error of every request still waiting when the agent's
// output ends (it exited, crashed or was stopped).
var errConnClosed = errors.New("acp: the agent's connection closed")

// conn is the JSON-RPC side of one agent process: it writes newline-
// delimited JSON to the agent's stdin and reads the agent's stdout line by
// line (readLoop), matching responses to pending requests and handing
// requests and notifications to handle. It knows nothing of sessions.
type conn struct {
	w      *os.File // the agent's stdin
	wmu    sync.Mutex
	nextID atomic.Int64

	mu      sync.Mutex
	pending map[int64]chan response
	closed  bool

	broken func() // called when a write fails: the stream may hold half a message
}

func newConn(w *os.File, broken func()) *conn {
	return &conn{w: w, pending: map[int64]chan response{}, broken: broken}
}

// writeTimeout bounds one write to the agent's stdin: an agent that stops
// reading its input cannot wedge the turns that write to it.
const writeTimeout = 10 * time.Second

// write sends one message.
func (c *conn) write(m message) error {
	m.JSONRPC = "2.0"
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("acp: encode %s: %w", m.Method, err)
	}
	return c.writeLine(append(b, '\n'))
}

// writeLine sends one encoded message ending in a newline.
func (c *conn) writeLine(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.w.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := c.w.Write(b); err != nil {
		if c.broken != nil {
			go c.broken()
		}
		return fmt.Errorf("acp: write to the agent: %w", err)
	}
	return nil
}

// request sends a request and returns its id and the channel its response
// arrives on (buffered: the reader never blocks on it). forget(id) drops a
// request whose answer is no longer wanted.
func (c *conn) request(method string, params any) (int64, <-chan response, error) {
	p, err := json.Marshal(params)
	if err != nil {
		return 0, nil, fmt.Errorf("acp: encode %s: %w", method, err)
	}
	id := c.nextID.Add(1)
	ch := make(chan response, 1)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, nil, errConnClosed
	}
	c.pending[id] = ch
	c.mu.Unlock()
	if err := c.write(message{ID: json.RawMessage(strconv.FormatInt(id, 10)), Method: method, Params: p}); err != nil {
		c.forget(id)
		return 0, nil, err
	}
	return id, ch, nil
}

func (c *conn) forget(id int64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// notify sends a notification.
func (c *conn) notify(method string, params any) error {
	p, err := json.Marshal(params)
	if err != nil {
		return fmt.Errorf("acp: encode %s: %w", method, err)
	}
	return c.write(message{Method: method, Params: p})
}

// reply answers a request of the agent with result, or with e when it is
// not nil.
// A result is encoded once, into the line itself (a file's text is not
// copied again by a second encoding of the whole message).
func (c *conn) reply(id json.RawMessage, result any, e *rpcError) error {
	if e != nil {
		return c.write(message{ID: id, Error: e})
	}
	var line []byte
	head := func(n int) {
		// id came from a parsed message, so it is valid JSON.
		line = make([]byte, 0, len(id)+n+64)
		line = append(line, `{"jsonrpc":"2.0","id":`...)
		line = append(line, id...)
		line = append(line, `,"result":`...)
	}
	if t, ok := result.(textResult); ok {
		head(len(t.content) + len(t.content)/8)
		line = t.appendTo(line)
	} else {
		b, err := json.Marshal(result)
		if err != nil {
			return fmt.Errorf("acp: encode a reply: %w", err)
		}
		head(len(b))
		line = append(line, b...)
	}
	return c.writeLine(append(line, "}\n"...))
}

// deliver routes a response to its pending request; a response to no
// pending request (forgotten, or invented by the agent) is dropped.
func (c *conn) deliver(m *message) bool {
	id, err := strconv.ParseInt(string(m.ID), 10, 64)
	if err != nil {
		return false
	}
	c.mu.Lock()
	ch, ok := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if !ok {
		return false
	}
	r := response{result: m.Result}
	if m.Error != nil {
		r.err = m.Error
	}
	ch <- r
	return true
}

// close fails every pending request with errConnClosed; later requests fail
// at once.
func (c *conn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for id, ch := range c.pending {
		ch <- response{err: errConnClosed}
		delete(c.pending, id)
	}
}

// readLines calls fn for each line of rd without its line ending (fn must
// not keep the slice). A line longer than max is not buffered: fn gets its
// first max bytes with tooLong set, once, and readLines returns, since a
// stream that broke its bound is not read on.
func readLines(rd io.Reader, max int, fn func(line []byte, tooLong bool)) {
	br := bufio.NewReaderSize(rd, 64<<10)
	var buf []byte
	for {
		part, err := br.ReadSlice('\n')
		if len(buf)+len(part) > max {
			fn(append(buf, part[:max-len(buf)]...), true)
			return
		}
		buf = append(buf, part...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if len(buf) > 0 {
			line := bytes.TrimSuffix(bytes.TrimSuffix(buf, []byte("\n")), []byte("\r"))
			fn(line, false)
		}
		buf = buf[:0]
		if cap(buf) > 1<<20 {
			buf = nil // a large line's buffer is not kept for the small ones after it
		}
		if err != nil {
			return
		}
	}
}

// lineLog logs the first limit problem lines of an agent one by one and
// counts the rest, so a flood of them costs a counter, not the log.
type lineLog struct {
	limit int
	n     atomic.Int64
}

func (l *lineLog) log(log *slog.Logger, msg string, args ...any) {
	l.logAt(log, slog.LevelWarn, msg, args...)
}

// logAt is log at level.
func (l *lineLog) logAt(log *slog.Logger, level slog.Level, msg string, args ...any) {
	if n := l.n.Add(1); n <= int64(l.limit) {
		log.Log(context.Background(), level, msg, args...)
	} else if n == int64(l.limit)+1 {
		log.Log(context.Background(), level, "acp: more such lines are counted, not logged", "about", msg, "limit", l.limit)
	}
}

func (l *lineLog) count() int64 { return l.n.Load() }
