package ws

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/turnguard/turnguard/channels/conv"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
)

// handler serves one method. It returns the response payload or error; a
// handler that answers later (agent, agent.wait) returns deferred.
type handler func(c *conn, req request) (any, *rpcError)

// deferred is returned by handlers that send their own responses.
var deferred = &struct{ deferred bool }{true}

var methods map[string]handler

// methodNames are the methods hello-ok lists, in that order.
var methodNames = []string{
	"health", "status", "chat.send", "chat.abort", "chat.history", "agent", "agent.wait",
	"sessions.subscribe", "sessions.unsubscribe", "sessions.list", "sessions.describe", "sessions.patch",
	"sessions.reset", "sessions.create", "agents.list", "commands.list", "models.list", "question.list",
	"plugin.approval.list", "plugin.approval.resolve", "approval.list", "approval.resolve",
}

// eventNames are the events this server sends.
var eventNames = []string{"connect.challenge", "tick", "chat", "agent", "shutdown", "approval",
	"plugin.approval.requested", "plugin.approval.resolved", "queue"}

func init() {
	methods = map[string]handler{
		"connect":                 func(*conn, request) (any, *rpcError) { return nil, invalid("already connected") },
		"health":                  health,
		"status":                  status,
		"chat.send":               chatSend,
		"chat.abort":              chatAbort,
		"chat.history":            chatHistory,
		"agent":                   agentRun,
		"agent.wait":              agentWait,
		"sessions.subscribe":      sessionsSubscribe,
		"sessions.unsubscribe":    sessionsUnsubscribe,
		"sessions.list":           sessionsList,
		"sessions.describe":       sessionsDescribe,
		"sessions.patch":          sessionsPatch,
		"sessions.reset":          sessionsReset,
		"sessions.create":         sessionsCreate,
		"agents.list":             agentsList,
		"commands.list":           commandsList,
		"models.list":             modelsList,
		"question.list":           func(*conn, request) (any, *rpcError) { return map[string]any{"questions": []any{}}, nil },
		"plugin.approval.list":    pluginApprovalList,
		"plugin.approval.resolve": pluginApprovalResolve,
		"approval.list":           approvalList,
		"approval.resolve":        approvalResolve,
	}
}

// helloOK is the payload of a successful connect.
func (s *Server) helloOK(c *conn, p connectParams, maxPayload int, tick time.Duration) map[string]any {
	authMode, method := "token", "token"
	if s.opts.Token == "" && s.opts.OperatorToken == "" {
		authMode, method = "none", "none"
	}
	role := p.Role
	if role == "" {
		role = "operator"
	}
	scopes := p.Scopes
	if len(scopes) == 0 {
		scopes = []string{"operator.admin", "operator.read", "operator.write", "operator.approvals"}
	}
	now := time.Now()
	return map[string]any{
		"type":     "hello-ok",
		"protocol": ProtocolVersion,
		"server":   map[string]any{"version": s.opts.Version, "connId": c.id},
		"features": map[string]any{"methods": methodNames, "events": eventNames},
		"snapshot": map[string]any{
			"presence":     []any{},
			"health":       map[string]any{"ok": true, "ts": now.UnixMilli()},
			"stateVersion": map[string]any{"presence": 0, "health": 0},
			"uptimeMs":     now.Sub(s.started).Milliseconds(),
			"sessionDefaults": map[string]any{
				"defaultAgentId": defaultAgent, "mainKey": mainKey, "mainSessionKey": mainSessionKey,
			},
			"authMode": authMode,
		},
		"auth": map[string]any{"method": method, "role": role, "scopes": scopes, "operator": c.operator},
		"policy": map[string]any{
			"maxPayload": maxPayload, "maxBufferedBytes": c.queueBytes, "tickIntervalMs": tick.Milliseconds(),
			"sendQueue": c.queueCap,
		},
	}
}

func health(c *conn, _ request) (any, *rpcError) {
	now := time.Now()
	return map[string]any{
		"ok": true, "ts": now.UnixMilli(), "durationMs": 0, "uptimeMs": now.Sub(c.s.started).Milliseconds(),
		"clients": c.s.Clients(), "liveTurns": len(c.s.eng.Live()),
	}, nil
}

