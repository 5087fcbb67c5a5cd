// Package wsclient is a small client of the gateway's WebSocket protocol
// (OpenClaw protocol v4, docs/protocol.md) for tests that drive a running
// gateway process: the handshake (connect.challenge → connect → hello-ok),
// requests answered by id (safe from many goroutines at once), and every
// event the connection receives kept in order, decoded enough to match on
// (chat and agent payloads), so a test can wait for one or compare whole
// sequences. Every wait is bounded; a closed connection is reported with its
// close code, never as silence.
package wsclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/turnguard/turnguard/internal/tb"
)

// CallTimeout bounds how long a request waits for its response.
const CallTimeout = 15 * time.Second

// Error is a response's error object.
type Error struct {
	Code         string         `json:"code"`
	Message      string         `json:"message"`
	Retryable    bool           `json:"retryable"`
	RetryAfterMs int64          `json:"retryAfterMs"`
	Details      map[string]any `json:"details"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Frame is any protocol frame.
type Frame struct {
	Type    string          `json:"type"`
	ID      string          `json:"id"`
	Method  string          `json:"method"`
	OK      bool            `json:"ok"`
	Event   string          `json:"event"`
	Seq     int64           `json:"seq"`
	Payload json.RawMessage `json:"payload"`
	Error   *Error          `json:"error"`
}

// Event is a received event with the fields of chat and agent payloads that
// tests match on; Raw is the whole payload.
type Event struct {
	Name  string // chat, agent, tick, shutdown, …
	Frame int64  // the frame's per-connection seq
	Raw   json.RawMessage
	At    time.Time // when it was read

	RunID        string `json:"runId"`
	SessionKey   string `json:"sessionKey"`
	Seq          int64  `json:"seq"`     // the run's payload seq (chat and agent together)
	EndedAt      int64  `json:"endedAt"` // chat terminal states: unix ms of the run's end
	State        string `json:"state"`   // chat: delta, final, aborted, error
	StopReason   string `json:"stopReason"`
	ErrorMessage string `json:"errorMessage"`
	Stream       string `json:"stream"` // agent: lifecycle, tool, item
	Data         struct {
		Phase      string `json:"phase"`
		Name       string `json:"name"`
		ToolCallID string `json:"toolCallId"`
		StopReason string `json:"stopReason"`
	} `json:"data"`
}

// Terminal reports whether e ends its run for the user: a chat event in
// state final, aborted or error.
func (e Event) Terminal() bool {
	return e.Name == "chat" && (e.State == "final" || e.State == "aborted" || e.State == "error")
}

// String is a short form for failure messages.
func (e Event) String() string {
	switch e.Name {
	case "chat":
		return fmt.Sprintf("chat %s run=%s seq=%d %s", e.State, e.RunID, e.Seq, e.StopReason)
	case "agent":
		return fmt.Sprintf("agent %s/%s run=%s seq=%d %s", e.Stream, e.Data.Phase, e.RunID, e.Seq, e.Data.Name)
	}
	return e.Name
}

// Client is one protocol connection.
type Client struct {
	t    tb.TB
	name string // for messages: which gateway
	conn *websocket.Conn

	wmu sync.Mutex // one writer
	n   int

	mu       sync.Mutex
	pending  map[string]chan Frame
	events   []Event
	changed  chan struct{} // closed and replaced when events or closed change
	ready    bool          // the handshake is done: OnEvent and Discard apply
	onEvent  func(Event)
	discard  bool
	closed   bool
	closeErr error
	done     chan struct{} // closed with the connection
}

// Options configure Dial.
type Options struct {
	Token  string   // server.token (or the operator token)
	Name   string   // names the gateway in failure messages
	Scopes []string // default: operator.read, operator.write, operator.admin
	NoCaps bool     // leave out the tool-events cap
	// OnEvent, when set, is called with every event after the handshake,
	// on the connection's reading goroutine, in order.
	OnEvent func(Event)
	// Discard keeps no events after the handshake (Events, WaitEvent and
	// WaitEnd then see none): for load, where OnEvent counts them.
	Discard bool
}

// Dial connects to url (ws://host:port/), completes the handshake and
// returns the client; it is closed at the test's cleanup. It fails the test
// if the gateway does not answer within CallTimeout.
func Dial(t tb.TB, url string, o Options) *Client {
	t.Helper()
	c, err := DialErr(t, url, o)
	if err != nil {
		t.Fatalf("wsclient: %s: %v", o.Name, err)
	}
	return c
}

// DialErr is Dial that returns the error instead of failing the test.
func DialErr(t tb.TB, url string, o Options) (*Client, error) {
	d := websocket.Dialer{HandshakeTimeout: CallTimeout}
	conn, _, err := d.Dial(url, nil)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", url, err)
	}
	c := &Client{t: t, name: o.Name, conn: conn, pending: map[string]chan Frame{}, changed: make(chan struct{}),
		onEvent: o.OnEvent, discard: o.Discard, done: make(chan struct{})}
	t.Cleanup(func() { conn.Close() })
	go c.read()
	if _, err := c.waitErr(CallTimeout, "connect.challenge", func(e Event) bool { return e.Name == "connect.challenge" }); err != nil {
		conn.Close()
		return nil, err
	}
	scopes := o.Scopes
	if scopes == nil {
		scopes = []string{"operator.read", "operator.write", "operator.admin"}
	}
	caps := []string{"tool-events"}
	if o.NoCaps {
		caps = []string{}
	}
	params := map[string]any{
		"minProtocol": 4, "maxProtocol": 4,
		"client": map[string]any{"id": "turnguard-test", "version": "1", "platform": "linux", "mode": "cli"},
		"caps":   caps, "role": "operator", "scopes": scopes,
	}
	if o.Token != "" {
		params["auth"] = map[string]any{"token": o.Token}
	}
	res, err := c.CallErr("connect", params)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if !res.OK {
		conn.Close()
		return nil, fmt.Errorf("connect refused: %v", res.Error)
	}
	c.mu.Lock()
	c.ready = true
	if c.discard {
		c.events = nil
	}
	c.mu.Unlock()
	return c, nil
}

func (c *Client) read() {
	for {
		_, b, err := c.conn.ReadMessage()
		if err != nil {
			c.mu.Lock()
			c.closed, c.closeErr = true, err
			close(c.done)
			for id, ch := range c.pending {
				close(ch)
				delete(c.pending, id)
			}
			c.notifyLocked()
			c.mu.Unlock()
			return
		}
		var f Frame
		if json.Unmarshal(b, &f) != nil {
			continue
		}
		c.mu.Lock()
		switch f.Type {
		case "res":
			if ch, ok := c.pending[f.ID]; ok {
				ch <- f
				delete(c.pending, f.ID)
			}
		case "event":
			e := Event{Name: f.Event, Frame: f.Seq, Raw: f.Payload, At: time.Now()}
			_ = json.Unmarshal(f.Payload, &e)
			e.Name, e.Frame, e.Raw = f.Event, f.Seq, f.Payload
			if !c.ready || !c.discard {
				c.events = append(c.events, e)
				c.notifyLocked()
			}
			if c.ready && c.onEvent != nil {
				c.mu.Unlock()
				c.onEvent(e)
				continue
			}
		}
		c.mu.Unlock()
	}
}

func (c *Client) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Call sends a request and returns its response; it fails the test when the
// connection closes or no response comes within CallTimeout.
func (c *Client) Call(method string, params any) Frame {
	c.t.Helper()
	f, err := c.CallErr(method, params)
	if err != nil {
		c.t.Fatalf("wsclient %s: %s: %v", c.name, method, err)
	}
	return f
}

// CallErr is Call returning a transport failure (closed, timed out) as an
// error; a response with ok:false is not an error here.
func (c *Client) CallErr(method string, params any) (Frame, error) {
	ch := make(chan Frame, 1)
	c.mu.Lock()
	if c.closed {
		err := c.closeErr
		c.mu.Unlock()
		return Frame{}, fmt.Errorf("connection closed (%v)", err)
	}
	c.n++
	id := "c" + strconv.Itoa(c.n)
	c.pending[id] = ch
	c.mu.Unlock()
	c.wmu.Lock()
	_ = c.conn.SetWriteDeadline(time.Now().Add(CallTimeout))
	err := c.conn.WriteJSON(map[string]any{"type": "req", "id": id, "method": method, "params": params})
	c.wmu.Unlock()
	if err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return Frame{}, fmt.Errorf("write: %w", err)
	}
	timer := time.NewTimer(CallTimeout)
	defer timer.Stop()
	select {
	case f, ok := <-ch:
		if !ok {
			return Frame{}, fmt.Errorf("connection closed before the %s response (close code %d)", method, c.CloseCode())
		}
		return f, nil
	case <-timer.C:
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return Frame{}, fmt.Errorf("no %s response within %v", method, CallTimeout)
	}
}

// Ack is chat.send's answer.
type Ack struct {
	OK     bool
	RunID  string `json:"runId"`
	Status string `json:"status"` // started, queued, in_flight, ok, …
	Text   string `json:"text"`
	Err    *Error
	Raw    json.RawMessage
}

// SendErr is chat.send with idempotencyKey runID; a transport failure is
// returned as an error.
func (c *Client) SendErr(session, text, runID string) (Ack, error) {
	f, err := c.CallErr("chat.send", map[string]any{"sessionKey": session, "message": text, "idempotencyKey": runID})
	if err != nil {
		return Ack{}, err
	}
	a := Ack{OK: f.OK, Err: f.Error, Raw: f.Payload}
	_ = json.Unmarshal(f.Payload, &a)
	a.OK, a.Err, a.Raw = f.OK, f.Error, f.Payload
	return a, nil
}

// Send is SendErr failing the test on a transport failure.
func (c *Client) Send(session, text, runID string) Ack {
	c.t.Helper()
	a, err := c.SendErr(session, text, runID)
	if err != nil {
		c.t.Fatalf("wsclient %s: chat.send %s: %v", c.name, runID, err)
	}
	return a
}

// MustStart sends and fails the test unless the answer is started for runID.
func (c *Client) MustStart(session, text, runID string) {
	c.t.Helper()
	a := c.Send(session, text, runID)
	if !a.OK || a.RunID != runID || a.Status != "started" {
		c.t.Fatalf("wsclient %s: chat.send %s: ok=%v status=%q runId=%q err=%v payload=%s", c.name, runID, a.OK, a.Status, a.RunID, a.Err, a.Raw)
	}
}

// Abort is chat.abort of runID in session ("" runID: the session's running
// turn).
func (c *Client) Abort(session, runID string) Frame {
	c.t.Helper()
	p := map[string]any{"sessionKey": session}
	if runID != "" {
		p["runId"] = runID
	}
	return c.Call("chat.abort", p)
}

// Subscribe makes the connection watch every session (sessions.subscribe).
func (c *Client) Subscribe() {
	c.t.Helper()
	if f := c.Call("sessions.subscribe", map[string]any{}); !f.OK {
		c.t.Fatalf("wsclient %s: sessions.subscribe: %v", c.name, f.Error)
	}
}

// HistoryMessage is a chat.history entry.
type HistoryMessage struct {
	Role    string `json:"role"`
	Content []struct {
		Text string `json:"text"`
	} `json:"content"`
	StopReason string `json:"stopReason"`
}

// Text is the message's text.
func (m HistoryMessage) Text() string {
	var b strings.Builder
	for _, c := range m.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

// History is a chat.history answer.
type History struct {
	Messages  []HistoryMessage `json:"messages"`
	Turnguard struct {
		ActiveRun *struct {
			RunID    string `json:"runId"`
			Stopping bool   `json:"stopping"`
		} `json:"activeRun"`
	} `json:"turnguard"`
}

// History reads the session's history (it also makes the connection watch
// the session).
func (c *Client) History(session string) History {
	c.t.Helper()
	f := c.Call("chat.history", map[string]any{"sessionKey": session, "limit": 200})
	if !f.OK {
		c.t.Fatalf("wsclient %s: chat.history %s: %v", c.name, session, f.Error)
	}
	var h History
	if err := json.Unmarshal(f.Payload, &h); err != nil {
		c.t.Fatalf("wsclient %s: chat.history payload %s: %v", c.name, f.Payload, err)
	}
	return h
}

// Events returns every event received so far, in order.
func (c *Client) Events() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Event(nil), c.events...)
}

// RunEvents returns the chat and agent events of runID received so far.
func (c *Client) RunEvents(runID string) []Event {
	var out []Event
	for _, e := range c.Events() {
		if e.RunID == runID && (e.Name == "chat" || e.Name == "agent") {
			out = append(out, e)
		}
	}
	return out
}

// Done is closed once the connection is closed (by either side).
func (c *Client) Done() <-chan struct{} { return c.done }

// Closed reports whether the server closed the connection.
func (c *Client) Closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// CloseCode is the close frame's code once closed: 1006 when the connection
// dropped without one (the process died), -1 for another read error, 0
// while open.
func (c *Client) CloseCode() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		return 0
	}
	var ce *websocket.CloseError
	if errors.As(c.closeErr, &ce) {
		return ce.Code
	}
	return -1
}

// WaitEvent returns the first event received (since the connection opened)
// that match accepts; it fails the test when none comes within d or the
// connection closes first.
func (c *Client) WaitEvent(d time.Duration, what string, match func(Event) bool) Event {
	c.t.Helper()
	e, err := c.waitErr(d, what, match)
	if err != nil {
		c.t.Fatalf("wsclient %s: %v", c.name, err)
	}
	return e
}

// WaitEnd waits for the end of runID as this client sees it: its terminal
// chat event, or the connection closing. It returns the event (ok) or the
// close code; it fails the test on silence past d.
func (c *Client) WaitEnd(d time.Duration, runID string) (e Event, closeCode int, ok bool) {
	c.t.Helper()
	e, err := c.waitErr(d, "the end of run "+runID, func(e Event) bool { return e.RunID == runID && e.Terminal() })
	if err == nil {
		return e, 0, true
	}
	if code := c.CloseCode(); code != 0 {
		return Event{}, code, false
	}
	c.t.Fatalf("wsclient %s: %v", c.name, err)
	return Event{}, 0, false
}

// WaitClosed waits until the server closes the connection and returns the
// close code (see CloseCode).
func (c *Client) WaitClosed(d time.Duration) int {
	c.t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		closed, ch := c.closed, c.changed
		c.mu.Unlock()
		if closed {
			return c.CloseCode()
		}
		select {
		case <-ch:
		case <-deadline.C:
			c.t.Fatalf("wsclient %s: the connection was not closed within %v", c.name, d)
		}
	}
}

func (c *Client) waitErr(d time.Duration, what string, match func(Event) bool) (Event, error) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	seen := 0
	for {
		c.mu.Lock()
		evs, closed, ch := c.events[seen:], c.closed, c.changed
		seen = len(c.events)
		c.mu.Unlock()
		for _, e := range evs {
			if match(e) {
				return e, nil
			}
		}
		if closed {
			return Event{}, fmt.Errorf("connection closed (code %d) while waiting for %s; events:%s", c.CloseCode(), what, c.seen())
		}
		select {
		case <-ch:
		case <-deadline.C:
			return Event{}, fmt.Errorf("no %s within %v; events:%s", what, d, c.seen())
		}
	}
}

// seen lists the last events received, for failure messages.
func (c *Client) seen() string {
	evs := c.Events()
	if len(evs) > 40 {
		evs = evs[len(evs)-40:]
	}
	var b strings.Builder
	for _, e := range evs {
		b.WriteString("\n  " + e.String())
	}
	return b.String()
}

// Close closes the connection.
func (c *Client) Close() { c.conn.Close() }
