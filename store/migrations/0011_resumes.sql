-- Schema version 11: resumed turns (agents.defaults.resume, issue 23).
--
-- A resumes row is one attempt of a turn dispatched again by the start-up
-- recovery (or a takeover) after the previous attempt was cut off: run_id
-- is the new attempt's run id, prev_run_id the attempt it replaces (the
-- one cut off), origin_run_id the first attempt's, attempt
-- its number (2 for the first resume), step_kind and step_name the step
-- the previous attempt was cut off in, confirm 1 when the person is asked
-- before it runs (the step was a tool call). The row is written with the
-- attempt's queued message, in one transaction, before the previous
-- attempt is marked interrupted, so the count survives any crash. No
-- foreign key: retention deletes a row with its turn.
CREATE TABLE resumes (
    run_id            TEXT    PRIMARY KEY CHECK (run_id <> ''),
    prev_run_id       TEXT    NOT NULL CHECK (prev_run_id <> ''),
    origin_run_id     TEXT    NOT NULL CHECK (origin_run_id <> ''),
    session_key       TEXT    NOT NULL CHECK (session_key <> ''),
    attempt           INTEGER NOT NULL CHECK (attempt >= 2),
    step_kind         TEXT    NOT NULL DEFAULT '',
    step_name         TEXT    NOT NULL DEFAULT '',
    confirm           INTEGER NOT NULL DEFAULT 0 CHECK (confirm IN (0, 1)),
    origin_started_at INTEGER NOT NULL,
    created_at        INTEGER NOT NULL
) STRICT;

-- Retention finds old rows by creation time; Resumed by the attempt
-- replaced (a resumed turn's notice offers no Retry).
CREATE INDEX resumes_created ON resumes (created_at);
CREATE INDEX resumes_prev ON resumes (prev_run_id);
