package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// SessionSettings keeps, per session key, the settings its person set and
// that outlive a restart: the busy mode /queue <mode> chose. One record per
// session key; a new conversation (/new) keeps it; retention never deletes
// it. SQLite and the PostgreSQL store (store/postgres) implement it.
type SessionSettings interface {
	// BusyModeOf returns the busy mode recorded for sessionKey, "" when
	// there is none.
	BusyModeOf(ctx context.Context, sessionKey string) (string, error)
	// SetBusyMode records mode for sessionKey, durably, replacing what was
	// recorded; "" forgets it. sessionKey is required (ErrInvalid); the
	// mode is the caller's to check.
	SetBusyMode(ctx context.Context, sessionKey, mode string) error
}

var _ SessionSettings = (*SQLite)(nil)

// maxBusyModeBytes bounds a recorded busy mode (the modes are short words).
const maxBusyModeBytes = 32

// CheckBusyMode refuses (ErrInvalid) a record SetBusyMode must not store:
// no session key, or a mode longer than any busy mode.
func CheckBusyMode(sessionKey, mode string) error {
	switch {
	case sessionKey == "":
		return fmt.Errorf("busy mode: no session key: %w", ErrInvalid)
	case len(mode) > maxBusyModeBytes:
		return fmt.Errorf("busy mode of %q: %d bytes: %w", sessionKey, len(mode), ErrInvalid)
	}
	return nil
}

// BusyModeOf returns the busy mode recorded for sessionKey (see
// SessionSettings).
func (s *SQLite) BusyModeOf(ctx context.Context, sessionKey string) (string, error) {
	release, err := s.acquire()
	if err != nil {
		return "", err
	}
	defer release()
	var mode string
	err = s.r.QueryRowContext(ctx, `SELECT busy_mode FROM session_settings WHERE session_key = ?`, sessionKey).Scan(&mode)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("busy mode of %q: %w", sessionKey, err)
	}
	return mode, nil
}

// SetBusyMode records (or, with "", forgets) the busy mode of sessionKey,
// durably (see SessionSettings).
func (s *SQLite) SetBusyMode(ctx context.Context, sessionKey, mode string) error {
	if err := CheckBusyMode(sessionKey, mode); err != nil {
		return err
	}
	release, err := s.acquire()
	if err != nil {
		return err
	}
	defer release()
	err = s.durably(ctx, func(tx *sql.Tx) error {
		if mode == "" {
			_, err := tx.ExecContext(ctx, `DELETE FROM session_settings WHERE session_key = ?`, sessionKey)
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO session_settings (session_key, busy_mode, updated_at) VALUES (?1, ?2, ?3)
			ON CONFLICT (session_key) DO UPDATE SET busy_mode = excluded.busy_mode, updated_at = excluded.updated_at`,
			sessionKey, mode, nanos(time.Now()))
		return err
	})
	if err != nil {
		return fmt.Errorf("record the busy mode of %q: %w", sessionKey, err)
	}
	return nil
}
