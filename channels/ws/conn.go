package ws

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"
)

// frameKind says what the queue may do with a frame when the client is slow.
type frameKind uint8

const (
	kindMust  frameKind = iota // responses, terminal and tool events: never dropped
	kindDelta                  // chat delta: merged with a pending delta of its run, or dropped (the next carries its text)
	kindTick                   // tick: dropped when the queue is full
)

// outFrame is one frame waiting for the writer.
type outFrame struct {
	// data is the whole frame, or, when seq is set, the frame up to the value
	// of its "seq" field: the writer appends the connection's next seq and
	// the closing brace. A delta merged for one connection has no data
	// until the writer encodes it (see deltaRef).
	data     []byte
	cost     int // bytes counted against the budgets while queued
	seq      bool
	kind     frameKind
	toolOnly bool // only for connections with the tool-events cap
	// approvalsOnly: only for connections that take OpenClaw's approval
	// events (approvalClient).
	approvalsOnly bool
	runID         string // a run's frame (its payload seq is the run's): the run; "" for others
	terminal      bool   // the run's last chat frame: forget its carried delta text
	delta         *deltaRef
}

// size is what f counts against the send budgets: its bytes, or for a delta
// not encoded yet a bound of them (the full text and the delta text, plus
// the frame's fields; escapes aside).
func (f *outFrame) size() int {
	if f.data != nil {
		return len(f.data)
	}
	return 2*len(f.delta.full) - f.delta.from + 256
}

// conn is one WebSocket connection.
type conn struct {
	s     *Server
	ws    *websocket.Conn
	ip    string
	id    string // connId in hello-ok
	nonce string // the challenge's nonce, which a device signature must cover

	ctx    context.Context // cancelled when the connection ends
	cancel context.CancelFunc

	// Set by the reader before hello, read-only afterwards.
	owner      string // who may abort the runs this connection starts
	operator   bool
	toolEvents bool
	clientID   string // connect's client.id (self-declared: for words, not for rights)
	// approvalsScope: the client claims a scope that answers approvals;
	// nativeApprovals: it takes OpenClaw's plugin.approval.* events.
	approvalsScope  bool
	nativeApprovals bool

	// Guarded by s.watchMu.
	all       bool
	watched   int
	watchKeys []string

	mu        sync.Mutex
	queue     []outFrame
	bytes     int            // bytes of the queued frames and of the batch being written; counted in s.buffered too
	carry     map[string]int // run id → where in the full text the dropped deltas' text starts; the run's next delta starts there
	closing   bool           // a close was requested: no more frames are accepted
	closeCode int
	closeWhy  string

	wake       chan struct{} // cap 1: the queue or the state changed
	writerDone chan struct{}
	tickEvery  atomic.Int64 // ns; set at hello, starts ticks
	waiters    atomic.Int32 // running agent / agent.wait calls
	holdWake   atomic.Int32 // > 0 while the reader handles a request: its response wakes the writer, once
	queueCap   int
	queueBytes int        // server.sendQueueBytes: most bytes queued for this client
	out        *batchConn // the socket's write side, batched per writer round
}

func newConn(s *Server, ws *websocket.Conn, out *batchConn, ip string) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	cfg := s.cfg.Current().Server
	q, qb := cfg.SendQueue, cfg.SendQueueBytes
	if q <= 0 {
		q = 256
	}
	if qb <= 0 {
		qb = 8 << 20
	}
	return &conn{
		s: s, ws: ws, ip: ip, id: uuid.NewString(), ctx: ctx, cancel: cancel,
		wake: make(chan struct{}, 1), writerDone: make(chan struct{}), queueCap: q, queueBytes: qb, out: out,
	}
}

