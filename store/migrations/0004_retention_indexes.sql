-- Schema version 4: indexes for retention (Prune): messages by creation time, ended turns by end time,
-- and outbox rows by the time they were delivered or given up (NULL while
-- pending, so a pending row never matches a time bound).

CREATE INDEX turns_ended ON turns (ended_at) WHERE state <> 'running';
CREATE INDEX outbox_done ON outbox (coalesce(delivered_at, failed_at));

-- Messages by creation time: Prune finds old history through it instead of
-- scanning the table inside its write transaction.
CREATE INDEX messages_created ON messages (created_at);
