-- Schema version 3: the questions runners ask the person (approvals), as
-- the SQLite store's migration 8 keeps them: one row each, from
-- event.ApprovalRequested (status 'pending') to how it was settled
-- (event.ApprovalResolved: 'selected', 'timeout'; the end of its turn:
-- 'cancelled'; a restart or a takeover: 'expired'). options is the JSON
-- array of event.ApprovalOption. detail and title are kept with
-- credentials redacted (store.RedactSecrets). No foreign key: like the
-- journal, a row does not depend on its turn's row, and retention deletes
-- it with its turn.

CREATE TABLE approvals (
    id          text        PRIMARY KEY CHECK (id <> ''),
    run_id      text        NOT NULL CHECK (run_id <> ''),
    session_key text        NOT NULL,
    channel     text        NOT NULL DEFAULT '',
    chat_ref    text        NOT NULL DEFAULT '',
    title       text        NOT NULL DEFAULT '',
    detail      text        NOT NULL DEFAULT '',
    tool        text        NOT NULL DEFAULT '',
    options     jsonb       NOT NULL DEFAULT '[]',
    status      text        NOT NULL
        CHECK (status IN ('pending', 'selected', 'timeout', 'cancelled', 'expired')),
    option_id   text        NOT NULL DEFAULT '',
    option_kind text        NOT NULL DEFAULT '',
    answered_by text        NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz,
    resolved_at timestamptz
);

CREATE INDEX approvals_by_run ON approvals (run_id, created_at);
CREATE INDEX approvals_by_status ON approvals (status, created_at);
CREATE INDEX approvals_by_session ON approvals (session_key, created_at);
CREATE INDEX approvals_created ON approvals (created_at);
