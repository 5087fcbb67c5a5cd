package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/turnguard/turnguard/event"
)

// Resume is one attempt of a turn that the start-up recovery (or a
// cluster takeover) dispatched again after the previous attempt was cut
// off (agents.defaults.resume). Each attempt is a turn of its own, with its
// own run id (ResumeRunID), so its history, its journal and its outbox
// rows — keyed by run id and kind — are its own: nothing an earlier
// attempt delivered is delivered again, and an attempt's reply is
// delivered once.
type Resume struct {
	RunID       string // the attempt's run id
	PrevRunID   string // the attempt it replaces: the one cut off
	OriginRunID string // the first attempt's run id
	SessionKey  string
	Attempt     int // 2 for the first resume
	// Step is the step the previous attempt was cut off in (Kind and Name;
	// zero when it was between steps).
	Step event.Step
	// Confirm: the step was a tool call (a possible side effect), so the
	// person is asked before the attempt runs.
	Confirm         bool
	OriginStartedAt time.Time // when the first attempt started
	CreatedAt       time.Time
}

// ResumeRunID is the run id of attempt n (n >= 2) of the turn whose first
// attempt had run id origin. It stays in origin's channel's namespace
// (config.RunIDReserved): it only appends to it.
func ResumeRunID(origin string, attempt int) string {
	return origin + "-attempt-" + strconv.Itoa(attempt)
}

// Resumes keeps the resumed attempts of turns. SQLite and store/postgres
// implement it.
type Resumes interface {
	// QueueResume records r and queues m, its message (m.RunID ==
	// r.RunID), at the head of the queued messages, in one transaction
	// committed durably: after it returns, a restart runs the attempt
	// (Queued) and knows its number (Resume). Both are idempotent by run
	// id: a second call with the same run id changes nothing.
	QueueResume(ctx context.Context, r Resume, m QueuedMessage) error
	// Resume returns the record of the attempt with run id runID, or an
	// error wrapping ErrNotFound when that run is a first attempt.
	Resume(ctx context.Context, runID string) (Resume, error)
	// Resumed reports whether the turn runID was dispatched again (an
	// attempt replaces it): its ending is not final, so its notice offers
	// no Retry.
	Resumed(ctx context.Context, runID string) (bool, error)
}

var _ Resumes = (*SQLite)(nil)

// CheckResume refuses (ErrInvalid) a resume QueueResume must not store
// and returns r with a zero CreatedAt set to now; m is checked as
// AddQueued checks it and must carry r's run id and session.
func CheckResume(r Resume, m QueuedMessage) (Resume, QueuedMessage, error) {
	m, err := CheckQueued(m)
	switch {
	case err != nil:
		return r, m, err
	case r.RunID != m.RunID || r.SessionKey != m.SessionKey:
		return r, m, fmt.Errorf("resume %q: its message is run %q of session %q: %w", r.RunID, m.RunID, m.SessionKey, ErrInvalid)
	case r.OriginRunID == "" || r.PrevRunID == "":
		return r, m, fmt.Errorf("resume %q: no first or previous run id: %w", r.RunID, ErrInvalid)
	case r.Attempt < 2:
		return r, m, fmt.Errorf("resume %q: attempt %d: %w", r.RunID, r.Attempt, ErrInvalid)
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = time.Now()
	}
	return r, m, nil
}

// QueueResume records r and queues m at the head of the queue (see
// Resumes).
func (s *SQLite) QueueResume(ctx context.Context, r Resume, m QueuedMessage) error {
	release, err := s.acquire()
	if err != nil {
		return err
	}
	defer release()
	if r, m, err = CheckResume(r, m); err != nil {
		return err
	}
	err = s.durably(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO resumes (run_id, prev_run_id, origin_run_id, session_key, attempt, step_kind,
				step_name, confirm, origin_started_at, created_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING`,
			r.RunID, r.PrevRunID, r.OriginRunID, r.SessionKey, r.Attempt, r.Step.Kind, r.Step.Name, r.Confirm,
			nanos(r.OriginStartedAt), nanos(r.CreatedAt))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err // recorded (and queued) by an earlier call
		}
		// At the head: the attempt runs before the messages that were
		// queued behind the attempt it replaces.
		_, err = tx.ExecContext(ctx, `INSERT INTO queued (run_id, seq, session_key, channel, chat_ref, owner, text, queued_at, timeout)
			VALUES (?1, (SELECT coalesce(min(seq), 1) - 1 FROM queued), ?2, ?3, ?4, ?5, ?6, ?7, ?8)
			ON CONFLICT (run_id) DO NOTHING`,
			m.RunID, m.SessionKey, m.Channel, m.ChatRef, m.Owner, m.Text, nanos(m.QueuedAt), int64(m.Timeout))
		return err
	})
	if err != nil {
		return fmt.Errorf("queue attempt %d (%q) of run %q: %w", r.Attempt, r.RunID, r.OriginRunID, err)
	}
	return nil
}

// Resume returns the record of the attempt runID (see Resumes).
func (s *SQLite) Resume(ctx context.Context, runID string) (Resume, error) {
	release, err := s.acquire()
	if err != nil {
		return Resume{}, err
	}
	defer release()
	var r Resume
	var origin, created int64
	err = s.r.QueryRowContext(ctx, `SELECT run_id, prev_run_id, origin_run_id, session_key, attempt, step_kind, step_name,
			confirm, origin_started_at, created_at FROM resumes WHERE run_id = ?`, runID).
		Scan(&r.RunID, &r.PrevRunID, &r.OriginRunID, &r.SessionKey, &r.Attempt, &r.Step.Kind, &r.Step.Name, &r.Confirm, &origin, &created)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Resume{}, fmt.Errorf("resume of run %q: %w", runID, ErrNotFound)
	case err != nil:
		return Resume{}, fmt.Errorf("resume of run %q: %w", runID, err)
	}
	r.OriginStartedAt, r.CreatedAt = fromNanos(origin), fromNanos(created)
	return r, nil
}

// Resumed reports whether an attempt replaces the turn runID (see Resumes).
func (s *SQLite) Resumed(ctx context.Context, runID string) (bool, error) {
	release, err := s.acquire()
	if err != nil {
		return false, err
	}
	defer release()
	var yes bool
	if err := s.r.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM resumes WHERE prev_run_id = ?)`, runID).Scan(&yes); err != nil {
		return false, fmt.Errorf("resumed run %q: %w", runID, err)
	}
	return yes, nil
}
