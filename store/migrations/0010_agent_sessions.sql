-- Schema version 10: the agent session (runner/acp) of each session key's
-- current conversation, so that a conversation keeps its agent's context
-- across a gateway restart, an agent crash or the agent's idle stop
-- (session/load or session/resume of agent_session_id). One row per
-- session key: a new conversation (/new) replaces it. Retention never
-- deletes it.

CREATE TABLE agent_sessions (
    session_key      TEXT    PRIMARY KEY CHECK (session_key <> ''),
    conversation     TEXT    NOT NULL CHECK (conversation <> ''),
    agent_session_id TEXT    NOT NULL CHECK (agent_session_id <> ''),
    updated_at       INTEGER NOT NULL
) STRICT;
