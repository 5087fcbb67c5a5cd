-- Schema version 2: the journal of turn events, the outbox of terminal
-- messages, the turn's deadlines, and indexes for the start-up and
-- per-session queries.

ALTER TABLE turns ADD COLUMN deadline_at INTEGER;     -- wall-clock deadline
ALTER TABLE turns ADD COLUMN ceiling_at INTEGER;      -- max turn time
ALTER TABLE turns ADD COLUMN step_timeout_ns INTEGER; -- liveness window

CREATE INDEX turns_running ON turns (started_at) WHERE state = 'running';
CREATE INDEX turns_by_session ON turns (session_key, started_at);

CREATE TABLE journal (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT    NOT NULL,
    session_key TEXT    NOT NULL,
    seq         INTEGER NOT NULL DEFAULT 0,
    kind        TEXT    NOT NULL,
    stop_reason TEXT    NOT NULL DEFAULT '',
    step_kind   TEXT    NOT NULL DEFAULT '',
    step_name   TEXT    NOT NULL DEFAULT '',
    step_seq    INTEGER NOT NULL DEFAULT 0,
    last_step   TEXT    NOT NULL DEFAULT '',
    elapsed_ns  INTEGER NOT NULL DEFAULT 0,
    message     TEXT    NOT NULL DEFAULT '',
    at          INTEGER NOT NULL
) STRICT;

CREATE INDEX journal_by_run ON journal (run_id, id);
CREATE INDEX journal_by_session ON journal (session_key, at);
CREATE INDEX journal_by_time ON journal (at);

CREATE TABLE outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    channel         TEXT    NOT NULL CHECK (channel <> ''),
    chat_ref        TEXT    NOT NULL DEFAULT '',
    run_id          TEXT    NOT NULL CHECK (run_id <> ''),
    kind            TEXT    NOT NULL CHECK (kind IN ('final', 'notice')),
    text            TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT    NOT NULL DEFAULT '',
    last_attempt_at INTEGER,
    delivered_at    INTEGER,
    failed_at       INTEGER,
    UNIQUE (run_id, kind)
) STRICT;

CREATE INDEX outbox_pending ON outbox (channel, id)
    WHERE delivered_at IS NULL AND failed_at IS NULL;
