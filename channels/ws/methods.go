// The method table and the methods about the gateway itself: the hello-ok
// payload of connect, health, status, agents.list and models.list. Each
// group of methods has its own file: chat.go (chat.send, chat.abort),
// history.go (chat.history), agent.go (agent, agent.wait),
// sessionmethods.go (sessions.*), approvals.go (approval.*,
// plugin.approval.*).

package ws

import (
	"strconv"
	"time"
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
