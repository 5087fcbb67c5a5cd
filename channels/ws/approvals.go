package ws

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
)

// Approvals (docs/approvals.md). A runner's question reaches the watchers
// of its session twice over:
//
//   - turnguard's own `approval` event, to every watcher:
//     {runId, sessionKey, agentId, state: "requested"|"resolved",
//     approval: {id, title, detail, tool, options[{id,label,kind}],
//     createdAt, expiresAt, outcome?, optionId?, optionKind?, by?,
//     resolvedAt?}, text}. The web chat draws it as a card; approval.list
//     and approval.resolve {id, optionId} are its methods.
//   - OpenClaw's `plugin.approval.requested` / `plugin.approval.resolved`,
//     only to clients that take approvals the way OpenClaw's gateway
//     delivers them (scope operator.admin or operator.approvals, and client
//     id openclaw-tui or cap plugin-approvals/approvals): the TUI shows them
//     as its approval prompt and answers with plugin.approval.resolve {id,
//     decision}, decision one of allow-once | allow-always | deny;
//     plugin.approval.list is what it reloads after a (re)connect.
//
// A question the turn ended under (stopped, timed out, shut down) is never
// answered by the engine's ApprovalResolved (the turn's own ending says
// so); the run's state settles it for its watchers as "cancelled" right
// before the terminal chat event, so a card or prompt never stays open.

// The OpenClaw decisions.
const (
	decisionAllowOnce   = "allow-once"
	decisionAllowAlways = "allow-always"
	decisionDeny        = "deny"
)

// maxApprovalIDLen bounds an approval id in a request (the engine's are
// 21 bytes); a longer one is refused before any lookup.
const maxApprovalIDLen = 128

// decisionOf maps an option kind to OpenClaw's decision.
func decisionOf(kind string) string {
	switch kind {
	case "allow_once":
		return decisionAllowOnce
	case "allow_always":
		return decisionAllowAlways
	}
	return decisionDeny
}

// allowedDecisions are the decisions a's options offer, in their order,
// each once (the first option of a decision is the one it chooses).
func allowedDecisions(a *event.Approval) []string {
	out := make([]string, 0, 3)
	for _, o := range a.Options {
		if d := decisionOf(o.Kind); !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		out = append(out, decisionDeny)
	}
	return out
}

// optionFor is the option of a that decision chooses: the first whose kind
// maps to it.
func optionFor(a *event.Approval, decision string) (event.ApprovalOption, bool) {
	for _, o := range a.Options {
		if decisionOf(o.Kind) == decision {
			return o, true
		}
	}
	return event.ApprovalOption{}, false
}

// approvalPayload is the payload of turnguard's `approval` event.
type approvalPayload struct {
	RunID      string          `json:"runId"`
	SessionKey string          `json:"sessionKey"`
	AgentID    string          `json:"agentId,omitempty"`
	Seq        uint64          `json:"seq"`   // the run's payload seq, shared with its chat and agent events
	State      string          `json:"state"` // requested | resolved
	Approval   *event.Approval `json:"approval"`
	Text       string          `json:"text"` // the question, or how it was settled, in words
}

// nativeRequest is the request of an OpenClaw plugin approval.
type nativeRequest struct {
	Title            string   `json:"title"`
	Description      string   `json:"description,omitempty"`
	ToolName         string   `json:"toolName,omitempty"`
	Severity         string   `json:"severity"`
	AllowedDecisions []string `json:"allowedDecisions"`
	AgentID          string   `json:"agentId,omitempty"`
	SessionKey       string   `json:"sessionKey"`
	RunID            string   `json:"runId,omitempty"`
}

// nativeApproval is a pending plugin approval as plugin.approval.requested
// carries it and plugin.approval.list lists it.
type nativeApproval struct {
	ID           string        `json:"id"`
	ApprovalKind string        `json:"approvalKind"`
	Request      nativeRequest `json:"request"`
	CreatedAtMs  int64         `json:"createdAtMs"`
	ExpiresAtMs  int64         `json:"expiresAtMs"`
}

// nativeResolved is the payload of plugin.approval.resolved. Outcome and
// OptionID are turnguard's (OpenClaw clients read id only).
type nativeResolved struct {
	ID         string        `json:"id"`
	Decision   string        `json:"decision"`
	ResolvedBy *string       `json:"resolvedBy"`
	Ts         int64         `json:"ts"`
	Request    nativeRequest `json:"request"`
	Outcome    string        `json:"outcome"`
	OptionID   string        `json:"optionId,omitempty"`
}

