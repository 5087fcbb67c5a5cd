-- Schema version 9: Retry is a capability (issue 19).
--
-- turns.sender is who sent the turn's message, as its channel names them
-- (event.Event.Sender of TurnStarted; '' when the channel did not say, and
-- for turns recorded before this version).
--
-- A retry_tokens row is one Retry button offered under the notice of a
-- turn that ended in a retryable way. token_hash is the SHA-256 (hex) of
-- the secret the button carries (the secret itself is never stored); the
-- row binds it to the run, its channel and chat, and the sender who alone
-- may press it. used_by is the run id a press started ('' while unused): a
-- token starts at most one run. No foreign key: like approvals, retention
-- deletes a row with its turn.
ALTER TABLE turns ADD COLUMN sender TEXT NOT NULL DEFAULT '';

CREATE TABLE retry_tokens (
    token_hash TEXT    PRIMARY KEY CHECK (token_hash <> ''),
    run_id     TEXT    NOT NULL CHECK (run_id <> ''),
    channel    TEXT    NOT NULL DEFAULT '',
    chat_ref   TEXT    NOT NULL DEFAULT '',
    sender     TEXT    NOT NULL DEFAULT '',
    created_at INTEGER NOT NULL,
    used_by    TEXT    NOT NULL DEFAULT '',
    used_at    INTEGER
) STRICT;

CREATE INDEX retry_tokens_by_run ON retry_tokens (run_id);
-- Retention finds old rows by creation time.
CREATE INDEX retry_tokens_created ON retry_tokens (created_at);
