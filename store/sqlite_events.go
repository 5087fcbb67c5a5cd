package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/turnguard/turnguard/event"
)

// sqliteWriter is the SQLite store's side of its EventRecorder.
type sqliteWriter struct{ s *SQLite }

func (w sqliteWriter) WriteBatch(ctx context.Context, evs []event.Event) error {
	return w.s.writeBatch(ctx, evs)
}
func (w sqliteWriter) Classify(err error) Failure      { return w.s.classify(err) }
func (w sqliteWriter) Probe(ctx context.Context) error { return w.s.probe(ctx) }
func (w sqliteWriter) Check() bool                     { return w.s.checkFile() }

// writeBatch applies evs in one write transaction. When evs end a turn of
// an outbox channel (its terminal message goes into the outbox with it),
// the commit is durable (synchronous=FULL, like Enqueue): the message
// survives a power loss, not only a crash of the process.
func (s *SQLite) writeBatch(ctx context.Context, evs []event.Event) error {
	body := func(tx *sql.Tx) error {
		for i := range evs {
			if err := s.apply(ctx, tx, &evs[i]); err != nil {
				return err
			}
		}
		if s.beforeCommit != nil {
			s.beforeCommit()
		}
		return nil
	}
	var err error
	if s.rec.AnyToOutbox(evs) {
		err = s.durably(ctx, body)
	} else {
		err = s.inTx(ctx, body)
	}
	if err == nil && s.afterCommit != nil {
		s.afterCommit()
	}
	return err
}

