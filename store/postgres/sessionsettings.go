package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/store"
)

var _ store.SessionSettings = (*Store)(nil)

// BusyModeOf returns the busy mode recorded for sessionKey; see
// store.SessionSettings.
func (s *Store) BusyModeOf(ctx context.Context, sessionKey string) (string, error) {
	if err := s.live(); err != nil {
		return "", err
	}
	var mode string
	err := s.pool.QueryRow(ctx, `SELECT busy_mode FROM session_settings WHERE session_key = $1`, sessionKey).Scan(&mode)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("busy mode of %q: %w", sessionKey, err)
	}
	return mode, nil
}

// SetBusyMode records (or, with "", forgets) the busy mode of sessionKey,
// committed with synchronous_commit on; see store.SessionSettings.
func (s *Store) SetBusyMode(ctx context.Context, sessionKey, mode string) error {
	if err := store.CheckBusyMode(sessionKey, mode); err != nil {
		return err
	}
	if err := s.live(); err != nil {
		return err
	}
	err := s.inTx(ctx, true, func(tx pgx.Tx) error {
		if mode == "" {
			_, err := tx.Exec(ctx, `DELETE FROM session_settings WHERE session_key = $1`, sessionKey)
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO session_settings (session_key, busy_mode, updated_at) VALUES ($1, $2, $3)
			ON CONFLICT (session_key) DO UPDATE SET busy_mode = excluded.busy_mode, updated_at = excluded.updated_at`,
			sessionKey, mode, time.Now())
		return err
	})
	if err != nil {
		return fmt.Errorf("record the busy mode of %q: %w", sessionKey, err)
	}
	return nil
}
