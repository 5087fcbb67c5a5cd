-- Schema version 2: the cluster's coordination (cluster/pgcoord). The
-- one-process gateway (Options.Shared false) never writes these columns or
-- rows, and nothing here constrains the rows it writes.

-- One row per live replica epoch: a replica joining gets a new epoch (a
-- restarted replica with the same id is a new owner) and keeps its row
-- alive by renewing expires_at, always as the database's now() plus the
-- lease. A survivor that finds a row expired takes its turns over and
-- deletes it in one transaction.
CREATE TABLE leases (
    epoch      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    replica_id text        NOT NULL CHECK (replica_id <> ''),
    joined_at  timestamptz NOT NULL,
    renewed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE INDEX leases_expiry ON leases (expires_at);
CREATE INDEX leases_by_replica ON leases (replica_id);

-- A claimed turn (pgcoord.Claim) names its owner: the replica and the epoch
-- of its lease. NULL for the one-process gateway's turns.
ALTER TABLE turns ADD COLUMN owner_replica text, ADD COLUMN owner_epoch bigint;

-- At most one claimed running turn per session, cluster-wide: a second
-- claim anywhere conflicts here and is answered busy with the holder's run
-- id. Only claimed rows are constrained, so the event recorder's rows
-- (owner NULL) can never violate it.
CREATE UNIQUE INDEX turns_claimed_session ON turns (session_key)
    WHERE state = 'running' AND owner_epoch IS NOT NULL;

-- A takeover ends exactly the dead epoch's running turns: no sweep.
CREATE INDEX turns_by_owner ON turns (owner_replica, owner_epoch)
    WHERE state = 'running' AND owner_epoch IS NOT NULL;

-- An outbox row a replica is delivering (pgcoord.ClaimOutbox) is held by it
-- until claimed_until (the database's clock); an expired hold (its claimer
-- died) can be claimed again.
ALTER TABLE outbox ADD COLUMN claimed_by text, ADD COLUMN claimed_until timestamptz;
