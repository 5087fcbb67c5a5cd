-- Schema version 6: a queued message keeps its per-request wall clock
-- (nanoseconds; 0 = the configured timeout) across a restart.

ALTER TABLE queued ADD COLUMN timeout INTEGER NOT NULL DEFAULT 0 CHECK (timeout >= 0);
