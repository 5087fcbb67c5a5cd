-- Schema version 7: how many parts of a split outbox message reached the
-- chat, so that a resend goes on from the first unsent part instead of
-- repeating what the person already read.

ALTER TABLE outbox ADD COLUMN parts_sent INTEGER NOT NULL DEFAULT 0;