// serve runs the connection: the writer in its own goroutine, the reader on
// this one, until the connection ends.
func (c *conn) serve() {
	go c.writer()
	c.nonce = uuid.NewString()
	c.push(challengeFrame(c.nonce))
	r := newReader(c)
	r.loop()

	c.cancel()
	c.mu.Lock()
	requested := c.closing
	c.closing = true
	c.mu.Unlock()
	if requested {
		// We asked to close: let the writer flush and send the close frame
		// (it is bounded by writeWait) before the socket goes.
		c.signal()
		<-c.writerDone
		c.ws.Close()
	} else {
		c.ws.Close()
		c.signal()
		<-c.writerDone
	}
	// Nothing drains the queue any more and push accepts nothing: give its
	// bytes back to the process budget.
	c.mu.Lock()
	c.dropQueueLocked()
	c.mu.Unlock()
}

// account adds n (may be negative) bytes to what c and the whole server
// have buffered, with c.mu held.
func (c *conn) account(n int) {
	c.bytes += n
	c.s.buffered.Add(int64(n))
}

// dropQueueLocked discards the queued frames, with c.mu held.
func (c *conn) dropQueueLocked() {
	n := 0
	for i := range c.queue {
		n += c.queue[i].cost
	}
	c.account(-n)
	clear(c.queue)
	c.queue = c.queue[:0]
}

// overBudget reports whether queueing n more bytes would take c past its
// own budget (server.sendQueueBytes) or the server past the process budget
// (server.sendBufferBytes), with c.mu held. A client with nothing buffered
// is never over budget, so one frame larger than a budget is still
// delivered to a client that reads.
func (c *conn) overBudget(n int) bool {
	return c.overOwn(n) || c.overProcess(n)
}

// overOwn: queueing n more bytes would take c past its own budget.
func (c *conn) overOwn(n int) bool { return c.bytes > 0 && c.bytes+n > c.queueBytes }

// overProcess: queueing n more bytes for c would take the server past the
// process budget.
func (c *conn) overProcess(n int) bool {
	return c.bytes > 0 && c.s.buffered.Load()+int64(n) > c.s.bufferBudget()
}

func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// pushAll queues frames (from the bus) for this connection and wakes the
// writer once.
func (c *conn) pushAll(frames []outFrame) {
	c.mu.Lock()
	slow, shed := false, false
	for i := range frames {
		if frames[i].toolOnly && !c.toolEvents || frames[i].approvalsOnly && !c.nativeApprovals {
			continue
		}
		var sh bool
		slow, sh = c.pushLocked(frames[i])
		shed = shed || sh
		if slow {
			break
		}
	}
	c.mu.Unlock()
	c.pushed(slow, shed)
}

// push queues f for the writer without blocking (see pushLocked).
func (c *conn) push(f outFrame) {
	c.mu.Lock()
	slow, shed := c.pushLocked(f)
	c.mu.Unlock()
	c.pushed(slow, shed)
}

func (c *conn) pushed(slow, shed bool) {
	if slow || c.holdWake.Load() == 0 {
		c.signal()
	}
	if slow {
		c.s.stats.slowClosed.Add(1)
		c.s.log.Warn("closing slow websocket client: its send queue is full of frames that cannot be dropped",
			"conn", c.id, "ip", c.ip, "queue", c.queueCap, "queueBytes", c.queueBytes)
	}
	if shed {
		c.s.shed(c)
	}
}