func status(c *conn, _ request) (any, *rpcError) {
	s := c.s
	cfg := s.cfg.Current()
	channels := []string{"websocket: " + strconv.Itoa(s.Clients()) + " clients"}
	if cfg.Channels.Telegram.Enabled {
		channels = append(channels, "telegram: "+cfg.Channels.Telegram.Mode)
	}
	sessions := s.eng.Sessions()
	recent := make([]map[string]any, 0, min(len(sessions), 10))
	now := time.Now()
	for _, si := range sessions[:min(len(sessions), 10)] {
		recent = append(recent, map[string]any{
			"key": si.Key, "kind": "direct", "age": now.Sub(si.Updated).Milliseconds(), "model": modelName(cfg),
			"totalTokens": 0, "contextTokens": contextTokens,
		})
	}
	return map[string]any{
		"runtimeVersion":     s.opts.Version,
		"heartbeat":          map[string]any{"defaultAgentId": defaultAgent, "agents": []any{}},
		"channelSummary":     channels,
		"queuedSystemEvents": []any{},
		"sessions": map[string]any{
			"paths": []any{}, "count": len(sessions),
			"defaults": map[string]any{"model": modelName(cfg), "contextTokens": contextTokens},
			"recent":   recent,
		},
		"liveTurns": s.eng.Live(),
	}, nil
}

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

type historyParams struct {
	SessionKey string `json:"sessionKey"`
	Limit      int    `json:"limit"`
}

// historyMessage is a chat.history message (and the message of chat
// events).
type historyMessage struct {
	Role       string         `json:"role"`
	Content    []contentBlock `json:"content"`
	Timestamp  int64          `json:"timestamp"`
	StopReason string         `json:"stopReason,omitempty"`
	// Turnguard: on a finished turn's first assistant message, its steps and
	// settled approvals (turndetails.go); chat.history only.
	Turnguard *turnView `json:"turnguard,omitempty"`
	// RunID is the turn the message belongs to ("" unknown); chat.history
	// only.
	RunID string `json:"runId,omitempty"`
	// Resumed marks the notice of an interrupted turn that was dispatched
	// again (agents.defaults.resume: its words say "resuming it"): a Retry
	// would run the request a second time, so a client offers none.
	// chat.history only.
	Resumed bool `json:"resumed,omitempty"`
}

type contentBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

func textMessage(role, text string, at time.Time, stop event.StopReason) *historyMessage {
	return &historyMessage{Role: role, Content: []contentBlock{{Type: "text", Text: text}}, Timestamp: ms(at), StopReason: string(stop)}
}

func chatHistory(c *conn, req request) (any, *rpcError) {
	var p historyParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	key, rerr := canonicalKey(req.Method, p.SessionKey)
	if rerr != nil {
		return nil, rerr
	}
	if p.Limit < 0 {
		return nil, invalid("invalid chat.history params: limit must be ≥ 0")
	}
	c.s.watch(c, key)
	id, msgs, err := c.s.eng.History(c.ctx, key, p.Limit)
	var unavail *gateway.HistoryUnavailableError
	if errors.As(err, &unavail) {
		// The store does not answer: an empty history would be a lie.
		return nil, &rpcError{Code: CodeUnavailable, Message: unavail.UserText(), Retryable: true, RetryAfterMs: 5000,
			Details: map[string]any{"code": "HISTORY_UNAVAILABLE"}}
	}
	// The running turn and queue after the history: a turn that ended in
	// between is in the history, not shown as running (see reattach.go).
	// In cluster mode they are asked of the replica that runs the turn
	// (one view from every replica); when it cannot be asked the history
	// is still answered, without them.
	budget := c.s.answerBudget()
	st, err := c.s.eng.StatusOf(c.ctx, key)
	if err != nil {
		c.s.log.Warn("chat.history: the session's running turn cannot be read", "conn", c.id, "session", key, "err", err)
	}
	live, used := c.s.reattachAfter(st, budget, msgs)
	turns, turnsUsed := c.s.finishedTurns(c.ctx, key, msgs, budget)
	out, omitted := fitHistory(msgs, budget-used-turnsUsed)
	attachTurns(out, turns)
	c.s.markResumed(c.ctx, out)
	res := map[string]any{
		"sessionKey": key, "sessionId": id, "messages": out, "thinkingLevel": "off", "verboseLevel": "on",
	}
	if omitted > 0 {
		res["truncated"], res["omitted"] = true, omitted
	}
	if live != nil {
		res["turnguard"] = live
	}
	return res, nil
}

