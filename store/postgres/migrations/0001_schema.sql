-- Schema version 1: everything the SQLite store keeps after its migration 7,
-- in one step. Times are timestamptz (microseconds); durations are bigint
-- nanoseconds; NULL means "not known / not yet".
--
-- turns is keyed by run id and carries its session: the cluster's claims
-- and leases (a later version) attach there.

CREATE TABLE sessions (
    key         text        PRIMARY KEY CHECK (key <> ''),
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    -- the id of the last message before the last reset (/new); History
    -- returns only later messages
    reset_after bigint      NOT NULL DEFAULT 0
);

CREATE TABLE messages (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_key text        NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    run_id      text        NOT NULL DEFAULT '',
    role        text        NOT NULL CHECK (role IN ('user', 'assistant')),
    text        text        NOT NULL,
    stop_reason text        NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL
);

CREATE INDEX messages_by_session ON messages (session_key, id);
CREATE INDEX messages_created ON messages (created_at);

CREATE TABLE turns (
    run_id          text        PRIMARY KEY CHECK (run_id <> ''),
    session_key     text        NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    channel         text        NOT NULL DEFAULT '',
    chat_ref        text        NOT NULL DEFAULT '',
    state           text        NOT NULL CHECK (state IN ('running', 'finished', 'aborted')),
    stop_reason     text        NOT NULL DEFAULT '',
    started_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    ended_at        timestamptz,
    step_kind       text,
    step_name       text,
    step_seq        bigint,
    last_step_kind  text,
    last_step_name  text,
    last_step_seq   bigint,
    deadline_at     timestamptz, -- wall-clock deadline
    ceiling_at      timestamptz, -- max turn time
    step_timeout_ns bigint       -- liveness window
);

CREATE INDEX turns_running ON turns (started_at) WHERE state = 'running';
CREATE INDEX turns_by_session ON turns (session_key, started_at);
CREATE INDEX turns_ended ON turns (ended_at) WHERE state <> 'running';

CREATE TABLE journal (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      text        NOT NULL,
    session_key text        NOT NULL,
    seq         bigint      NOT NULL DEFAULT 0,
    kind        text        NOT NULL,
    stop_reason text        NOT NULL DEFAULT '',
    step_kind   text        NOT NULL DEFAULT '',
    step_name   text        NOT NULL DEFAULT '',
    step_seq    bigint      NOT NULL DEFAULT 0,
    last_step   text        NOT NULL DEFAULT '',
    elapsed_ns  bigint      NOT NULL DEFAULT 0,
    message     text        NOT NULL DEFAULT '',
    at          timestamptz NOT NULL
);

CREATE INDEX journal_by_run ON journal (run_id, id);
CREATE INDEX journal_by_session ON journal (session_key, at);
CREATE INDEX journal_by_time ON journal (at);

CREATE TABLE outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel         text        NOT NULL CHECK (channel <> ''),
    chat_ref        text        NOT NULL DEFAULT '',
    run_id          text        NOT NULL CHECK (run_id <> ''),
    kind            text        NOT NULL CHECK (kind IN ('final', 'notice')),
    text            text        NOT NULL,
    created_at      timestamptz NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text        NOT NULL DEFAULT '',
    last_attempt_at timestamptz,
    delivered_at    timestamptz,
    failed_at       timestamptz,
    parts_sent      integer     NOT NULL DEFAULT 0,
    UNIQUE (run_id, kind)
);

CREATE INDEX outbox_pending ON outbox (channel, id) WHERE delivered_at IS NULL AND failed_at IS NULL;
CREATE INDEX outbox_done ON outbox ((coalesce(delivered_at, failed_at)));

-- Messages queued behind a session's running turn; seq keeps the order in
-- which they were queued, across replicas.
CREATE TABLE queued (
    run_id      text        PRIMARY KEY CHECK (run_id <> ''),
    seq         bigint      GENERATED ALWAYS AS IDENTITY UNIQUE,
    session_key text        NOT NULL CHECK (session_key <> ''),
    channel     text        NOT NULL DEFAULT '',
    chat_ref    text        NOT NULL DEFAULT '',
    owner       text        NOT NULL DEFAULT '',
    text        text        NOT NULL CHECK (text <> ''),
    queued_at   timestamptz NOT NULL,
    timeout     bigint      NOT NULL DEFAULT 0 CHECK (timeout >= 0)
);
