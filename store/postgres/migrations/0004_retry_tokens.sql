-- Schema version 4: Retry is a capability (issue 19), as the SQLite
-- store's migration 9 keeps it. turns.sender is who sent the turn's
-- message, as its channel names them ('' when unknown). A retry_tokens row
-- is one Retry button offered under the notice of a turn that ended in a
-- retryable way: token_hash is the SHA-256 (hex) of the secret the button
-- carries (the secret is never stored), bound to the run, its channel and
-- chat, and the sender who alone may press it; used_by is the run id a
-- press started ('' while unused): a token starts at most one run.
-- Retention deletes a row with its turn.
ALTER TABLE turns ADD COLUMN sender text NOT NULL DEFAULT '';

CREATE TABLE retry_tokens (
    token_hash text        PRIMARY KEY CHECK (token_hash <> ''),
    run_id     text        NOT NULL CHECK (run_id <> ''),
    channel    text        NOT NULL DEFAULT '',
    chat_ref   text        NOT NULL DEFAULT '',
    sender     text        NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    used_by    text        NOT NULL DEFAULT '',
    used_at    timestamptz
);

CREATE INDEX retry_tokens_by_run ON retry_tokens (run_id);
CREATE INDEX retry_tokens_created ON retry_tokens (created_at);
