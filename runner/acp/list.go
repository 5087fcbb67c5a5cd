package acp

import (
	"context"
	"errors"
	"fmt"
)

// maxListed bounds the agent sessions ListSessions returns.
const maxListed = 5

// AgentSession is one session the agent listed (session/list): its id, its
// title and when it was last updated, as the agent says ("" when it does
// not), cut for display.
type AgentSession struct {
	ID, Title, UpdatedAt string
}

// AgentSessions is the first page of the agent's sessions in the workdir:
// at most maxListed, Current the id of the one serving the conversation,
// More when the agent has more.
type AgentSessions struct {
	Current  string
	Sessions []AgentSession
	More     bool
}

// ErrNoList: the agent does not advertise sessionCapabilities.list.
var ErrNoList = errors.New("acp: the agent cannot list its sessions")

// ListSessions asks the agent serving the current conversation of session
// key key for its sessions in the workdir (session/list, first page,
// bounded by startTimeoutSeconds). Errors: ErrNoSession, ErrNoList, or the
// agent's failure (wrapped).
func (r *Runner) ListSessions(ctx context.Context, key string) (AgentSessions, error) {
	ag, sid := r.sessionOf(key)
	if ag == nil {
		return AgentSessions{}, ErrNoSession
	}
	if !ag.caps.list {
		return AgentSessions{}, ErrNoList
	}
	var res struct {
		Sessions []struct {
			SessionID string  `json:"sessionId"`
			Title     *string `json:"title"`
			UpdatedAt *string `json:"updatedAt"`
		} `json:"sessions"`
		NextCursor *string `json:"nextCursor"`
	}
	if err := ag.call(ctx, r.startTimeout, "session/list", map[string]any{"cwd": r.dir}, &res); err != nil {
		return AgentSessions{}, fmt.Errorf("acp: session/list: %w", err)
	}
	out := AgentSessions{Current: sid, More: (res.NextCursor != nil && *res.NextCursor != "") || len(res.Sessions) > maxListed}
	for _, s := range res.Sessions[:min(len(res.Sessions), maxListed)] {
		as := AgentSession{ID: cutRunes(oneLine(s.SessionID), maxModeID)}
		if s.Title != nil {
			as.Title = cutRunes(oneLine(*s.Title), maxCommandDesc)
		}
		if s.UpdatedAt != nil {
			as.UpdatedAt = cutRunes(oneLine(*s.UpdatedAt), 40)
		}
		out.Sessions = append(out.Sessions, as)
	}
	return out, nil
}