// pushLocked queues f, with c.mu held. The queue holds at most queueCap
// frames and queueBytes bytes (counting the batch being written), and the
// whole server at most server.sendBufferBytes (see overBudget). A delta
// replaces a pending delta of the same run (their texts merged); when the
// queue is full deltas and ticks are dropped (a dropped delta's text is
// carried into the run's next delta), and a frame that must not be lost
// first evicts the droppable frames — if that does not make room the client
// cannot keep up: the connection is closed with 1013 "slow consumer" and
// pushLocked reports slow. A frame that must not be lost and fits the
// client's own budget but not the process budget is queued all the same
// while the client holds no more than its fair share of the process budget
// (fairShare): the clients over theirs are the cause, and pushLocked
// reports shed so that the caller, without c.mu, closes them (Server.shed).
// Otherwise no frame is queued past a budget, so a client that does not
// read cannot grow the heap.
func (c *conn) pushLocked(f outFrame) (slow, shed bool) {
	if c.closing {
		return false, false
	}
	switch f.kind {
	case kindDelta:
		if from, ok := c.carry[f.runID]; ok {
			delete(c.carry, f.runID)
			f = f.delta.since(from)
		}
		for i := len(c.queue) - 1; i >= 0; i-- {
			q := &c.queue[i]
			if q.runID != f.runID {
				continue // another run's frame, or none's: the order between runs is free
			}
			if q.kind != kindDelta {
				// A later frame of the run (a tool event, an approval) is
				// queued after the run's queued delta: merging into that
				// delta would put this text, and its higher seq, before it.
				break
			}
			// Only the newest full text matters; the delta text runs from
			// where the queued one started. Encoded when written.
			old := q.cost
			*q = f.delta.since(q.delta.from)
			q.cost = q.size()
			c.account(q.cost - old)
			c.s.stats.droppedDeltas.Add(1)
			return false, false
		}
		if len(c.queue) >= c.queueCap || c.overBudget(f.size()) {
			c.carryLocked(f)
			return false, false
		}
	case kindTick:
		if len(c.queue) >= c.queueCap || c.overBudget(f.size()) {
			return false, false
		}
	default:
		n := f.size()
		if len(c.queue) >= c.queueCap || c.overBudget(n) {
			c.evictLocked()
			switch {
			case len(c.queue) >= c.queueCap || c.overOwn(n):
				c.failLocked(CloseSlowConsumer, "slow consumer")
				return true, false
			case c.overProcess(n):
				if int64(c.bytes+n) > c.s.fairShare() {
					c.failLocked(CloseSlowConsumer, "slow consumer")
					return true, false
				}
				shed = true
			}
		}
		if f.terminal {
			delete(c.carry, f.runID)
		}
	}
	f.cost = f.size()
	c.queue = append(c.queue, f)
	c.account(f.cost)
	return false, shed
}

// carryLocked drops delta f; the run's next delta to this connection will
// start its delta text where f's started. Nothing is copied: the text is
// the run's full text, which every delta carries anyway.
func (c *conn) carryLocked(f outFrame) {
	if c.carry == nil {
		c.carry = map[string]int{}
	}
	if from, ok := c.carry[f.runID]; !ok || f.delta.from < from {
		c.carry[f.runID] = f.delta.from
	}
	c.s.stats.droppedDeltas.Add(1)
}

// evictLocked removes the droppable frames from the queue and reports
// whether any were removed.
func (c *conn) evictLocked() bool {
	kept := c.queue[:0]
	for _, f := range c.queue {
		switch f.kind {
		case kindDelta:
			c.carryLocked(f)
			c.account(-f.cost)
		case kindTick:
			c.account(-f.cost)
		default:
			kept = append(kept, f)
		}
	}
	evicted := len(kept) < len(c.queue)
	clear(c.queue[len(kept):])
	c.queue = kept
	return evicted
}

// closeWith asks the writer to close the connection with code and reason:
// after the frames already queued when flush is set (an error response
// explaining the close), at once otherwise. Later frames are discarded.
func (c *conn) closeWith(code int, reason string, flush bool) {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	if !flush {
		c.dropQueueLocked()
	}
	c.closing, c.closeCode, c.closeWhy = true, code, reason
	c.mu.Unlock()
	c.signal()
}

// failLocked is closeWith without flushing, with c.mu held; the caller
// wakes the writer.
func (c *conn) failLocked(code int, reason string) {
	c.dropQueueLocked()
	c.closing, c.closeCode, c.closeWhy = true, code, reason
}

func (c *conn) isClosing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closing
}

