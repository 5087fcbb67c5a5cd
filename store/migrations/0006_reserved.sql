-- Schema version 6: reserved (no change). Another branch (fx-engine) may
-- add its own 0006 migration; when it does, this file is dropped at merge.
SELECT 1;