// apply records one valid event inside tx.
func (s *SQLite) apply(ctx context.Context, tx *sql.Tx, ev *event.Event) error {
	at := EventTime(ev)
	now := nanos(at)
	st := &s.st
	stmt := func(p *sql.Stmt) *sql.Stmt { return tx.StmtContext(ctx, p) }

	switch ev.Kind {
	case event.SessionReset:
		if _, err := stmt(st.upsertSession).ExecContext(ctx, ev.SessionKey, now); err != nil {
			return fmt.Errorf("upsert session: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE sessions SET reset_after =
				(SELECT coalesce(max(id), 0) FROM messages WHERE session_key = ?1) WHERE key = ?1`, ev.SessionKey); err != nil {
			return fmt.Errorf("reset session: %w", err)
		}
		return nil // not a turn event: nothing to journal
	case event.TurnStarted:
		if _, err := stmt(st.upsertSession).ExecContext(ctx, ev.SessionKey, now); err != nil {
			return fmt.Errorf("upsert session: %w", err)
		}
		res, err := stmt(st.startTurn).ExecContext(ctx, ev.RunID, ev.SessionKey, ev.Channel, ev.ChatRef, now,
			nullNanos(ev.Deadline), nullNanos(ev.Ceiling), nullDuration(ev.StepTimeout), ev.Sender)
		if err != nil {
			return fmt.Errorf("start turn: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 1 && ev.Text != "" {
			if _, err := stmt(st.insertMessage).ExecContext(ctx, ev.SessionKey, ev.RunID, RoleUser, ev.Text, "", now); err != nil {
				return fmt.Errorf("insert user message: %w", err)
			}
		}
		// The queued messages this turn runs leave the queue in the same
		// transaction: after a crash they are either still queued (the
		// start was not written) or ended as interrupted, never both.
		if err := forgetQueued(ctx, tx, append([]string{ev.RunID}, ev.Joined...)); err != nil {
			return fmt.Errorf("forget the started turn's queued messages: %w", err)
		}
	case event.StepStarted:
		k, n, q := StepColumns(ev.Step)
		if _, err := stmt(st.stepStarted).ExecContext(ctx, k, n, q, now, ev.RunID); err != nil {
			return fmt.Errorf("step started: %w", err)
		}
	case event.StepCompleted:
		k, n, q := StepColumns(ev.Step)
		if _, err := stmt(st.stepCompleted).ExecContext(ctx, k, n, q, now, ev.RunID); err != nil {
			return fmt.Errorf("step completed: %w", err)
		}
	case event.Aborted, event.Finished:
		if err := s.endTurn(ctx, tx, ev, at); err != nil {
			return err
		}
		// Whether or not this ending was the turn's first: no question of
		// an ended turn waits for an answer.
		if _, err := stmt(st.cancelApprovals).ExecContext(ctx, ev.RunID, now); err != nil {
			return fmt.Errorf("cancel pending approvals: %w", err)
		}
	case event.ApprovalRequested, event.ApprovalResolved:
		a := ApprovalOf(ev, at)
		p := st.requestApproval
		if ev.Kind == event.ApprovalResolved {
			p = st.resolveApproval
		}
		if _, err := stmt(p).ExecContext(ctx, a.ID, a.RunID, a.SessionKey, a.Channel, a.ChatRef, a.Title, a.Detail,
			a.Tool, a.OptionsJSON(), a.Status, a.OptionID, a.OptionKind, a.AnsweredBy, nanos(a.CreatedAt),
			nullNanos(a.ExpiresAt), nullNanos(a.ResolvedAt)); err != nil {
			return fmt.Errorf("%s %q: %w", ev.Kind, a.ID, err)
		}
	}

	j := journalRow(ev, at)
	if _, err := stmt(st.insertJournal).ExecContext(ctx, j...); err != nil {
		return fmt.Errorf("journal %s: %w", ev.Kind, err)
	}
	return nil
}

// endTurn records an Aborted or Finished event: the turn's final state and,
// if this is the turn's first ending, the assistant message.
func (s *SQLite) endTurn(ctx context.Context, tx *sql.Tx, ev *event.Event, at time.Time) error {
	st := &s.st
	now := nanos(at)
	end := EndingOf(ev, at)
	if _, err := tx.StmtContext(ctx, st.upsertSession).ExecContext(ctx, ev.SessionKey, now); err != nil {
		return fmt.Errorf("upsert session: %w", err)
	}
	ck, cn, cq := StepColumns(end.Current)
	lk, ln, lq := StepColumns(ev.LastStep)
	res, err := tx.StmtContext(ctx, st.endTurn).ExecContext(ctx,
		ev.RunID, ev.SessionKey, ev.Channel, ev.ChatRef, end.State, string(ev.StopReason), nanos(end.StartedAt), now,
		ck, cn, cq, lk, ln, lq)
	if err != nil {
		return fmt.Errorf("end turn: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return nil // already ended: its message is in the history (and the outbox)
	}
	if s.rec.ToOutbox(ev) {
		if err := s.outboxEnding(ctx, tx, ev, now); err != nil {
			return err
		}
	}
	if end.Text == "" {
		return nil
	}
	if _, err := tx.StmtContext(ctx, st.insertMessage).ExecContext(ctx,
		ev.SessionKey, ev.RunID, RoleAssistant, end.Text, string(ev.StopReason), now); err != nil {
		return fmt.Errorf("insert assistant message: %w", err)
	}
	return nil
}

// outboxEnding puts the terminal messages of the turn ev ends into the
// outbox (EndingOutbox), inside the transaction that records the end. A
// run has at most one row of each kind (UNIQUE (run_id, kind)): one already
// there (the restart's interrupted notice, an earlier ending of a reused
// run id) is kept.
func (s *SQLite) outboxEnding(ctx context.Context, tx *sql.Tx, ev *event.Event, now int64) error {
	for _, m := range EndingOutbox(ev) {
		if _, err := tx.StmtContext(ctx, s.st.insertOutbox).ExecContext(ctx,
			m.Channel, m.ChatRef, m.RunID, string(m.Kind), m.Text, now); err != nil {
			return fmt.Errorf("outbox %s message: %w", m.Kind, err)
		}
	}
	return nil
}

// journalRow is the insertJournal arguments for ev (see JournalOf).
func journalRow(ev *event.Event, at time.Time) []any {
	j := JournalOf(ev, at)
	return []any{
		j.RunID, j.SessionKey, int64(j.Seq), j.KindName, string(j.StopReason),
		j.Step.Kind, j.Step.Name, int64(j.Step.Seq), j.LastStep, int64(j.Elapsed), j.Message, nanos(at),
	}
}

// stmts are the writer's prepared statements, prepared once on the write
// connection and bound to each batch's transaction.
type stmts struct {
	upsertSession, startTurn, insertMessage, stepStarted, stepCompleted, endTurn, insertJournal, insertOutbox *sql.Stmt
	requestApproval, resolveApproval, cancelApprovals                                                         *sql.Stmt
}

func (st *stmts) prepare(ctx context.Context, db *sql.DB) error {
	for _, p := range []struct {
		dst **sql.Stmt
		sql string
	}{
		{&st.upsertSession, `INSERT INTO sessions (key, created_at, updated_at) VALUES (?1, ?2, ?2)
			ON CONFLICT (key) DO UPDATE SET updated_at = max(updated_at, excluded.updated_at)`},
		// A TurnStarted for a run id whose turn has ended starts it afresh
		// (the id was reused); for a running turn it is a duplicate.
		{&st.startTurn, `INSERT INTO turns (run_id, session_key, channel, chat_ref, state, started_at, updated_at,
				deadline_at, ceiling_at, step_timeout_ns, sender)
			VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?5, ?6, ?7, ?8, ?9)
			ON CONFLICT (run_id) DO UPDATE SET session_key = excluded.session_key, channel = excluded.channel,
				chat_ref = excluded.chat_ref, sender = excluded.sender, state = 'running', stop_reason = '', started_at = excluded.started_at,
				deadline_at = excluded.deadline_at, ceiling_at = excluded.ceiling_at, step_timeout_ns = excluded.step_timeout_ns,
				updated_at = excluded.updated_at, ended_at = NULL, step_kind = NULL, step_name = NULL,
				step_seq = NULL, last_step_kind = NULL, last_step_name = NULL, last_step_seq = NULL
			WHERE turns.state <> 'running'`},
		{&st.insertMessage, `INSERT INTO messages (session_key, run_id, role, text, stop_reason, created_at)
			VALUES (?, ?, ?, ?, ?, ?)`},
		{&st.stepStarted, `UPDATE turns SET step_kind = ?1, step_name = ?2, step_seq = ?3, updated_at = ?4
			WHERE run_id = ?5 AND state = 'running'`},
		// SET expressions see the row's old values: the current step is
		// cleared only if it is the one that completed.
		{&st.stepCompleted, `UPDATE turns SET last_step_kind = ?1, last_step_name = ?2, last_step_seq = ?3,
				step_kind = CASE WHEN step_seq IS ?3 THEN NULL ELSE step_kind END,
				step_name = CASE WHEN step_seq IS ?3 THEN NULL ELSE step_name END,
				step_seq = CASE WHEN step_seq IS ?3 THEN NULL ELSE step_seq END,
				updated_at = ?4
			WHERE run_id = ?5 AND state = 'running'`},
		// Ends a running turn, or creates the ended turn if its TurnStarted
		// was never recorded. Changes no row if the turn already ended.
		{&st.endTurn, `INSERT INTO turns (run_id, session_key, channel, chat_ref, state, stop_reason,
				started_at, updated_at, ended_at, step_kind, step_name, step_seq,
				last_step_kind, last_step_name, last_step_seq)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
			ON CONFLICT (run_id) DO UPDATE SET state = excluded.state, stop_reason = excluded.stop_reason,
				updated_at = excluded.updated_at, ended_at = excluded.ended_at,
				step_kind = excluded.step_kind, step_name = excluded.step_name, step_seq = excluded.step_seq,
				last_step_kind = coalesce(excluded.last_step_kind, last_step_kind),
				last_step_name = coalesce(excluded.last_step_name, last_step_name),
				last_step_seq = coalesce(excluded.last_step_seq, last_step_seq)
			WHERE turns.state = 'running'`},
		{&st.insertJournal, `INSERT INTO journal (run_id, session_key, seq, kind, stop_reason,
				step_kind, step_name, step_seq, last_step, elapsed_ns, message, at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`},
		{&st.insertOutbox, `INSERT INTO outbox (channel, chat_ref, run_id, kind, text, created_at)
			VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, kind) DO NOTHING`},
		// A repeated request of the same approval keeps the first.
		{&st.requestApproval, `INSERT INTO approvals (` + approvalColumns + `)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
			ON CONFLICT (id) DO NOTHING`},
		// Settles a pending approval (a second resolution changes no row),
		// or records one whose request was never written.
		{&st.resolveApproval, `INSERT INTO approvals (` + approvalColumns + `)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
			ON CONFLICT (id) DO UPDATE SET status = excluded.status, option_id = excluded.option_id,
				option_kind = excluded.option_kind, answered_by = excluded.answered_by, resolved_at = excluded.resolved_at
			WHERE approvals.status = 'pending'`},
		{&st.cancelApprovals, `UPDATE approvals SET status = 'cancelled', resolved_at = ?2
			WHERE run_id = ?1 AND status = 'pending'`},
	} {
		stmt, err := db.PrepareContext(ctx, p.sql)
		if err != nil {
			return fmt.Errorf("prepare: %w", err)
		}
		*p.dst = stmt
	}
	return nil
}

func (st *stmts) close() error {
	var errs []error
	for _, p := range []*sql.Stmt{st.upsertSession, st.startTurn, st.insertMessage, st.stepStarted,
		st.stepCompleted, st.endTurn, st.insertJournal, st.insertOutbox,
		st.requestApproval, st.resolveApproval, st.cancelApprovals} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	return errors.Join(errs...)
}