func toNativeRequest(a *event.Approval, key, runID string) nativeRequest {
	return nativeRequest{Title: a.Title, Description: a.Detail, ToolName: a.Tool, Severity: "warning",
		AllowedDecisions: allowedDecisions(a), AgentID: agentOf(key), SessionKey: key, RunID: runID}
}

func toNative(a *event.Approval, key, runID string) nativeApproval {
	exp := a.ExpiresAt
	if !exp.After(a.CreatedAt) { // never: approvalTimeoutSeconds > 0; the TUI drops a prompt without one
		exp = a.CreatedAt.Add(24 * time.Hour)
	}
	return nativeApproval{ID: a.ID, ApprovalKind: "plugin", Request: toNativeRequest(a, key, runID),
		CreatedAtMs: ms(a.CreatedAt), ExpiresAtMs: ms(exp)}
}

// settledDecision is the decision a settled approval amounts to: its
// option's, and deny when nothing was chosen (timeout, cancelled, expired).
func settledDecision(a *event.Approval) string {
	if a.Outcome == event.ApprovalSelected {
		return decisionOf(a.OptionKind)
	}
	return decisionDeny
}

// onApproval handles ApprovalRequested and ApprovalResolved for the run,
// with rs.mu held: it keeps the run's open questions and appends the
// frames.
func (rs *runState) onApproval(ev event.Event) {
	a := ev.Approval
	if a == nil {
		return
	}
	if ev.Kind == event.ApprovalRequested {
		if rs.asks == nil {
			rs.asks = map[string]*event.Approval{}
		}
		rs.asks[a.ID] = a
		rs.approvalFrames(a, "requested", ev.Message)
		return
	}
	delete(rs.asks, a.ID)
	rs.approvalFrames(a, "resolved", ev.Message)
}

// closeApprovals settles the run's open questions as cancelled for its
// watchers: the run is ending, so nobody can answer them any more.
func (rs *runState) closeApprovals(t time.Time) {
	for _, id := range slices.Sorted(maps.Keys(rs.asks)) {
		r := *rs.asks[id]
		r.Outcome, r.ResolvedAt = event.ApprovalCancelled, t
		rs.approvalFrames(&r, "resolved", messages.ApprovalSettled(&r))
	}
	rs.asks = nil
}

// approvalFrames appends the `approval` event and the OpenClaw one (for
// approval clients only). Neither is ever dropped for a slow client.
func (rs *runState) approvalFrames(a *event.Approval, state, text string) {
	if !rs.watched {
		return
	}
	rs.last = time.Now()
	rs.seq++ // the run's payload seq counts these too, like its chat and agent events
	p := approvalPayload{RunID: rs.id, SessionKey: rs.key, AgentID: rs.agent, Seq: rs.seq, State: state, Approval: a, Text: text}
	rs.frames = append(rs.frames, outFrame{data: eventHead("approval", mustJSON(p)), seq: true, runID: rs.id})
	var native []byte
	if state == "requested" {
		native = eventHead("plugin.approval.requested", mustJSON(toNative(a, rs.key, rs.id)))
	} else {
		r := nativeResolved{ID: a.ID, Decision: settledDecision(a), Ts: ms(a.ResolvedAt),
			Request: toNativeRequest(a, rs.key, rs.id), Outcome: a.Outcome, OptionID: a.OptionID}
		if a.By != "" {
			by := a.By
			r.ResolvedBy = &by
		}
		if r.Ts == 0 {
			r.Ts = time.Now().UnixMilli()
		}
		native = eventHead("plugin.approval.resolved", mustJSON(r))
	}
	rs.frames = append(rs.frames, outFrame{data: native, seq: true, approvalsOnly: true})
}

// approvalClient reports whether a connection takes OpenClaw's approval
// events: it claims scope operator.admin or operator.approvals (no scopes
// claimed: hello-ok grants all) and is the TUI or declares cap
// plugin-approvals or approvals — the rule of OpenClaw's own gateway.
func approvalClient(p connectParams) bool {
	return approvalScope(p.Scopes) && (p.Client.ID == "openclaw-tui" ||
		slices.Contains(p.Caps, "plugin-approvals") || slices.Contains(p.Caps, "approvals"))
}

