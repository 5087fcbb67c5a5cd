package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/store"
)

var _ store.AgentSessions = (*Store)(nil)

// AgentSession returns the agent session recorded for sessionKey; see
// store.AgentSessions.
func (s *Store) AgentSession(ctx context.Context, sessionKey string) (string, string, error) {
	if err := s.live(); err != nil {
		return "", "", err
	}
	var conv, id string
	err := s.pool.QueryRow(ctx, `SELECT conversation, agent_session_id FROM agent_sessions WHERE session_key = $1`,
		sessionKey).Scan(&conv, &id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("agent session of %q: %w", sessionKey, err)
	}
	return conv, id, nil
}

// SetAgentSession records (or, with an empty id, forgets) the agent
// session of sessionKey, committed with synchronous_commit on; see
// store.AgentSessions.
func (s *Store) SetAgentSession(ctx context.Context, sessionKey, conversation, agentSessionID string) error {
	if err := store.CheckAgentSession(sessionKey, conversation, agentSessionID); err != nil {
		return err
	}
	if err := s.live(); err != nil {
		return err
	}
	err := s.inTx(ctx, true, func(tx pgx.Tx) error {
		if agentSessionID == "" {
			_, err := tx.Exec(ctx, `DELETE FROM agent_sessions WHERE session_key = $1`, sessionKey)
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO agent_sessions (session_key, conversation, agent_session_id, updated_at)
			VALUES ($1, $2, $3, $4)
			ON CONFLICT (session_key) DO UPDATE SET conversation = excluded.conversation,
				agent_session_id = excluded.agent_session_id, updated_at = excluded.updated_at`,
			sessionKey, conversation, agentSessionID, time.Now())
		return err
	})
	if err != nil {
		return fmt.Errorf("record the agent session of %q: %w", sessionKey, err)
	}
	return nil
}
