package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// AgentSessions keeps, per session key, the agent session (runner/acp)
// that serves its current conversation, so that a conversation keeps its
// agent's context across a gateway restart: the runner asks the agent to
// load or resume that session instead of opening a new one. One record per
// session key; a new conversation of the key (/new) replaces it.
// Retention never deletes it. SQLite and the PostgreSQL store
// (store/postgres) implement it.
type AgentSessions interface {
	// AgentSession returns the conversation and the agent's session id
	// recorded for sessionKey; both "" when there is none.
	AgentSession(ctx context.Context, sessionKey string) (conversation, agentSessionID string, err error)
	// SetAgentSession records that agentSessionID serves conversation of
	// sessionKey, replacing what was recorded for the key; an empty
	// agentSessionID forgets the key's record. sessionKey is required,
	// and so is conversation with an id (ErrInvalid).
	SetAgentSession(ctx context.Context, sessionKey, conversation, agentSessionID string) error
}

var _ AgentSessions = (*SQLite)(nil)

// CheckAgentSession refuses (ErrInvalid) a record SetAgentSession must not
// store: no session key, or an id without its conversation.
func CheckAgentSession(sessionKey, conversation, agentSessionID string) error {
	switch {
	case sessionKey == "":
		return fmt.Errorf("agent session: no session key: %w", ErrInvalid)
	case agentSessionID != "" && conversation == "":
		return fmt.Errorf("agent session of %q: no conversation: %w", sessionKey, ErrInvalid)
	}
	return nil
}

// AgentSession returns the agent session recorded for sessionKey (see
// AgentSessions).
func (s *SQLite) AgentSession(ctx context.Context, sessionKey string) (string, string, error) {
	release, err := s.acquire()
	if err != nil {
		return "", "", err
	}
	defer release()
	var conv, id string
	err = s.r.QueryRowContext(ctx, `SELECT conversation, agent_session_id FROM agent_sessions WHERE session_key = ?`,
		sessionKey).Scan(&conv, &id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("agent session of %q: %w", sessionKey, err)
	}
	return conv, id, nil
}

// SetAgentSession records (or, with an empty id, forgets) the agent
// session of sessionKey, durably (see AgentSessions).
func (s *SQLite) SetAgentSession(ctx context.Context, sessionKey, conversation, agentSessionID string) error {
	if err := CheckAgentSession(sessionKey, conversation, agentSessionID); err != nil {
		return err
	}
	release, err := s.acquire()
	if err != nil {
		return err
	}
	defer release()
	err = s.durably(ctx, func(tx *sql.Tx) error {
		if agentSessionID == "" {
			_, err := tx.ExecContext(ctx, `DELETE FROM agent_sessions WHERE session_key = ?`, sessionKey)
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO agent_sessions (session_key, conversation, agent_session_id, updated_at)
			VALUES (?1, ?2, ?3, ?4)
			ON CONFLICT (session_key) DO UPDATE SET conversation = excluded.conversation,
				agent_session_id = excluded.agent_session_id, updated_at = excluded.updated_at`,
			sessionKey, conversation, agentSessionID, nanos(time.Now()))
		return err
	})
	if err != nil {
		return fmt.Errorf("record the agent session of %q: %w", sessionKey, err)
	}
	return nil
}
