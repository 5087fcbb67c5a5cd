package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/store"
)

var _ store.RetryTokens = (*Store)(nil)

const retryTokenColumns = `run_id, channel, chat_ref, sender, created_at, used_by, used_at`

func scanRetryToken(row pgx.Row) (store.RetryToken, error) {
	var t store.RetryToken
	var used *time.Time
	if err := row.Scan(&t.RunID, &t.Channel, &t.ChatRef, &t.Sender, &t.CreatedAt, &t.UsedBy, &used); err != nil {
		return store.RetryToken{}, err
	}
	t.CreatedAt, t.UsedAt = t.CreatedAt.UTC(), timeOf(used)
	return t, nil
}

// SaveRetryToken records secret as t's token (see store.RetryTokens).
func (s *Store) SaveRetryToken(ctx context.Context, secret string, t store.RetryToken) error {
	if err := s.live(); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO retry_tokens (token_hash, run_id, channel, chat_ref, sender, created_at)
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (token_hash) DO NOTHING`,
		store.RetryTokenHash(secret), t.RunID, t.Channel, t.ChatRef, t.Sender, t.CreatedAt)
	if err != nil {
		return fmt.Errorf("save retry token of run %q: %w", t.RunID, err)
	}
	return nil
}

// RetryToken returns secret's token (see store.RetryTokens).
func (s *Store) RetryToken(ctx context.Context, secret string) (store.RetryToken, error) {
	if err := s.live(); err != nil {
		return store.RetryToken{}, err
	}
	t, err := scanRetryToken(s.pool.QueryRow(ctx, `SELECT `+retryTokenColumns+` FROM retry_tokens WHERE token_hash = $1`,
		store.RetryTokenHash(secret)))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return store.RetryToken{}, fmt.Errorf("retry token: %w", store.ErrNotFound)
	case err != nil:
		return store.RetryToken{}, fmt.Errorf("retry token: %w", err)
	}
	return t, nil
}

// UseRetryToken marks secret's unused token as used by run usedBy (see
// store.RetryTokens): the row is locked, so of two replicas pressing at
// once one gets it.
func (s *Store) UseRetryToken(ctx context.Context, secret, usedBy string, at time.Time) (store.RetryToken, error) {
	if err := s.live(); err != nil {
		return store.RetryToken{}, err
	}
	hash := store.RetryTokenHash(secret)
	var t store.RetryToken
	var refused error // not a failed write: the transaction commits having changed nothing
	err := RetryConflicts(ctx, func() error {
		return s.inTx(ctx, false, func(tx pgx.Tx) error {
			var err error
			refused = nil
			t, err = scanRetryToken(tx.QueryRow(ctx, `SELECT `+retryTokenColumns+` FROM retry_tokens WHERE token_hash = $1 FOR UPDATE`, hash))
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				refused = store.ErrNotFound
				return nil
			case err != nil:
				return err
			case t.UsedBy != "":
				refused = store.ErrTokenUsed
				return nil
			}
			_, err = tx.Exec(ctx, `UPDATE retry_tokens SET used_by = $2, used_at = $3 WHERE token_hash = $1`, hash, usedBy, at)
			return err
		})
	})
	switch {
	case err != nil:
		return store.RetryToken{}, fmt.Errorf("use retry token: %w", err)
	case errors.Is(refused, store.ErrTokenUsed):
		return t, fmt.Errorf("use retry token of run %q: %w", t.RunID, refused)
	case refused != nil:
		return store.RetryToken{}, fmt.Errorf("use retry token: %w", refused)
	}
	return t, nil
}

// ReleaseRetryToken makes secret's token unused again if run usedBy holds
// it (see store.RetryTokens).
func (s *Store) ReleaseRetryToken(ctx context.Context, secret, usedBy string) error {
	if err := s.live(); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, `UPDATE retry_tokens SET used_by = '', used_at = NULL WHERE token_hash = $1 AND used_by = $2`,
		store.RetryTokenHash(secret), usedBy); err != nil {
		return fmt.Errorf("release retry token: %w", err)
	}
	return nil
}
