package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// writer is the store's side of its store.EventRecorder: the SQL of each
// event (see store.EventRecorder.Handle for what each records).
type writer struct{ s *Store }

// WriteBatch applies evs in one transaction; a batch with an ending of an
// outbox channel's turn (its terminal messages go into the outbox with it)
// commits with synchronous_commit on.
func (w writer) WriteBatch(ctx context.Context, evs []event.Event) error {
	s := w.s
	err := RetryConflicts(ctx, func() error { return w.writeBatch(ctx, evs) })
	if err == nil && s.afterCommit != nil {
		s.afterCommit()
	}
	return err
}

// writeBatch is one attempt of WriteBatch.
func (w writer) writeBatch(ctx context.Context, evs []event.Event) error {
	s := w.s
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if s.rec.AnyToOutbox(evs) {
			if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
				return err
			}
		}
		for i := range evs {
			if err := s.apply(ctx, tx, &evs[i]); err != nil {
				return err
			}
		}
		if s.beforeCommit != nil {
			s.beforeCommit()
		}
		return nil
	})
}

func (w writer) Classify(err error) store.Failure { return classify(err) }
func (w writer) Probe(ctx context.Context) error  { return w.s.probe(ctx) }
func (w writer) Check() bool                      { return w.s.checkOwner() }

const (
	upsertSession = `INSERT INTO sessions (key, created_at, updated_at) VALUES ($1, $2, $2)
		ON CONFLICT (key) DO UPDATE SET updated_at = greatest(sessions.updated_at, excluded.updated_at)`
	ensureSession = `INSERT INTO sessions (key, created_at, updated_at) VALUES ($1, $2, $2) ON CONFLICT (key) DO NOTHING`
	touchSession  = `UPDATE sessions SET updated_at = greatest(updated_at, $2) WHERE key = $1`
	insertMessage = `INSERT INTO messages (session_key, run_id, role, text, stop_reason, created_at)
		VALUES ($1, $2, $3, $4, $5, $6)`
	insertOutbox = `INSERT INTO outbox (channel, chat_ref, run_id, kind, text, created_at)
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (run_id, kind) DO NOTHING`
	// A repeated request of the same approval keeps the first.
	requestApproval = `INSERT INTO approvals (` + approvalColumns + `)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12, $13, $14, $15, $16)
		ON CONFLICT (id) DO NOTHING`
	// Settles a pending approval (a second resolution changes no row), or
	// records one whose request was never written.
	resolveApproval = `INSERT INTO approvals (` + approvalColumns + `)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12, $13, $14, $15, $16)
		ON CONFLICT (id) DO UPDATE SET status = excluded.status, option_id = excluded.option_id,
			option_kind = excluded.option_kind, answered_by = excluded.answered_by, resolved_at = excluded.resolved_at
		WHERE approvals.status = 'pending'`
	insertJournal = `INSERT INTO journal (run_id, session_key, seq, kind, stop_reason,
			step_kind, step_name, step_seq, last_step, elapsed_ns, message, at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`
	// insertJournal that also cancels the run's ($1) pending approvals at
	// the event's time ($12): a data-modifying WITH runs whether or not
	// it is referenced.
	cancelApprovalsJournal = `WITH cancelled AS (UPDATE approvals SET status = 'cancelled', resolved_at = $12
			WHERE run_id = $1 AND status = 'pending')
		` + insertJournal
)

