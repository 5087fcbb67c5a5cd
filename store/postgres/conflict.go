package postgres

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// conflictAttempts bounds how often RetryConflicts runs a transaction.
const conflictAttempts = 5

// IsConflict reports whether err is the server aborting a transaction for a
// deadlock (40P01) or a serialization failure (40001): nothing was written,
// and the same transaction run again may well succeed.
func IsConflict(err error) bool {
	pe, ok := errors.AsType[*pgconn.PgError](err)
	return ok && (pe.Code == "40P01" || pe.Code == "40001")
}

// RetryConflicts runs fn, a whole transaction, again when the server
// aborted it as a conflict (IsConflict), up to five times in all, after a
// short random pause (a few milliseconds, growing) so the two sides of a
// deadlock do not meet again at once. Any other error, or ctx ending, is
// returned at once. Replicas sharing one database (cluster mode) write the
// same sessions' rows from the event recorder, claims, endings and
// takeovers; each locks a turn before its session, but a recorder batch
// spans several turns, so a deadlock stays possible and is a retry, not a
// failure of the store.
func RetryConflicts(ctx context.Context, fn func() error) error {
	var err error
	pause := 2 * time.Millisecond
	for attempt := 1; ; attempt++ {
		if err = fn(); err == nil || !IsConflict(err) || attempt == conflictAttempts || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(pause/2 + rand.N(pause))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		pause *= 2
	}
}