// answerBudget is server.maxAnswerBytes, the largest chat.history or
// sessions.list answer.
func (s *Server) answerBudget() int {
	if b := s.cfg.Current().Server.MaxAnswerBytes; b > 0 {
		return b
	}
	return 1 << 20
}

// Per-item overhead of an answer's JSON beyond the texts (fields, escapes
// of a typical message); a bound used to fit answers in their budget.
const (
	historyOverhead = 160
	answerOverhead  = 512
)

// fitHistory returns the newest messages of msgs whose encoding fits in
// budget bytes, oldest first, and how many older ones it left out. When any
// are left out the answer starts with an assistant message saying so; a
// single message longer than the budget is cut and says so at its end. The
// texts are the engine's strings: nothing is copied but what is cut.
func fitHistory(msgs []gateway.Message, budget int) ([]*historyMessage, int) {
	budget -= answerOverhead
	used, first := 0, len(msgs)
	for first > 0 {
		n := jsonLen(msgs[first-1].Text) + historyOverhead
		if used+n > budget {
			break
		}
		used += n
		first--
	}
	var cut *historyMessage
	if first == len(msgs) && first > 0 {
		// Not even the newest message fits: send its beginning.
		first--
		m := msgs[first]
		cut = textMessage(m.Role, cutText(m.Text, budget-2*historyOverhead-200), m.Time, m.StopReason)
		cut.RunID = m.RunID
	}
	out := make([]*historyMessage, 0, len(msgs)-first+1)
	if first > 0 {
		out = append(out, textMessage("assistant", omittedText(first), msgs[first-1].Time, ""))
	}
	if cut != nil {
		return append(out, cut), first
	}
	for _, m := range msgs[first:] {
		hm := textMessage(m.Role, m.Text, m.Time, m.StopReason)
		hm.RunID = m.RunID
		out = append(out, hm)
	}
	return out, first
}

func omittedText(n int) string {
	if n == 1 {
		return "⋯ 1 earlier message is not shown: the history is too long to send at once."
	}
	return "⋯ " + strconv.Itoa(n) + " earlier messages are not shown: the history is too long to send at once."
}

// cutText returns the longest prefix of s (at a character boundary) whose
// JSON encoding with the cut notice fits in budget bytes, followed by the
// notice.
func cutText(s string, budget int) string {
	notice := "\n\n⋯ [cut: this message is " + strconv.Itoa(len(s)) + " bytes, too long to show here]"
	budget -= jsonLen(notice)
	n, end := 0, 0
	for end < len(s) {
		r, size := utf8.DecodeRuneInString(s[end:])
		if n += jsonRuneLen(r); n > budget {
			break
		}
		end += size
	}
	return s[:end] + notice
}

// jsonLen is the length of s encoded as a JSON string (jsonstr.Append,
// mustJSON: no HTML escapes).
func jsonLen(s string) int {
	n := 2
	for _, r := range s {
		n += jsonRuneLen(r)
	}
	return n
}

func jsonRuneLen(r rune) int {
	switch {
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20:
		return 6
	case r == '\u2028' || r == '\u2029' || r == utf8.RuneError:
		return 6
	}
	return utf8.RuneLen(r)
}

