package pgcoord

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"
)

// ClaimOutbox claims up to limit outbox rows of channel ("" for every
// channel) that are neither delivered nor failed and that no live claim
// holds, oldest first, for this replica until hold from now on the
// database's clock; rows this replica already holds are claimed again (the
// hold extended). Concurrent callers on any replicas get disjoint rows
// (FOR UPDATE SKIP LOCKED), so two replicas never send one row at once; a
// claim whose replica died expires with its hold and the row is claimed
// again (delivery is at least once, as after a restart). Deliver the rows,
// then record the outcome with the store's MarkDelivered, MarkAttempt or
// MarkFailed (which do not look at claims), or hand them back with
// ReleaseOutbox. A fenced replica claims nothing (ErrFenced).
func (r *Replica) ClaimOutbox(ctx context.Context, channel string, limit int, hold time.Duration) ([]store.OutboxMessage, error) {
	if err := r.live(); err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	if hold <= 0 {
		return nil, fmt.Errorf("claim outbox rows: hold %s: %w", hold, store.ErrInvalid)
	}
	rows, err := r.pool.Query(ctx, `UPDATE outbox SET claimed_by = $3,
			claimed_until = now() + $4::bigint * interval '1 microsecond'
		FROM (SELECT id AS claim_id FROM outbox
			WHERE delivered_at IS NULL AND failed_at IS NULL AND ($1 = '' OR channel = $1)
				AND (claimed_until IS NULL OR claimed_until <= now() OR claimed_by = $3)
			ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) c
		WHERE id = c.claim_id
		RETURNING `+postgres.OutboxColumns,
		channel, store.ClampLimit(limit), r.Owner(), hold.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows of %q: %w", channel, err)
	}
	out, err := pgx.CollectRows(rows, postgres.ScanOutbox)
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows of %q: %w", channel, err)
	}
	slices.SortFunc(out, func(a, b store.OutboxMessage) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// ReleaseOutbox hands back rows this replica claimed and will not send now:
// any replica may claim them at once. Rows it does not hold are left alone.
func (r *Replica) ReleaseOutbox(ctx context.Context, ids ...int64) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := r.pool.Exec(ctx, `UPDATE outbox SET claimed_by = NULL, claimed_until = NULL
		WHERE id = ANY($1) AND claimed_by = $2`, ids, r.Owner()); err != nil {
		return fmt.Errorf("release outbox rows: %w", err)
	}
	return nil
}