// approvalScope reports whether scopes allow answering approvals.
func approvalScope(scopes []string) bool {
	return len(scopes) == 0 || slices.Contains(scopes, "operator.admin") || slices.Contains(scopes, "operator.approvals")
}

// answerer is who answers question id from c, as the person is shown it:
// "operator" for an operator answering a question of a conversation it has
// not opened, else the client ("web chat", "TUI") — the holder of the one
// shared token answering in its own chat is not shown as "the operator".
func (c *conn) answerer(id string) string {
	if c.approvalOperator() {
		if _, key, _ := c.s.pendingApproval(id); key == "" || !c.s.watchesByName(c, key) {
			return "operator"
		}
	}
	switch c.clientID {
	case "openclaw-tui":
		return "TUI"
	case "turnguard-web":
		return "web chat"
	}
	return "WebSocket client"
}

// approvalOperator: c answers as an operator — it presented the operator
// token and claims an approvals scope. The scopes a client claims are not
// checked against anything (the token grants what is asked), so they never
// make a client an operator on their own.
func (c *conn) approvalOperator() bool { return c.operator && c.approvalsScope }

// loopback reports whether ip is a loopback address.
func loopback(ip string) bool {
	a, err := netip.ParseAddr(ip)
	return err == nil && a.Unmap().IsLoopback()
}

// watchesByName reports whether c opened session key (chat.send,
// chat.history, sessions.describe … named it): the chat it is in.
func (s *Server) watchesByName(c *conn, key string) bool {
	s.watchMu.RLock()
	defer s.watchMu.RUnlock()
	_, ok := s.watchers[key][c]
	return ok
}

// namedKeys are the sessions c opened by name.
func (s *Server) namedKeys(c *conn) []string {
	s.watchMu.RLock()
	defer s.watchMu.RUnlock()
	return slices.Clone(c.watchKeys)
}

// pendingApproval returns the open question id, or nil.
func (s *Server) pendingApproval(id string) (*event.Approval, string, string) {
	key, runID, ok := s.eng.ApprovalSession(id)
	if !ok {
		return nil, "", ""
	}
	for _, a := range s.eng.PendingApprovals(key) {
		if a.ID == id {
			return &a, key, runID
		}
	}
	return nil, "", ""
}

// Errors of the resolve methods: details.code (and details.reason, which
// OpenClaw clients read) name the case.
func approvalNotFound() *rpcError {
	return &rpcError{Code: CodeInvalidRequest, Message: "unknown or expired approval id",
		Details: map[string]any{"code": "APPROVAL_NOT_FOUND", "reason": "APPROVAL_NOT_FOUND"}}
}

func approvalForbidden() *rpcError {
	return &rpcError{Code: CodeForbidden, Message: "not allowed to answer this question: it belongs to another conversation",
		Details: map[string]any{"code": "APPROVAL_FORBIDDEN", "reason": "APPROVAL_FORBIDDEN"}}
}

