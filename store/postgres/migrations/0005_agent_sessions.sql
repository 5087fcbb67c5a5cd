-- Schema version 5: the agent session (runner/acp) of each session key's
-- current conversation, as the SQLite store's migration 10 keeps it: one
-- row per session key, replaced by a new conversation (/new), never
-- deleted by retention.

CREATE TABLE agent_sessions (
    session_key      text        PRIMARY KEY CHECK (session_key <> ''),
    conversation     text        NOT NULL CHECK (conversation <> ''),
    agent_session_id text        NOT NULL CHECK (agent_session_id <> ''),
    updated_at       timestamptz NOT NULL
);
