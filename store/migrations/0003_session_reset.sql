-- Schema version 3: a session can be reset (/new). reset_after is the id of
-- the last message before the reset; History returns only later messages.

ALTER TABLE sessions ADD COLUMN reset_after INTEGER NOT NULL DEFAULT 0;