// resolve answers question id with option optionID from c. key is the
// session the client names ("" none). A non-operator answers as a session
// it has opened: the one it names, else the question's, else (for a
// question already settled, whose session the engine alone knows) each it
// has opened in turn.
func (c *conn) resolve(method, id, optionID, key string) (gateway.ResolveResult, *rpcError) {
	switch {
	case id == "":
		return gateway.ResolveResult{}, invalid("invalid %s params: id is required", method)
	case len(id) > maxApprovalIDLen:
		return gateway.ResolveResult{}, invalid("invalid %s params: id is longer than %d bytes", method, maxApprovalIDLen)
	case len(optionID) > maxApprovalIDLen:
		return gateway.ResolveResult{}, invalid("invalid %s params: optionId is longer than %d bytes", method, maxApprovalIDLen)
	case !c.s.requiresAuth() && !loopback(c.ip):
		// Never: without a token only loopback clients get this far. But
		// an answer lets a tool run, so it is checked here too.
		return gateway.ResolveResult{}, approvalForbidden()
	}
	req := gateway.ResolveRequest{ApprovalID: id, OptionID: optionID, By: c.answerer(id), Operator: c.approvalOperator()}
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	var keys []string
	switch {
	case req.Operator:
		// Any question; the session, when named, routes the answer to
		// the replica that asked it (cluster mode).
		keys = []string{key}
		if key == "" {
			if k, _, ok := c.s.eng.ApprovalSession(id); ok {
				keys = []string{k}
			}
		}
	case key != "":
		if !c.s.watchesByName(c, key) {
			return gateway.ResolveResult{}, approvalForbidden()
		}
		keys = []string{key}
	default:
		if k, _, ok := c.s.eng.ApprovalSession(id); ok {
			if !c.s.watchesByName(c, k) {
				return gateway.ResolveResult{}, approvalForbidden()
			}
			keys = []string{k}
		} else {
			keys = c.s.namedKeys(c)
		}
	}
	err := error(gateway.ErrApprovalForbidden)
	var res gateway.ResolveResult
	for _, k := range keys {
		req.SessionKey = k
		if res, err = c.s.eng.Resolve(ctx, req); !errors.Is(err, gateway.ErrApprovalForbidden) {
			break
		}
	}
	switch {
	case err == nil:
		if !res.Already {
			c.s.log.Info("approval answered over websocket", "conn", c.id, "approval", id, "option", res.Approval.OptionID,
				"by", req.By, "operator", req.Operator)
		}
		return res, nil
	case errors.Is(err, gateway.ErrApprovalNotFound):
		return res, approvalNotFound()
	case errors.Is(err, gateway.ErrApprovalForbidden):
		return res, approvalForbidden()
	case errors.Is(err, gateway.ErrApprovalOption):
		d := map[string]any{"code": "APPROVAL_OPTION", "reason": "APPROVAL_OPTION"}
		if a, _, _ := c.s.pendingApproval(id); a != nil {
			ids := make([]string, len(a.Options))
			for i, o := range a.Options {
				ids[i] = o.ID
			}
			d["options"] = ids
		}
		return res, &rpcError{Code: CodeInvalidRequest, Message: "invalid " + method + " params: optionId " +
			quoteClip(optionID) + " is not one of the question's options", Details: d}
	}
	c.s.log.Error("answering an approval failed", "conn", c.id, "approval", id, "err", err)
	return res, unavailable("the answer could not be recorded; try again")
}

func quoteClip(s string) string { return `"` + clip(s, 60) + `"` }

// approvalResolveParams are the params of approval.resolve (turnguard).
type approvalResolveParams struct {
	ID         string `json:"id"`
	OptionID   string `json:"optionId"`
	SessionKey string `json:"sessionKey"`
}

// approvalResolve answers a question with one of its options: {ok, already,
// approval, text}. A question settled already is not an error: already is
// true and approval says how it was settled.
func approvalResolve(c *conn, req request) (any, *rpcError) {
	var p approvalResolveParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	if p.OptionID == "" {
		return nil, invalid("invalid %s params: optionId is required", req.Method)
	}
	key := ""
	if p.SessionKey != "" {
		k, rerr := canonicalKey(req.Method, p.SessionKey)
		if rerr != nil {
			return nil, rerr
		}
		key = k
	}
	res, rerr := c.resolve(req.Method, p.ID, p.OptionID, key)
	if rerr != nil {
		return nil, rerr
	}
	a := res.Approval
	return map[string]any{"ok": true, "already": res.Already, "approval": &a, "text": messages.ApprovalSettled(&a)}, nil
}

// pluginResolveParams are the params of plugin.approval.resolve (OpenClaw).
type pluginResolveParams struct {
	ID       string `json:"id"`
	Decision string `json:"decision"`
}

