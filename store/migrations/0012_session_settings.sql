-- Schema version 12: a session key's own settings, set by its person and
-- kept across restarts: busy_mode is what /queue <mode> set ('' = the
-- channel's configured busy mode). One row per session key; a new
-- conversation (/new) keeps it. Retention never deletes it.

CREATE TABLE session_settings (
    session_key TEXT    PRIMARY KEY CHECK (session_key <> ''),
    busy_mode   TEXT    NOT NULL DEFAULT '',
    updated_at  INTEGER NOT NULL
) STRICT;
