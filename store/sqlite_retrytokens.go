package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

var _ RetryTokens = (*SQLite)(nil)

const retryTokenColumns = `run_id, channel, chat_ref, sender, created_at, used_by, used_at`

func scanRetryToken(sc scanner) (RetryToken, error) {
	var t RetryToken
	var created int64
	var used sql.NullInt64
	if err := sc.Scan(&t.RunID, &t.Channel, &t.ChatRef, &t.Sender, &created, &t.UsedBy, &used); err != nil {
		return RetryToken{}, err
	}
	t.CreatedAt, t.UsedAt = fromNanos(created), fromNullNanos(used)
	return t, nil
}

// SaveRetryToken records secret as t's token (see RetryTokens).
func (s *SQLite) SaveRetryToken(ctx context.Context, secret string, t RetryToken) error {
	release, err := s.acquire()
	if err != nil {
		return err
	}
	defer release()
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO retry_tokens (token_hash, run_id, channel, chat_ref, sender, created_at)
			VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (token_hash) DO NOTHING`,
			RetryTokenHash(secret), t.RunID, t.Channel, t.ChatRef, t.Sender, nanos(t.CreatedAt))
		return err
	})
	if err != nil {
		return fmt.Errorf("save retry token of run %q: %w", t.RunID, err)
	}
	return nil
}

// RetryToken returns secret's token (see RetryTokens).
func (s *SQLite) RetryToken(ctx context.Context, secret string) (RetryToken, error) {
	release, err := s.acquire()
	if err != nil {
		return RetryToken{}, err
	}
	defer release()
	t, err := scanRetryToken(s.r.QueryRowContext(ctx, `SELECT `+retryTokenColumns+` FROM retry_tokens WHERE token_hash = ?`,
		RetryTokenHash(secret)))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return RetryToken{}, fmt.Errorf("retry token: %w", ErrNotFound)
	case err != nil:
		return RetryToken{}, fmt.Errorf("retry token: %w", err)
	}
	return t, nil
}

// UseRetryToken marks secret's unused token as used by run usedBy (see
// RetryTokens). The write transaction makes it atomic.
func (s *SQLite) UseRetryToken(ctx context.Context, secret, usedBy string, at time.Time) (RetryToken, error) {
	release, err := s.acquire()
	if err != nil {
		return RetryToken{}, err
	}
	defer release()
	hash := RetryTokenHash(secret)
	var t RetryToken
	var refused error // not a failed write: the transaction commits having changed nothing
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		t, err = scanRetryToken(tx.QueryRowContext(ctx, `SELECT `+retryTokenColumns+` FROM retry_tokens WHERE token_hash = ?`, hash))
		switch {
		case errors.Is(err, sql.ErrNoRows):
			refused = ErrNotFound
			return nil
		case err != nil:
			return err
		case t.UsedBy != "":
			refused = ErrTokenUsed
			return nil
		}
		_, err = tx.ExecContext(ctx, `UPDATE retry_tokens SET used_by = ?, used_at = ? WHERE token_hash = ? AND used_by = ''`,
			usedBy, nanos(at), hash)
		return err
	})
	switch {
	case err != nil:
		return RetryToken{}, fmt.Errorf("use retry token: %w", err)
	case errors.Is(refused, ErrTokenUsed):
		return t, fmt.Errorf("use retry token of run %q: %w", t.RunID, refused)
	case refused != nil:
		return RetryToken{}, fmt.Errorf("use retry token: %w", refused)
	}
	return t, nil
}

// ReleaseRetryToken makes secret's token unused again if run usedBy holds
// it (see RetryTokens).
func (s *SQLite) ReleaseRetryToken(ctx context.Context, secret, usedBy string) error {
	release, err := s.acquire()
	if err != nil {
		return err
	}
	defer release()
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE retry_tokens SET used_by = '', used_at = NULL WHERE token_hash = ? AND used_by = ?`,
			RetryTokenHash(secret), usedBy)
		return err
	})
	if err != nil {
		return fmt.Errorf("release retry token: %w", err)
	}
	return nil
}