// apply records one valid event inside tx.
func (s *Store) apply(ctx context.Context, tx pgx.Tx, ev *event.Event) (err error) {
	at := store.EventTime(ev)
	switch ev.Kind {
	case event.SessionReset:
		if _, err := tx.Exec(ctx, upsertSession, ev.SessionKey, at); err != nil {
			return fmt.Errorf("upsert session: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE sessions SET reset_after =
				(SELECT coalesce(max(id), 0) FROM messages WHERE session_key = $1) WHERE key = $1`, ev.SessionKey); err != nil {
			return fmt.Errorf("reset session: %w", err)
		}
		return nil // not a turn event: nothing to journal
	case event.TurnStarted:
		// The session row exists first (no lock on an existing one); it is
		// updated after the turn's row, the order claims, endings and
		// takeovers lock them in (RetryConflicts).
		if _, err := tx.Exec(ctx, ensureSession, ev.SessionKey, at); err != nil {
			return fmt.Errorf("upsert session: %w", err)
		}
		defer func() {
			if err == nil {
				if _, err = tx.Exec(ctx, touchSession, ev.SessionKey, at); err != nil {
					err = fmt.Errorf("update session: %w", err)
				}
			}
		}()
		// A TurnStarted for a run id whose turn has ended starts it afresh
		// (the id was reused); for a running turn it is a duplicate. A
		// claimed turn (cluster/pgcoord: owner_epoch set) is never
		// restarted here: its claim wrote the row and the user's message,
		// and its end (Finish or a takeover) may already be committed.
		tag, err := tx.Exec(ctx, `INSERT INTO turns (run_id, session_key, channel, chat_ref, state, started_at, updated_at,
				deadline_at, ceiling_at, step_timeout_ns, sender)
			VALUES ($1, $2, $3, $4, 'running', $5, $5, $6, $7, $8, $9)
			ON CONFLICT (run_id) DO UPDATE SET session_key = excluded.session_key, channel = excluded.channel,
				chat_ref = excluded.chat_ref, sender = excluded.sender, state = 'running', stop_reason = '', started_at = excluded.started_at,
				deadline_at = excluded.deadline_at, ceiling_at = excluded.ceiling_at, step_timeout_ns = excluded.step_timeout_ns,
				updated_at = excluded.updated_at, ended_at = NULL, step_kind = NULL, step_name = NULL,
				step_seq = NULL, last_step_kind = NULL, last_step_name = NULL, last_step_seq = NULL
			WHERE turns.state <> 'running' AND turns.owner_epoch IS NULL`,
			ev.RunID, ev.SessionKey, ev.Channel, ev.ChatRef, at, nullTime(ev.Deadline), nullTime(ev.Ceiling), nullDuration(ev.StepTimeout), ev.Sender)
		if err != nil {
			return fmt.Errorf("start turn: %w", err)
		}
		if tag.RowsAffected() == 0 {
			// A claimed turn learns its limits and its sender from its TurnStarted.
			if _, err := tx.Exec(ctx, `UPDATE turns SET deadline_at = $2, ceiling_at = $3, step_timeout_ns = $4, sender = $5
				WHERE run_id = $1 AND state = 'running' AND owner_epoch IS NOT NULL`,
				ev.RunID, nullTime(ev.Deadline), nullTime(ev.Ceiling), nullDuration(ev.StepTimeout), ev.Sender); err != nil {
				return fmt.Errorf("start claimed turn: %w", err)
			}
		}
		if tag.RowsAffected() == 1 && ev.Text != "" {
			if _, err := tx.Exec(ctx, insertMessage, ev.SessionKey, ev.RunID, string(store.RoleUser), ev.Text, "", at); err != nil {
				return fmt.Errorf("insert user message: %w", err)
			}
		}
		// The queued messages this turn runs leave the queue in the same
		// transaction: after a crash they are either still queued (the
		// start was not written) or ended as interrupted, never both.
		if _, err := tx.Exec(ctx, `DELETE FROM queued WHERE run_id = ANY($1)`, append([]string{ev.RunID}, ev.Joined...)); err != nil {
			return fmt.Errorf("forget the started turn's queued messages: %w", err)
		}
	case event.StepStarted:
		k, n, q := store.StepColumns(ev.Step)
		if _, err := tx.Exec(ctx, `UPDATE turns SET step_kind = $1, step_name = $2, step_seq = $3, updated_at = $4
			WHERE run_id = $5 AND state = 'running'`, k, n, q, at, ev.RunID); err != nil {
			return fmt.Errorf("step started: %w", err)
		}
	case event.StepCompleted:
		// SET expressions see the row's old values: the current step is
		// cleared only if it is the one that completed.
		k, n, q := store.StepColumns(ev.Step)
		if _, err := tx.Exec(ctx, `UPDATE turns SET last_step_kind = $1, last_step_name = $2, last_step_seq = $3::bigint,
				step_kind = CASE WHEN step_seq IS NOT DISTINCT FROM $3::bigint THEN NULL ELSE step_kind END,
				step_name = CASE WHEN step_seq IS NOT DISTINCT FROM $3::bigint THEN NULL ELSE step_name END,
				step_seq = CASE WHEN step_seq IS NOT DISTINCT FROM $3::bigint THEN NULL ELSE step_seq END,
				updated_at = $4
			WHERE run_id = $5 AND state = 'running'`, k, n, q, at, ev.RunID); err != nil {
			return fmt.Errorf("step completed: %w", err)
		}
	case event.Aborted, event.Finished:
		if err := s.endTurn(ctx, tx, ev, at); err != nil {
			return err
		}
	case event.ApprovalRequested, event.ApprovalResolved:
		a := store.ApprovalOf(ev, at)
		q := requestApproval
		if ev.Kind == event.ApprovalResolved {
			q = resolveApproval
		}
		if _, err := tx.Exec(ctx, q, a.ID, a.RunID, a.SessionKey, a.Channel, a.ChatRef, a.Title, a.Detail, a.Tool,
			a.OptionsJSON(), a.Status, a.OptionID, a.OptionKind, a.AnsweredBy, a.CreatedAt,
			nullTime(a.ExpiresAt), nullTime(a.ResolvedAt)); err != nil {
			return fmt.Errorf("%s %q: %w", ev.Kind, a.ID, err)
		}
	}
	j := store.JournalOf(ev, at)
	q := insertJournal
	if ev.Kind.Terminal() {
		// Whether or not this ending was the turn's first (a claimed
		// turn's is its owner's Finish), no question of an ended turn
		// waits for an answer: its pending approvals are cancelled, in
		// the journal's statement (no round trip of their own).
		q = cancelApprovalsJournal
	}
	if _, err := tx.Exec(ctx, q, j.RunID, j.SessionKey, int64(j.Seq), j.KindName, string(j.StopReason),
		j.Step.Kind, j.Step.Name, int64(j.Step.Seq), j.LastStep, int64(j.Elapsed), j.Message, at); err != nil {
		return fmt.Errorf("journal %s: %w", ev.Kind, err)
	}
	return nil
}

// endTurn records an Aborted or Finished event: the turn's final state and,
// if this is the turn's first ending, the assistant message and (for an
// outbox channel) its terminal messages in the outbox.
func (s *Store) endTurn(ctx context.Context, tx pgx.Tx, ev *event.Event, at time.Time) (err error) {
	end := store.EndingOf(ev, at)
	if _, err := tx.Exec(ctx, ensureSession, ev.SessionKey, at); err != nil {
		return fmt.Errorf("upsert session: %w", err)
	}
	defer func() { // after the turn's row, as TurnStarted does
		if err == nil {
			if _, err = tx.Exec(ctx, touchSession, ev.SessionKey, at); err != nil {
				err = fmt.Errorf("update session: %w", err)
			}
		}
	}()
	ck, cn, cq := store.StepColumns(end.Current)
	lk, ln, lq := store.StepColumns(ev.LastStep)
	// Ends a running turn, or creates the ended turn if its TurnStarted
	// was never recorded. Changes no row if the turn already ended, nor
	// for a claimed turn (cluster/pgcoord: owner_epoch set), whose end
	// only its owner's Finish or a takeover writes, with its history
	// message and outbox rows: the recorder writes no ending twice and
	// none for a stale owner.
	tag, err := tx.Exec(ctx, `INSERT INTO turns (run_id, session_key, channel, chat_ref, state, stop_reason,
			started_at, updated_at, ended_at, step_kind, step_name, step_seq,
			last_step_kind, last_step_name, last_step_seq)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $9, $10, $11, $12, $13, $14)
		ON CONFLICT (run_id) DO UPDATE SET state = excluded.state, stop_reason = excluded.stop_reason,
			updated_at = excluded.updated_at, ended_at = excluded.ended_at,
			step_kind = excluded.step_kind, step_name = excluded.step_name, step_seq = excluded.step_seq,
			last_step_kind = coalesce(excluded.last_step_kind, turns.last_step_kind),
			last_step_name = coalesce(excluded.last_step_name, turns.last_step_name),
			last_step_seq = coalesce(excluded.last_step_seq, turns.last_step_seq)
		WHERE turns.state = 'running' AND turns.owner_epoch IS NULL`,
		ev.RunID, ev.SessionKey, ev.Channel, ev.ChatRef, string(end.State), string(ev.StopReason), end.StartedAt, at,
		ck, cn, cq, lk, ln, lq)
	if err != nil {
		return fmt.Errorf("end turn: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return nil // already ended: its message is in the history (and the outbox)
	}
	if s.rec.ToOutbox(ev) {
		// A run has at most one row of each kind: one already there (the
		// restart's interrupted notice) is kept.
		for _, m := range store.EndingOutbox(ev) {
			if _, err := tx.Exec(ctx, insertOutbox, m.Channel, m.ChatRef, m.RunID, string(m.Kind), m.Text, at); err != nil {
				return fmt.Errorf("outbox %s message: %w", m.Kind, err)
			}
		}
	}
	if end.Text == "" {
		return nil
	}
	if _, err := tx.Exec(ctx, insertMessage, ev.SessionKey, ev.RunID, string(store.RoleAssistant), end.Text,
		string(ev.StopReason), at); err != nil {
		return fmt.Errorf("insert assistant message: %w", err)
	}
	return nil
}

// probe tries a small real write: a journal row inserted and deleted again.
func (s *Store) probe(ctx context.Context) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO journal (run_id, session_key, kind, message, at)
			VALUES ('', '', 'probe', repeat('0', 8192), now()) RETURNING id`).Scan(&id); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM journal WHERE id = $1`, id)
		return err
	})
}

// nullTime is a nullable timestamptz: the zero time is NULL.
func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// nullDuration stores a positive duration in nanoseconds; 0 (disabled) is NULL.
func nullDuration(d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return int64(d)
}

// timeOf reads a nullable timestamptz (UTC; zero for NULL).
func timeOf(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}
