// The sessions.* methods: subscribe, unsubscribe, list, describe, patch,
// reset and create (session keys themselves are in sessions.go).

package ws

import (
	"context"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/turnguard/turnguard/gateway"
)

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

// requestKey decodes req's keyParams and returns their canonical session
// key: the methods that name one existing or new session by key.
func requestKey(req request) (string, *rpcError) {
	var p keyParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return "", rerr
	}
	return p.canonical(req.Method)
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
	key, rerr := requestKey(req)
	if rerr != nil {
		return nil, rerr
	}
	c.s.watch(c, key)
	return map[string]any{"session": c.s.describe(c.ctx, key)}, nil
}

// sessionsPatch accepts a patch but changes nothing: verbose and thinking
// levels are fixed ("on", "off"); the answer shows the unchanged row.
func sessionsPatch(c *conn, req request) (any, *rpcError) {
	key, rerr := requestKey(req)
	if rerr != nil {
		return nil, rerr
	}
	return map[string]any{"ok": true, "key": key, "entry": c.s.describe(c.ctx, key), "applied": false}, nil
}

func sessionsReset(c *conn, req request) (any, *rpcError) {
	key, rerr := requestKey(req)
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