type agentParams struct {
	Message        *string  `json:"message"`
	IdempotencyKey string   `json:"idempotencyKey"`
	SessionKey     string   `json:"sessionKey"`
	AgentID        string   `json:"agentId"`
	Timeout        *float64 `json:"timeout"` // seconds
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

// agentRun starts a turn and answers twice on the request's id: "accepted"
// at once, then the outcome when the run ends.
func agentRun(c *conn, req request) (any, *rpcError) {
	var p agentParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	if rerr := checkStart(req.Method, p.Message != nil, p.IdempotencyKey); rerr != nil {
		return nil, rerr
	}
	if p.Timeout != nil && !(*p.Timeout >= 0) {
		return nil, invalid("invalid agent params: timeout must be a number of seconds ≥ 0")
	}
	key := p.SessionKey
	if key == "" && p.AgentID != "" {
		key = "agent:" + p.AgentID + ":" + mainKey
	}
	key, rerr := canonicalKey(req.Method, key)
	if rerr != nil {
		return nil, rerr
	}
	if !c.acquireWaiter() {
		return nil, &rpcError{Code: CodeUnavailable, Message: "too many agent calls waiting on this connection", Retryable: true, RetryAfterMs: 1000}
	}
	var timeout time.Duration
	if p.Timeout != nil {
		timeout = time.Duration(min(*p.Timeout, maxWaitMs/1000) * float64(time.Second))
	}
	// The waiter is registered before the turn starts, so the run's end
	// cannot be missed; the bus handler answers it right after the run's
	// terminal chat event (see Server.endAgentWaiters).
	w := &agentWaiter{c: c, id: req.ID}
	c.s.addAgentWaiter(p.IdempotencyKey, w)
	ack, rerr := c.send(req.Method, key, p.IdempotencyKey, *p.Message, timeout)
	if rerr != nil {
		c.s.removeAgentWaiter(p.IdempotencyKey, w)
		c.releaseWaiter()
		return nil, rerr
	}
	c.push(resFrame(req.ID, map[string]any{
		"runId": ack.RunID, "sessionKey": key, "agentId": agentOf(key), "status": "accepted", "acceptedAt": time.Now().UnixMilli(),
	}, nil))
	if ack.Outcome != nil { // a repeated key of a finished run
		c.s.removeAgentWaiter(p.IdempotencyKey, w)
		c.push(agentFinal(req.ID, *ack.Outcome))
		c.releaseWaiter()
		return deferred, nil
	}
	if out, ended := c.s.acceptAgentWaiter(p.IdempotencyKey, w); ended {
		c.push(agentFinal(req.ID, out))
		c.releaseWaiter()
	}
	return deferred, nil
}

// agentWaiter is an agent call waiting for its run's end.
type agentWaiter struct {
	c        *conn
	id       json.RawMessage
	accepted bool             // the "accepted" response is queued
	out      *gateway.Outcome // the run ended before that
}

func (s *Server) addAgentWaiter(runID string, w *agentWaiter) {
	s.runsMu.Lock()
	defer s.runsMu.Unlock()
	s.agentWaits[runID] = append(s.agentWaits[runID], w)
}

func (s *Server) removeAgentWaiter(runID string, w *agentWaiter) {
	s.runsMu.Lock()
	defer s.runsMu.Unlock()
	s.dropWaiterLocked(runID, w)
}

func (s *Server) dropWaiterLocked(runID string, w *agentWaiter) {
	ws := s.agentWaits[runID]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(s.agentWaits, runID)
	} else {
		s.agentWaits[runID] = ws
	}
}

// acceptAgentWaiter records that w's "accepted" response is queued. If the
// run already ended it returns the outcome for the caller to send.
func (s *Server) acceptAgentWaiter(runID string, w *agentWaiter) (gateway.Outcome, bool) {
	s.runsMu.Lock()
	defer s.runsMu.Unlock()
	w.accepted = true
	if w.out == nil {
		return gateway.Outcome{}, false
	}
	s.dropWaiterLocked(runID, w)
	return *w.out, true
}

