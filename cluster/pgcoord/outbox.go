package pgcoord

import (
	"cmp"
	"context"
	"errors"
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
		FROM (SELECT o.id AS claim_id FROM outbox o
			WHERE delivered_at IS NULL AND failed_at IS NULL AND ($1 = '' OR channel = $1)
				AND (claimed_until IS NULL OR claimed_until <= now() OR claimed_by = $3)
				AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.channel = o.channel
					AND e.chat_ref = o.chat_ref AND e.id < o.id
					AND e.delivered_at IS NULL AND e.failed_at IS NULL
					AND e.claimed_by <> $3 AND e.claimed_until > now())
			ORDER BY o.id LIMIT $2 FOR UPDATE OF o SKIP LOCKED) c
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

// HoldOutbox is called immediately before sending outbox row id, which
// this replica claimed: it returns nil, and extends the row's hold to hold
// from now, only while this replica's lease is live (not fenced, not
// expired in the database) and it still holds the row, undelivered; then
// the row may be sent. Otherwise the row must not be sent: store.ErrNotHeld
// (a survivor took this epoch's claims over and may have sent it already),
// or store.ErrBehind when an earlier row of the same chat is still pending,
// whoever holds it (a chat's rows go out in order: hand this one back).
func (r *Replica) HoldOutbox(ctx context.Context, id int64, hold time.Duration) error {
	if err := r.live(); err != nil {
		return fmt.Errorf("hold outbox row %d: %w: %w", id, store.ErrNotHeld, err)
	}
	if hold <= 0 {
		return fmt.Errorf("hold outbox row %d: hold %s: %w", id, hold, store.ErrInvalid)
	}
	var first bool
	err := r.pool.QueryRow(ctx, `UPDATE outbox o SET claimed_until = now() + $3::bigint * interval '1 microsecond'
		WHERE o.id = $1 AND o.claimed_by = $2 AND o.claimed_until > now()
			AND o.delivered_at IS NULL AND o.failed_at IS NULL
			AND EXISTS (SELECT 1 FROM leases WHERE epoch = $4 AND expires_at > now())
		RETURNING NOT EXISTS (SELECT 1 FROM outbox e WHERE e.channel = o.channel
			AND e.chat_ref = o.chat_ref AND e.id < o.id
			AND e.delivered_at IS NULL AND e.failed_at IS NULL)`,
		id, r.Owner(), hold.Microseconds(), r.epoch).Scan(&first)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("hold outbox row %d: %w", id, store.ErrNotHeld)
	case err != nil:
		return fmt.Errorf("hold outbox row %d: %w", id, err)
	case !first:
		return fmt.Errorf("hold outbox row %d: %w", id, store.ErrBehind)
	}
	return nil
}