// pluginApprovalResolve answers a question with an OpenClaw decision, as
// OpenClaw's gateway does: {ok: true}; the same decision again is {ok:
// true}, another after the question was settled is INVALID_REQUEST
// "approval already resolved" (details.reason APPROVAL_ALREADY_RESOLVED,
// details.approval how it was settled).
func pluginApprovalResolve(c *conn, req request) (any, *rpcError) {
	var p pluginResolveParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	switch p.Decision {
	case decisionAllowOnce, decisionAllowAlways, decisionDeny:
	default:
		return nil, &rpcError{Code: CodeInvalidRequest, Message: "invalid decision: use allow-once, allow-always or deny",
			Details: map[string]any{"code": "APPROVAL_OPTION"}}
	}
	optionID := ""
	if len(p.ID) <= maxApprovalIDLen {
		if a, _, _ := c.s.pendingApproval(p.ID); a != nil {
			o, ok := optionFor(a, p.Decision)
			if !ok {
				return nil, &rpcError{Code: CodeInvalidRequest, Message: p.Decision + " is unavailable for this approval",
					Details: map[string]any{"code": "APPROVAL_OPTION", "allowedDecisions": allowedDecisions(a)}}
			}
			optionID = o.ID
		}
	}
	res, rerr := c.resolve(req.Method, p.ID, optionID, "")
	if rerr != nil {
		return nil, rerr
	}
	if res.Already && settledDecision(&res.Approval) != p.Decision {
		a := res.Approval
		return nil, &rpcError{Code: CodeInvalidRequest, Message: "approval already resolved: " + messages.ApprovalSettled(&a),
			Details: map[string]any{"code": "APPROVAL_ALREADY_RESOLVED", "reason": "APPROVAL_ALREADY_RESOLVED", "approval": &a}}
	}
	return map[string]any{"ok": true}, nil
}

// pluginApprovalList lists the open questions in OpenClaw's shape. The TUI
// calls it at start-up, before it names its session, and shows only its
// session's; every open question is listed, as sessions.subscribe already
// shows every session's events to any client holding the token.
func pluginApprovalList(c *conn, req request) (any, *rpcError) {
	if !c.approvalsScope {
		return nil, &rpcError{Code: CodeForbidden, Message: "missing scope: operator.approvals"}
	}
	pending := c.s.eng.PendingApprovals("")
	out := make([]nativeApproval, 0, len(pending))
	for i := range pending {
		a := &pending[i]
		key, runID, ok := c.s.eng.ApprovalSession(a.ID)
		if !ok {
			continue // settled meanwhile
		}
		out = append(out, toNative(a, key, runID))
	}
	return out, nil
}

// approvalListParams are the params of approval.list (turnguard).
type approvalListParams struct {
	SessionKey string `json:"sessionKey"`
}

// approvalView is an open question as approval.list and chat.history's
// turnguard.approvals show it.
type approvalView struct {
	RunID      string `json:"runId"`
	SessionKey string `json:"sessionKey"`
	event.Approval
	Text string `json:"text"` // the question in words
}

// approvalList lists open questions: of sessionKey when given; else, for
// an operator, of every session, and for others, of the sessions the
// connection opened.
func approvalList(c *conn, req request) (any, *rpcError) {
	var p approvalListParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	var keys []string
	switch {
	case p.SessionKey != "":
		k, rerr := canonicalKey(req.Method, p.SessionKey)
		if rerr != nil {
			return nil, rerr
		}
		keys = []string{k}
	case c.approvalOperator():
		keys = []string{""}
	default:
		keys = c.s.namedKeys(c)
	}
	out := []approvalView{}
	for _, k := range keys {
		if k == "" {
			out = append(out, c.s.approvalViews(k)...)
			continue
		}
		// A named session's questions live with its turn: in cluster mode
		// on the replica that runs it (an empty list would be a lie when
		// it cannot be asked).
		st, err := c.s.eng.StatusOf(c.ctx, k)
		if err != nil {
			c.s.log.Warn("approval.list: the session's open questions cannot be read", "conn", c.id, "session", k, "err", err)
			return nil, &rpcError{Code: CodeUnavailable, Message: messages.Unavailable, Retryable: true, RetryAfterMs: 5000}
		}
		out = append(out, approvalViewsOf(st)...)
	}
	return map[string]any{"approvals": out}, nil
}

// approvalViewsOf are the open questions of st's running turn.
func approvalViewsOf(st gateway.TurnStatus) []approvalView {
	if !st.Running {
		return nil
	}
	out := make([]approvalView, 0, len(st.Approvals))
	for _, a := range st.Approvals {
		out = append(out, approvalView{RunID: st.Turn.RunID, SessionKey: st.SessionKey, Approval: a, Text: messages.ApprovalAsked(&a)})
	}
	return out
}

// approvalViews are the open questions of session key ("" every session).
func (s *Server) approvalViews(key string) []approvalView {
	var out []approvalView
	for _, a := range s.eng.PendingApprovals(key) {
		k, runID, ok := s.eng.ApprovalSession(a.ID)
		if !ok {
			continue
		}
		out = append(out, approvalView{RunID: runID, SessionKey: k, Approval: a, Text: messages.ApprovalAsked(&a)})
	}
	return out
}
