-- Schema version 8: the questions runners ask the person (approvals), one
-- row each, from event.ApprovalRequested (status 'pending') to how it was
-- settled (event.ApprovalResolved: 'selected', 'timeout'; the end of its
-- turn: 'cancelled'; a restart: 'expired'). options is the JSON array of
-- event.ApprovalOption. detail and title are kept with credentials
-- redacted (store.RedactSecrets). No foreign key: like the journal, a row
-- does not depend on its turn's row, and retention deletes it with its
-- turn.

CREATE TABLE approvals (
    id          TEXT    PRIMARY KEY CHECK (id <> ''),
    run_id      TEXT    NOT NULL CHECK (run_id <> ''),
    session_key TEXT    NOT NULL,
    channel     TEXT    NOT NULL DEFAULT '',
    chat_ref    TEXT    NOT NULL DEFAULT '',
    title       TEXT    NOT NULL DEFAULT '',
    detail      TEXT    NOT NULL DEFAULT '',
    tool        TEXT    NOT NULL DEFAULT '',
    options     TEXT    NOT NULL DEFAULT '[]' CHECK (json_valid(options)),
    status      TEXT    NOT NULL
        CHECK (status IN ('pending', 'selected', 'timeout', 'cancelled', 'expired')),
    option_id   TEXT    NOT NULL DEFAULT '',
    option_kind TEXT    NOT NULL DEFAULT '',
    answered_by TEXT    NOT NULL DEFAULT '',
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER,
    resolved_at INTEGER
) STRICT;

-- A run's approvals (Approvals by run, and the end of a turn cancelling
-- what is still pending).
CREATE INDEX approvals_by_run ON approvals (run_id, created_at);
-- By status: the pending ones (start-up recovery, channels' lookups).
CREATE INDEX approvals_by_status ON approvals (status, created_at);
CREATE INDEX approvals_by_session ON approvals (session_key, created_at);
-- Retention finds old rows by creation time.
CREATE INDEX approvals_created ON approvals (created_at);
