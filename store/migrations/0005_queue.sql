-- Schema version 5: messages queued behind a session's running turn (busy
-- mode queue or collect). A row is written, with a full sync, before the
-- sender is told "queued", and removed when its turn starts or it is
-- dropped (/stop, /new). Retention never deletes it. seq keeps the order in
-- which they were queued (Queued lists oldest first).

CREATE TABLE queued (
    run_id      TEXT    PRIMARY KEY CHECK (run_id <> ''),
    seq         INTEGER NOT NULL UNIQUE,
    session_key TEXT    NOT NULL CHECK (session_key <> ''),
    channel     TEXT    NOT NULL DEFAULT '',
    chat_ref    TEXT    NOT NULL DEFAULT '',
    owner       TEXT    NOT NULL DEFAULT '',
    text        TEXT    NOT NULL CHECK (text <> ''),
    queued_at   INTEGER NOT NULL
) STRICT;
