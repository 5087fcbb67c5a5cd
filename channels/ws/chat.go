// The chat methods that start and stop turns: chat.send (with its busy-session
// answers and the mapping of the engine's refusals to error responses) and
// chat.abort, and checkStart, which chat.send shares with agent.

package ws

import (
	"errors"
	"time"
	"unicode/utf8"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
)

type chatSendParams struct {
	SessionKey     string  `json:"sessionKey"`
	Message        *string `json:"message"`
	IdempotencyKey string  `json:"idempotencyKey"`
	TimeoutMs      *int64  `json:"timeoutMs"`
}

const maxIdempotencyKey = 256

// sendAck is chat.send's answer while the run is live.
type sendAck struct {
	RunID  string `json:"runId"`
	Status string `json:"status"`
}

func chatSend(c *conn, req request) (any, *rpcError) {
	var p chatSendParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	if rerr := checkStart(req.Method, p.Message != nil, p.IdempotencyKey); rerr != nil {
		return nil, rerr
	}
	if p.TimeoutMs != nil && *p.TimeoutMs < 0 {
		return nil, invalid("invalid chat.send params: timeoutMs must be ≥ 0")
	}
	key, rerr := canonicalKey(req.Method, p.SessionKey)
	if rerr != nil {
		return nil, rerr
	}
	var timeout time.Duration
	if p.TimeoutMs != nil {
		timeout = time.Duration(min(*p.TimeoutMs, int64(maxWaitMs))) * time.Millisecond
	}
	// The session is watched first: the aborted event of a run /stop stops
	// goes out before the response. A command is carried out even when
	// this connection watches too many sessions; a message is not sent.
	cmd, _ := conv.Parse(*p.Message, "")
	if !c.s.watch(c, key) && cmd == conv.None {
		return nil, unavailable(tooManyWatched)
	}
	ans := conv.Handle(c.ctx, c.s.eng, c.s.cfg.Current(), conv.Inbound{
		SessionKey: key, Channel: config.ChannelWS, ChatRef: c.id, Sender: c.owner, Operator: c.operator,
		Text: *p.Message, ID: p.IdempotencyKey, Timeout: timeout, Progress: helpProgress,
	})
	if ans.Command != conv.None {
		return commandAnswer(c, req, key, p.IdempotencyKey, ans)
	}
	if ans.Err != nil {
		return nil, c.sendError(req.Method, key, p.IdempotencyKey, *p.Message, ans.Err)
	}
	ack := ans.Ack
	switch ack.Status {
	case gateway.StatusStarted, gateway.StatusInFlight:
		return sendAck{RunID: ack.RunID, Status: string(ack.Status)}, nil
	case gateway.StatusQueued, gateway.StatusSteered:
		return busyAck{RunID: ack.RunID, Status: string(ack.Status), Busy: string(ack.Busy), Ahead: ack.Ahead,
			FellBack: ack.FellBack, Dropped: ack.DroppedIDs, Text: ans.Text}, nil
	case gateway.StatusDropped:
		// busy.overflow drop-new: nothing will run, so the answer is final
		// (a client waiting for events would wait for ever).
		return nil, droppedError(ack, ans.Text)
	}
	return cachedAck(ack), nil
}

// busyAck is chat.send's answer for a message that arrived while its
// session's turn was running and was queued, collected or steered (a
// turnguard extension, docs/protocol.md §6 "Busy sessions"): runId is the
// turn it will run as (queued, collect) or the running turn it was handed
// to (steered); ahead counts the queued turns before it; text says so in
// words.
type busyAck struct {
	RunID    string `json:"runId"`
	Status   string `json:"status"` // queued | steered
	Busy     string `json:"busy"`   // queue | collect | steer | interrupt
	Ahead    int    `json:"ahead"`
	FellBack bool   `json:"fellBack,omitempty"`
	// Dropped are the run ids of the oldest waiting messages dropped to
	// make room for this one (busy.overflow drop-old); text names them.
	Dropped []string `json:"dropped,omitempty"`
	Text    string   `json:"text"`
}

const tooManyWatched = "this connection already watches too many sessions; open a new connection"

// send watches key and starts a turn, mapping the engine's refusals to
// error responses.
func (c *conn) send(method, key, runID, text string, timeout time.Duration) (gateway.Ack, *rpcError) {
	if !c.s.watch(c, key) {
		return gateway.Ack{}, unavailable(tooManyWatched)
	}
	req := gateway.SendRequest{
		SessionKey: key, Channel: config.ChannelWS, ChatRef: c.id, RunID: runID, Text: text, Timeout: timeout, Owner: c.owner,
	}
	// The engine frees a session before its final event is published, so a
	// client answering a final at once is never refused as busy.
	ack, err := c.s.eng.Send(c.ctx, req)
	if err != nil {
		return ack, c.sendError(method, key, runID, text, err)
	}
	if ack.Status == gateway.StatusDropped {
		return ack, droppedError(ack, conv.AckText(ack)) // nothing will run: no end to wait for
	}
	return ack, nil
}

// droppedError answers a message busy.overflow drop-new dropped: final
// (no run follows), with the words in Message.
func droppedError(ack gateway.Ack, words string) *rpcError {
	return &rpcError{Code: CodeUnavailable, Message: words, Details: map[string]any{"code": "DROPPED", "limit": ack.Limit, "runId": ack.RunID}}
}