// endAgentWaiters answers the agent calls waiting for run out.RunID: those
// already accepted get the final response now, the others when their
// handler has queued "accepted".
func (s *Server) endAgentWaiters(out gateway.Outcome) {
	s.runsMu.Lock()
	ws := s.agentWaits[out.RunID]
	var now []*agentWaiter
	for _, w := range ws {
		if w.accepted {
			now = append(now, w)
		} else {
			w.out = &out
		}
	}
	for _, w := range now {
		s.dropWaiterLocked(out.RunID, w)
	}
	s.runsMu.Unlock()
	for _, w := range now {
		w.c.push(agentFinal(w.id, out))
		w.c.releaseWaiter()
	}
}

// agentFinal is the agent method's second response.
func agentFinal(id []byte, out gateway.Outcome) outFrame {
	switch out.Status {
	case gateway.StatusOK:
		return resFrame(id, map[string]any{
			"runId": out.RunID, "status": "ok", "summary": "completed",
			"result": map[string]any{
				"payloads": []map[string]any{{"text": out.Text}},
				"meta":     map[string]any{"durationMs": out.EndedAt.Sub(out.StartedAt).Milliseconds()},
			},
		}, nil)
	case gateway.StatusError:
		return resFrame(id, map[string]any{"runId": out.RunID, "status": "error", "summary": out.Message}, unavailable(out.Message))
	}
	summary := out.Message
	if summary == "" {
		summary = "aborted"
	}
	return resFrame(id, map[string]any{"runId": out.RunID, "status": "timeout", "summary": summary, "stopReason": string(out.StopReason)}, nil)
}

func (c *conn) acquireWaiter() bool {
	if c.waiters.Add(1) > maxWaiters {
		c.waiters.Add(-1)
		return false
	}
	return true
}

func (c *conn) releaseWaiter() { c.waiters.Add(-1) }

type agentWaitParams struct {
	RunID     string `json:"runId"`
	TimeoutMs *int64 `json:"timeoutMs"`
}

func agentWait(c *conn, req request) (any, *rpcError) {
	var p agentWaitParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	if p.RunID == "" {
		return nil, invalid("invalid agent.wait params: runId is required")
	}
	wait := int64(defaultWaitMs)
	if p.TimeoutMs != nil {
		if *p.TimeoutMs < 0 {
			return nil, invalid("invalid agent.wait params: timeoutMs must be ≥ 0")
		}
		wait = min(*p.TimeoutMs, maxWaitMs)
	}
	if !c.acquireWaiter() {
		return nil, &rpcError{Code: CodeUnavailable, Message: "too many agent.wait calls on this connection", Retryable: true, RetryAfterMs: 1000}
	}
	go func() {
		defer c.releaseWaiter()
		ctx, cancel := context.WithTimeout(c.ctx, time.Duration(wait)*time.Millisecond)
		defer cancel()
		out, ok := c.s.eng.Wait(ctx, p.RunID)
		if c.ctx.Err() != nil {
			return
		}
		res := map[string]any{"runId": p.RunID, "status": "timeout"}
		if ok {
			res["status"] = protoStatus(out.Status)
			res["startedAt"], res["endedAt"] = ms(out.StartedAt), ms(out.EndedAt)
			if out.Status != gateway.StatusOK {
				res["stopReason"] = string(out.StopReason)
				res["error"] = out.Message
			}
		}
		c.push(resFrame(req.ID, res, nil))
	}()
	return deferred, nil
}

func sessionsSubscribe(c *conn, _ request) (any, *rpcError) {
	c.s.watchEverything(c, true)
	return map[string]any{"subscribed": true}, nil
}

func sessionsUnsubscribe(c *conn, _ request) (any, *rpcError) {
	c.s.watchEverything(c, false)
	return map[string]any{"subscribed": false}, nil
}

type sessionsListParams struct {
	AgentID string `json:"agentId"`
	Limit   int    `json:"limit"`
}

