-- Schema version 7: a session key's own settings (/queue <mode>), as the
-- SQLite store's migration 12 keeps them: one row per session key, kept
-- by /new, never deleted by retention.

CREATE TABLE session_settings (
    session_key text        PRIMARY KEY CHECK (session_key <> ''),
    busy_mode   text        NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL
);