// sendError maps the engine's refusal or failure of a message to an error
// response: the words a person reads in Message, a machine-readable
// details.code where a client branches. text is the message sent.
func (c *conn) sendError(method, key, runID, text string, err error) *rpcError {
	var busy *gateway.BusyError
	var full *gateway.QueueFullError
	var stuck *gateway.RunnerStuckError
	var unavail *gateway.UnavailableError
	switch {
	case errors.As(err, &full):
		details := map[string]any{"code": "QUEUE_FULL", "limit": full.Limit}
		if full.Bytes > 0 {
			details["bytes"] = full.Bytes
		}
		return &rpcError{Code: CodeUnavailable, Message: full.UserText(), Details: details}
	case errors.As(err, &busy):
		return &rpcError{Code: CodeUnavailable, Message: busy.UserText(),
			Details: map[string]any{"code": "SESSION_BUSY", "runId": busy.RunID, "stopping": busy.Stopping}}
	case errors.Is(err, gateway.ErrEmpty):
		return invalid("invalid %s params: message is empty", method)
	case errors.Is(err, gateway.ErrTooLong):
		limit := c.s.cfg.Current().Server.MaxMessageChars
		return &rpcError{Code: CodeInvalidRequest, Message: conv.TooLongText(utf8.RuneCountInString(text), limit),
			Details: map[string]any{"code": "TOO_LONG", "limit": limit}}
	case errors.Is(err, gateway.ErrWrongSession):
		return invalid("invalid %s params: idempotencyKey %q was used for another session", method, clip(runID, 80))
	case errors.Is(err, gateway.ErrReservedRunID):
		return invalid("invalid %s params: idempotencyKey %q begins with %q, which is reserved for Telegram's messages", method, clip(runID, 80), config.TelegramRunIDPrefix)
	case errors.Is(err, gateway.ErrShutdown):
		return &rpcError{Code: CodeUnavailable, Message: "gateway is shutting down", Retryable: true, RetryAfterMs: 2000}
	case errors.As(err, &stuck):
		return &rpcError{Code: CodeUnavailable, Message: stuck.UserText(), Retryable: true, RetryAfterMs: 60000}
	case errors.As(err, &unavail):
		// The store cannot write: the cause is for operators (/readyz, the
		// log, an alert), the client gets words and a retry hint.
		return &rpcError{Code: CodeUnavailable, Message: unavail.UserText(), Retryable: true, RetryAfterMs: 5000,
			Details: map[string]any{"code": "NOT_ACCEPTING_TURNS"}}
	default:
		// A failure, not a refusal: the words, never the Go error.
		c.s.log.Error("starting a turn failed", "conn", c.id, "session", key, "err", err)
		return unavailable(conv.TextCannotStart)
	}
}

// protoStatus maps an engine outcome status to the protocol's terminal
// statuses: an aborted run (timeouts, stops, shutdown) is "timeout".
func protoStatus(st gateway.Status) string {
	switch st {
	case gateway.StatusOK:
		return "ok"
	case gateway.StatusError:
		return "error"
	}
	return "timeout"
}

// cachedAck answers a repeated idempotencyKey whose run has ended.
func cachedAck(ack gateway.Ack) map[string]any {
	m := map[string]any{"runId": ack.RunID, "status": protoStatus(ack.Status)}
	if o := ack.Outcome; o != nil {
		m["stopReason"] = string(o.StopReason)
		if o.Message != "" {
			m["summary"] = o.Message
		}
	}
	return m
}

type chatAbortParams struct {
	SessionKey       string `json:"sessionKey"`
	RunID            string `json:"runId"`
	PreserveSideRuns bool   `json:"preserveSideRuns"` // accepted; there are no side runs
	// Queued (a turnguard extension; the web chat's Cancel button): runId
	// is cancelled only while it waits in the queue; a run that started
	// meanwhile is left running (aborted false).
	Queued bool `json:"queued"`
}

func chatAbort(c *conn, req request) (any, *rpcError) {
	var p chatAbortParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	key, rerr := canonicalKey(req.Method, p.SessionKey)
	if rerr != nil {
		return nil, rerr
	}
	c.s.watch(c, key) // the aborted event goes out before this response
	var res gateway.AbortResult
	var err error
	if p.Queued {
		res, err = c.s.eng.CancelQueued(c.ctx, key, p.RunID, c.owner, c.operator)
	} else {
		res, err = c.s.eng.Abort(c.ctx, key, p.RunID, event.ReasonUser, c.owner, c.operator)
	}
	switch {
	case errors.Is(err, gateway.ErrNotOwner):
		return nil, &rpcError{Code: CodeForbidden, Message: "not allowed to abort this run: another client started it"}
	case errors.Is(err, gateway.ErrWrongSession):
		return nil, invalid("runId does not match sessionKey")
	case err != nil:
		// The cause is for operators (the log); the client gets words.
		c.s.log.Error("aborting a turn failed", "conn", c.id, "session", key, "run", p.RunID, "err", err)
		return nil, unavailable(conv.TextCannotStop)
	}
	ids := res.RunIDs
	if ids == nil {
		ids = []string{}
	}
	out := map[string]any{"ok": true, "aborted": res.Aborted, "runIds": ids}
	if res.Dequeued {
		// A queued message was cancelled before it ran: no chat event
		// follows; text says so in words.
		out["queued"], out["text"] = true, messages.QueueCancelled(res.Text)
	}
	return out, nil
}

// checkStart validates what chat.send and agent share: a message and an
// idempotency key of bounded length.
func checkStart(method string, hasMessage bool, key string) *rpcError {
	switch {
	case !hasMessage:
		return invalid("invalid %s params: message is required", method)
	case key == "":
		return invalid("invalid %s params: idempotencyKey is required", method)
	case len(key) > maxIdempotencyKey:
		return invalid("invalid %s params: idempotencyKey is longer than %d bytes", method, maxIdempotencyKey)
	}
	return nil
}
