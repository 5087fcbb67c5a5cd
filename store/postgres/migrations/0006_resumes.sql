-- Schema version 6: resumed turns (agents.defaults.resume), as the SQLite
-- store's migration 11 keeps them: one row per resumed attempt, written
-- with its queued message in one transaction before the previous attempt
-- is marked interrupted; retention deletes a row with its turn.
CREATE TABLE resumes (
    run_id            text        PRIMARY KEY CHECK (run_id <> ''),
    prev_run_id       text        NOT NULL CHECK (prev_run_id <> ''),
    origin_run_id     text        NOT NULL CHECK (origin_run_id <> ''),
    session_key       text        NOT NULL CHECK (session_key <> ''),
    attempt           integer     NOT NULL CHECK (attempt >= 2),
    step_kind         text        NOT NULL DEFAULT '',
    step_name         text        NOT NULL DEFAULT '',
    confirm           boolean     NOT NULL DEFAULT false,
    origin_started_at timestamptz NOT NULL,
    created_at        timestamptz NOT NULL
);

CREATE INDEX resumes_created ON resumes (created_at);
CREATE INDEX resumes_prev ON resumes (prev_run_id);