func sessionsList(c *conn, req request) (any, *rpcError) {
	var p sessionsListParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	all := c.s.eng.Sessions()
	rows := make([]sessionRow, 0, min(len(all), 100))
	budget, used, truncated := c.s.answerBudget()-answerOverhead, 0, false
	for _, si := range all {
		if p.AgentID != "" && !strings.HasPrefix(si.Key, "agent:"+p.AgentID+":") {
			continue
		}
		if p.Limit > 0 && len(rows) >= p.Limit {
			break
		}
		r := c.s.row(si)
		n := rowOverhead + jsonLen(r.Key) + jsonLen(r.SessionID) + jsonLen(r.Model) + jsonLen(r.ActiveRunID)
		if used+n > budget {
			truncated = true // the most recent sessions come first: the oldest are left out
			break
		}
		used += n
		rows = append(rows, r)
	}
	cfg := c.s.cfg.Current()
	res := map[string]any{
		"ts": time.Now().UnixMilli(), "count": len(rows),
		"defaults": map[string]any{"model": modelName(cfg), "modelProvider": modelProvider, "contextTokens": contextTokens},
		"sessions": rows,
	}
	if truncated {
		res["truncated"] = true
	}
	return res, nil
}

// rowOverhead bounds the JSON of a session row beyond its strings.
const rowOverhead = 260

// keyParams are the params of the sessions.* methods that name one
// session: key (sessionKey is accepted too).
type keyParams struct {
	Key        string `json:"key"`
	SessionKey string `json:"sessionKey"`
	AgentID    string `json:"agentId"`
}

func (p keyParams) canonical(method string) (string, *rpcError) {
	k := p.Key
	if k == "" {
		k = p.SessionKey
	}
	return canonicalKey(method, k)
}

// describe returns the row of key, creating the session if it is new.
func (s *Server) describe(ctx context.Context, key string) sessionRow {
	id, _, _ := s.eng.History(ctx, key, 1) // the id only: it is known without the stored history
	for _, si := range s.eng.Sessions() {
		if si.Key == key {
			return s.row(si)
		}
	}
	return s.row(gateway.SessionInfo{Key: key, ID: id})
}

func sessionsDescribe(c *conn, req request) (any, *rpcError) {
	var p keyParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	key, rerr := p.canonical(req.Method)
	if rerr != nil {
		return nil, rerr
	}
	c.s.watch(c, key)
	return map[string]any{"session": c.s.describe(c.ctx, key)}, nil
}

// sessionsPatch accepts a patch but changes nothing: verbose and thinking
// levels are fixed ("on", "off"); the answer shows the unchanged row.
func sessionsPatch(c *conn, req request) (any, *rpcError) {
	var p keyParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	key, rerr := p.canonical(req.Method)
	if rerr != nil {
		return nil, rerr
	}
	return map[string]any{"ok": true, "key": key, "entry": c.s.describe(c.ctx, key), "applied": false}, nil
}

func sessionsReset(c *conn, req request) (any, *rpcError) {
	var p keyParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	key, rerr := p.canonical(req.Method)
	if rerr != nil {
		return nil, rerr
	}
	return map[string]any{"ok": true, "key": key, "entry": c.s.row(c.s.eng.Reset(key))}, nil
}

func sessionsCreate(c *conn, req request) (any, *rpcError) {
	var p keyParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	if p.Key == "" && p.SessionKey == "" {
		agent := p.AgentID
		if agent == "" {
			agent = defaultAgent
		}
		p.Key = "agent:" + agent + ":" + uuid.NewString()[:8]
	}
	key, rerr := p.canonical(req.Method)
	if rerr != nil {
		return nil, rerr
	}
	c.s.watch(c, key)
	return map[string]any{"ok": true, "key": key, "entry": c.s.row(c.s.eng.Reset(key))}, nil
}

func agentsList(*conn, request) (any, *rpcError) {
	return map[string]any{
		"defaultId": defaultAgent, "mainKey": mainKey, "scope": "per-sender",
		"agents": []map[string]any{{"id": defaultAgent, "name": "Main"}},
	}, nil
}

func modelsList(c *conn, _ request) (any, *rpcError) {
	m := modelName(c.s.cfg.Current())
	return map[string]any{"models": []map[string]any{{"id": m, "name": m, "provider": modelProvider}}}, nil
}