// writer owns the write side: it writes queued frames, numbering the event
// frames with the connection's gap-free seq, sends ticks (and pings) every
// tickIntervalMs after hello, and sends the close frame when one was
// requested. It exits after the close frame or on a write error (then the
// socket is closed, which ends the reader).
func (c *conn) writer() {
	defer close(c.writerDone)
	var (
		seq    uint64
		batch  []outFrame
		ticker *time.Ticker
		tickC  <-chan time.Time
		num    []byte
		ping   bool // send a ping with the next write
	)
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	for {
		select {
		case <-c.wake:
			// Let the producer that woke us finish its burst (a step's
			// result and the next step's start, a final and the lifecycle
			// end) so that they leave in one write.
			runtime.Gosched()
		case <-tickC:
			c.push(tickFrame()) // the ping goes out with it, below
			ping = true
			continue
		}
		if ticker == nil {
			if d := time.Duration(c.tickEvery.Load()); d > 0 {
				ticker = time.NewTicker(d)
				tickC = ticker.C
			}
		}
		c.mu.Lock()
		batch, c.queue = c.queue, batch[:0]
		closing, code, why := c.closing, c.closeCode, c.closeWhy
		c.mu.Unlock()

		if len(batch) > 0 {
			c.ws.SetWriteDeadline(time.Now().Add(writeWait))
			c.out.hold()
		}
		var err error
		if ping && len(batch) > 0 {
			ping = false
			err = c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeWait))
		}
		for i := 0; i < len(batch) && err == nil; i++ {
			f := &batch[i]
			if f.data == nil {
				f.data = f.delta.encode()
			}
			var w io.WriteCloser
			w, err = c.ws.NextWriter(websocket.TextMessage)
			if err == nil {
				_, err = w.Write(f.data)
				if err == nil && f.seq {
					seq++
					num = strconv.AppendUint(num[:0], seq, 10)
					num = append(num, '}')
					_, err = w.Write(num)
				}
				if cerr := w.Close(); err == nil {
					err = cerr
				}
			}
			if err != nil {
				break
			}
		}
		if len(batch) > 0 {
			if ferr := c.out.flush(); err == nil {
				err = ferr
			}
			c.s.stats.frames.Add(uint64(len(batch)))
			c.s.stats.writes.Add(1)
			n := 0
			for i := range batch {
				n += batch[i].cost
			}
			c.mu.Lock()
			c.account(-n)
			c.mu.Unlock()
		}
		if err != nil {
			c.s.log.Debug("websocket write failed", "conn", c.id, "err", err)
			c.ws.NetConn().Close()
			return
		}
		clear(batch)
		// Once closing, push accepts nothing more: the batch just written
		// was the last.
		if closing && code != 0 {
			err := c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, why), time.Now().Add(writeWait))
			if err != nil && !errors.Is(err, websocket.ErrCloseSent) {
				c.ws.NetConn().Close()
			} else {
				c.ws.SetReadDeadline(time.Now().Add(closeGrace))
			}
			return
		}
		if closing {
			return // the reader has ended
		}
	}
}

// isTimeout reports whether err is a deadline error.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// batchConn is the hijacked connection with a write side that the writer
// can hold: while held, writes (frames, and control frames other goroutines
// send) collect in a buffer that flush sends in one system call. Released,
// writes go straight through. One syscall per writer round instead of one
// per frame is most of the server's CPU under load.
type batchConn struct {
	net.Conn
	mu   sync.Mutex
	held bool
	buf  []byte
	err  error
}

const batchFlushAt = 64 << 10 // flush early past this many buffered bytes

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	if !b.held {
		return b.Conn.Write(p)
	}
	b.buf = append(b.buf, p...)
	if len(b.buf) >= batchFlushAt {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (b *batchConn) hold() {
	b.mu.Lock()
	b.held = true
	b.mu.Unlock()
}

// flush sends what was buffered and releases the write side.
func (b *batchConn) flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held = false
	return b.flushLocked()
}

func (b *batchConn) flushLocked() error {
	if b.err != nil || len(b.buf) == 0 {
		return b.err
	}
	_, err := b.Conn.Write(b.buf)
	if cap(b.buf) > batchFlushAt {
		b.buf = nil // do not keep a large buffer per idle connection
	} else {
		b.buf = b.buf[:0]
	}
	if err != nil {
		b.err = err
	}
	return err
}

// hijacker wraps the ResponseWriter so that the upgrade hands gorilla a
// batchConn.
type hijacker struct {
	http.ResponseWriter
	out *batchConn
}

func (h *hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := h.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("websocket: the response writer cannot be hijacked")
	}
	nc, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	h.out = &batchConn{Conn: nc}
	return h.out, brw, nil
}
