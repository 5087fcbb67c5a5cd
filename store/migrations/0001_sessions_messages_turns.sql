-- Schema version 1: sessions, their chat history, and one row per turn.
-- Times are Unix nanoseconds (UTC); NULL means "not known / not yet".

CREATE TABLE sessions (
    key        TEXT    PRIMARY KEY CHECK (key <> ''),
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;

CREATE TABLE messages (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    session_key TEXT    NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    run_id      TEXT    NOT NULL DEFAULT '',
    role        TEXT    NOT NULL CHECK (role IN ('user', 'assistant')),
    text        TEXT    NOT NULL,
    stop_reason TEXT    NOT NULL DEFAULT '',
    created_at  INTEGER NOT NULL
) STRICT;

CREATE INDEX messages_by_session ON messages (session_key, id);

CREATE TABLE turns (
    run_id         TEXT    PRIMARY KEY CHECK (run_id <> ''),
    session_key    TEXT    NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    channel        TEXT    NOT NULL DEFAULT '',
    chat_ref       TEXT    NOT NULL DEFAULT '',
    state          TEXT    NOT NULL CHECK (state IN ('running', 'finished', 'aborted')),
    stop_reason    TEXT    NOT NULL DEFAULT '',
    started_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    ended_at       INTEGER,
    step_kind      TEXT,
    step_name      TEXT,
    step_seq       INTEGER,
    last_step_kind TEXT,
    last_step_name TEXT,
    last_step_seq  INTEGER
) STRICT;
