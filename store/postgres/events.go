package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// writer is the store's side of its store.EventRecorder: the SQL of each
// event (see store.EventRecorder.Handle for what each records).
type writer struct{ s *Store }

// WriteBatch applies evs in one transaction; a batch that wrote outbox rows
// (an ending of an outbox channel's turn: its terminal messages go into
// the outbox with it) commits with synchronous_commit on, and in shared
// mode one that wrote only claimed turns' shadows with it off (commitMode).
func (w writer) WriteBatch(ctx context.Context, evs []event.Event) error {
	s := w.s
	var skipped []stepRun
	err := RetryConflicts(ctx, func() (err error) {
		skipped, err = w.writeBatch(ctx, evs)
		return err
	})
	if err == nil {
		s.carried = skipped
	}
	if err == nil && s.afterCommit != nil {
		s.afterCommit()
	}
	return err
}

// writeBatch is one attempt of WriteBatch; it returns the step changes it
// skipped (stepRows.skipped), which the next batch carries.
func (w writer) writeBatch(ctx context.Context, evs []event.Event) ([]stepRun, error) {
	s := w.s
	b := batch{}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		// The sessions of the batch's turn starts and endings: their rows
		// exist before the turns' (one statement, only when a turn of the
		// batch was not claimed: a claim makes its session's row), and are
		// touched after them, without waiting for any lock
		// (touchSessions), in the journal's statement at the batch's end.
		// The last committed batch's skipped step changes go first.
		b = batch{}
		b.steps.carry(s.carried)
		for i := range evs {
			if k := evs[i].Kind; k == event.TurnStarted || k.Terminal() {
				b.keys, b.ats = append(b.keys, evs[i].SessionKey), append(b.ats, store.EventTime(&evs[i]))
			}
		}
		for i := range evs {
			if err := s.apply(ctx, tx, &evs[i], &b); err != nil {
				return err
			}
		}
		// The turns' rows last: the batch holds their locks from there to
		// its commit only (a claimed turn's Finish waits for them).
		if err := b.journal.flush(ctx, tx, b.keys, b.ats, touchBound(s.shared), s.commitMode(&b)); err != nil {
			return err
		}
		if err := b.steps.flush(ctx, tx); err != nil {
			return err
		}
		if s.commitCheck != nil {
			var mode string
			if err := tx.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&mode); err != nil {
				return err
			}
			s.commitCheck(mode)
		}
		if s.beforeCommit != nil {
			s.beforeCommit()
		}
		return nil
	})
	return b.steps.skipped, err
}

// batch is what one attempt of writeBatch has pending: the folded step
// changes, the journal rows and endings' approval cancellations, the
// sessions to touch, and whether the sessions' rows are ensured and an
// outbox row was written.
type batch struct {
	steps   stepRows
	journal journalRows
	keys    []string
	ats     []time.Time
	ensured bool // ensureSessions ran
	outbox  bool // an outbox row was written: the commit is durable
	primary bool // a record only the recorder writes: a turn's row, its history, an approval, a reset
}

// commitMode is the batch's synchronous_commit: on when it wrote outbox
// rows (a crash must not lose a message the outbox owes); off in shared
// mode when it wrote only what shadows claimed turns — their limits, steps,
// journal, the approvals' cancellations and sessions' times, whose claims
// and endings (cluster/pgcoord) commit durably themselves, so a database
// crash loses at most the last moments of them and no promise (issue 21:
// a flush of the write-ahead log per batch); otherwise nil, the
// database's setting.
func (s *Store) commitMode(b *batch) any {
	switch {
	case b.outbox:
		return "on"
	case s.shared && !b.primary:
		return "off"
	}
	return nil
}

// ensureSessions makes the rows of the batch's sessions that are new,
// once per batch, before the first turn row the recorder itself inserts.
func (b *batch) ensureSessions(ctx context.Context, tx pgx.Tx) error {
	if b.ensured || len(b.keys) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, ensureSessions, b.keys, b.ats); err != nil {
		return fmt.Errorf("upsert sessions: %w", err)
	}
	b.ensured = true
	return nil
}

func (w writer) Classify(err error) store.Failure { return classify(err) }
func (w writer) Probe(ctx context.Context) error  { return w.s.probe(ctx) }
func (w writer) Check() bool                      { return w.s.checkOwner() }

const (
	upsertSession = `INSERT INTO sessions (key, created_at, updated_at) VALUES ($1, $2, $2)
		ON CONFLICT (key) DO UPDATE SET updated_at = greatest(sessions.updated_at, excluded.updated_at)`
	// ensureSessions makes the rows of sessions $1 that are new, created
	// at the first of their times $2 (no lock on an existing one).
	ensureSessions = `INSERT INTO sessions (key, created_at, updated_at)
		SELECT k, min(a), min(a) FROM unnest($1::text[], $2::timestamptz[]) AS u (k, a) GROUP BY k ORDER BY k
		ON CONFLICT (key) DO NOTHING`
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
	// startClaimed gives a claimed running turn ($1) its limits and sender.
	startClaimed = `UPDATE turns SET deadline_at = $2, ceiling_at = $3, step_timeout_ns = $4, sender = $5
		WHERE run_id = $1 AND state = 'running' AND owner_epoch IS NOT NULL`
	// isClaimed says whether the turn $1 is a claimed one, running or
	// ended (its owner's Finish may come before the recorder writes its
	// start), and locks nothing.
	isClaimed = `SELECT coalesce((SELECT owner_epoch IS NOT NULL FROM turns WHERE run_id = $1), false)`
	// insertJournalRow inserts one journal row.
	insertJournalRow = `INSERT INTO journal (run_id, session_key, seq, kind, stop_reason,
			step_kind, step_name, step_seq, last_step, elapsed_ns, message, at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`
	// insertJournal inserts the journal rows of a batch's events, one
	// array per column, in the arrays' order (the ids follow it).
	insertJournal = `INSERT INTO journal (run_id, session_key, seq, kind, stop_reason,
			step_kind, step_name, step_seq, last_step, elapsed_ns, message, at)
		SELECT r, s, q, k, sr, sk, sn, sq, ls, e, m, a
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[],
			$9::text[], $10::bigint[], $11::text[], $12::timestamptz[]) WITH ORDINALITY AS j (r, s, q, k, sr, sk, sn, sq, ls, e, m, a, ord)
		ORDER BY ord`
	// flushJournal is a batch's last statement but its steps' (or one
	// before an approval event, without sessions): it cancels the pending approvals
	// of the ended runs $13 at their ending's time $14, touches sessions
	// $15 at their times $16 (touchSessions, $18 its bound in seconds),
	// and inserts the journal rows. A data-modifying WITH runs whether or
	// not it is referenced. With a $17 it sets synchronous_commit for the
	// transaction to it.
	flushJournal = `WITH cancelled AS (UPDATE approvals SET status = 'cancelled', resolved_at = c.a
			FROM unnest($13::text[], $14::timestamptz[]) AS c (r, a) WHERE approvals.run_id = c.r AND approvals.status = 'pending'),
		touched AS (` + touchSessions + `),
		journal AS (` + insertJournal + `)
		SELECT $17::text IS NULL OR set_config('synchronous_commit', $17, true) IS NOT NULL`
	// touchSessions moves the updated_at of sessions $15 to the last of
	// their times $16 — never back, and only when that is more than $18
	// seconds later (touchBound) — without ever waiting for a lock (issue
	// 21: with three replicas this was the slowest statement, 12–22 ms,
	// all lock waits). It locks FOR NO KEY UPDATE, which a claim's or
	// finish's foreign-key check (FOR KEY SHARE on the session's row, held
	// until their group commits) does not conflict with, where FOR UPDATE
	// did; and SKIP LOCKED leaves a row another writer holds (another
	// replica's recorder, a takeover, a reset) to that writer, which is
	// moving the same session's time forward: the session's next start or
	// ending touches it again.
	touchSessions = `UPDATE sessions SET updated_at = greatest(sessions.updated_at, l.a)
		FROM (SELECT s.key, t.a FROM sessions AS s
			JOIN (SELECT k, max(a) AS a FROM unnest($15::text[], $16::timestamptz[]) AS u (k, a) GROUP BY k) AS t ON s.key = t.k
			WHERE s.updated_at < t.a - $18::float8 * interval '1 second'
			FOR NO KEY UPDATE OF s SKIP LOCKED) AS l
		WHERE sessions.key = l.key`
)

// touchBound is how far behind a session's last recorded turn start or
// ending its sessions.updated_at may stay (touchSessions): in shared mode
// (cluster/pgcoord) the row is written only when its time moves by more
// than a second, so the replicas' recorders and the claims of a busy
// session rarely meet on it; with one gateway it is exact.
func touchBound(shared bool) float64 {
	if shared {
		return 1
	}
	return 0
}

// journalRows are the journal rows of a batch not inserted yet, a slice
// per column, and the ended runs whose pending approvals are cancelled:
// one statement inserts and cancels them all (issue 21: one per event,
// then one per ending, was most of a turn's statements).
type journalRows struct {
	run, session, kind, reason, stepKind, stepName, lastStep, message []string
	seq, stepSeq, elapsed                                             []int64
	at                                                                []time.Time
	cancelRun                                                         []string
	cancelAt                                                          []time.Time
}

func (jr *journalRows) add(j store.JournalEntry) {
	jr.run, jr.session, jr.kind = append(jr.run, j.RunID), append(jr.session, j.SessionKey), append(jr.kind, j.KindName)
	jr.reason, jr.stepKind = append(jr.reason, string(j.StopReason)), append(jr.stepKind, j.Step.Kind)
	jr.stepName, jr.lastStep, jr.message = append(jr.stepName, j.Step.Name), append(jr.lastStep, j.LastStep), append(jr.message, j.Message)
	jr.seq, jr.stepSeq, jr.elapsed = append(jr.seq, int64(j.Seq)), append(jr.stepSeq, int64(j.Step.Seq)), append(jr.elapsed, int64(j.Elapsed))
	jr.at = append(jr.at, j.Time)
}

// cancel has the pending approvals of run cancelled at at by the flush
// (the first ending of a run in the batch gives the time).
func (jr *journalRows) cancel(run string, at time.Time) {
	if !slices.Contains(jr.cancelRun, run) {
		jr.cancelRun, jr.cancelAt = append(jr.cancelRun, run), append(jr.cancelAt, at)
	}
}

// flush inserts the rows added since the last flush, in order, cancels the
// ended runs' pending approvals, touches sessions keys at ats (bound:
// touchBound) and, with a mode (commitMode), sets the transaction's
// synchronous_commit, in one statement; none when there is nothing to do.
func (jr *journalRows) flush(ctx context.Context, tx pgx.Tx, keys []string, ats []time.Time, bound float64, mode any) error {
	if len(jr.run) == 0 && len(jr.cancelRun) == 0 && len(keys) == 0 && mode == nil {
		return nil
	}
	if _, err := tx.Exec(ctx, flushJournal, jr.run, jr.session, jr.seq, jr.kind, jr.reason, jr.stepKind, jr.stepName,
		jr.stepSeq, jr.lastStep, jr.elapsed, jr.message, jr.at, jr.cancelRun, jr.cancelAt, keys, ats, mode, bound); err != nil {
		return fmt.Errorf("journal %s: %w", strings.Join(slices.Compact(slices.Clone(jr.kind)), ", "), err)
	}
	*jr = journalRows{}
	return nil
}

// apply records one valid event inside tx; its journal row goes into
// b.journal, inserted with the batch's others at its end (or before an
// approval event, whose run's pending approvals an ending before it
// cancels); an ending's cancellation of its run's pending approvals goes
// with them.
func (s *Store) apply(ctx context.Context, tx pgx.Tx, ev *event.Event, b *batch) (err error) {
	at := store.EventTime(ev)
	jr, st := &b.journal, &b.steps
	if st.pending(ev.RunID) && s.writesTurn(ev) {
		// The run's steps are written before anything else writes its row.
		if err := st.flush(ctx, tx); err != nil {
			return err
		}
	}
	switch ev.Kind {
	case event.SessionReset:
		b.primary = true
		if _, err := tx.Exec(ctx, upsertSession, ev.SessionKey, at); err != nil {
			return fmt.Errorf("upsert session: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE sessions SET reset_after =
				(SELECT coalesce(max(id), 0) FROM messages WHERE session_key = $1) WHERE key = $1`, ev.SessionKey); err != nil {
			return fmt.Errorf("reset session: %w", err)
		}
		return nil // not a turn event: nothing to journal
	case event.TurnStarted:
		// The session row exists first (a claim's, or batch.ensureSessions),
		// and is updated after the turn's row (flushJournal).
		if s.shared {
			// With several gateways a turn is claimed (cluster/pgcoord): its
			// claim wrote the row and the user's message and removed its
			// queued row. A claim of this process (Claims) wrote its limits
			// and sender too: nothing to write, unless they differ. Any
			// other claimed turn learns them with the batch's steps
			// (stepRows.limits; none if it has ended already: its Finish
			// came first).
			lim, claimed := s.claims.take(ev.RunID)
			mine := claimed
			if !claimed {
				if err := tx.QueryRow(ctx, isClaimed, ev.RunID).Scan(&claimed); err != nil {
					return fmt.Errorf("start claimed turn: %w", err)
				}
			}
			if claimed {
				s.claimed.add(ev.RunID)
				if !mine || !lim.same(LimitsOf(ev)) {
					st.limits(ev, at)
				}
				if len(ev.Joined) > 0 {
					if _, err := tx.Exec(ctx, `DELETE FROM queued WHERE run_id = ANY($1)`, ev.Joined); err != nil {
						return fmt.Errorf("forget the started turn's queued messages: %w", err)
					}
				}
				break
			}
		}
		// A TurnStarted for a run id whose turn has ended starts it afresh
		// (the id was reused); for a running turn it is a duplicate. A
		// claimed turn (cluster/pgcoord: owner_epoch set) is never
		// restarted here: its claim wrote the row and the user's message,
		// and its end (Finish or a takeover) may already be committed.
		b.primary = true
		if err := b.ensureSessions(ctx, tx); err != nil {
			return err
		}
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
			if _, err := tx.Exec(ctx, startClaimed,
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
	case event.StepStarted, event.StepCompleted:
		// Folded into the batch's one update of its runs' steps (stepRows).
		if !st.add(ev, at) {
			if err := st.flush(ctx, tx); err != nil {
				return err
			}
			st.add(ev, at)
		}
	case event.Aborted, event.Finished:
		if err := s.endTurn(ctx, tx, ev, at, b); err != nil {
			return err
		}
	case event.ApprovalRequested, event.ApprovalResolved:
		b.primary = true
		if len(jr.cancelRun) > 0 {
			// An ending before it in the batch cancels its run's pending
			// approvals first, as one ending at a time did.
			if err := jr.flush(ctx, tx, nil, nil, 0, nil); err != nil {
				return err
			}
		}
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
	jr.add(store.JournalOf(ev, at))
	if ev.Kind.Terminal() {
		// Whether or not this ending was the turn's first (a claimed
		// turn's is its owner's Finish), no question of an ended turn
		// waits for an answer: its pending approvals are cancelled, in
		// the journal's statement (no round trip of their own).
		jr.cancel(ev.RunID, at)
	}
	return nil
}

// writesTurn reports whether apply writes ev's turn row: a start, or an
// ending of a turn not seen claimed (a claimed turn's ending writes none).
// Other events write other tables.
func (s *Store) writesTurn(ev *event.Event) bool {
	switch ev.Kind {
	case event.TurnStarted:
		return true
	case event.Aborted, event.Finished:
		return !s.claimed.has(ev.RunID)
	}
	return false
}

// endTurn records an Aborted or Finished event: the turn's final state and,
// if this is the turn's first ending, the assistant message and (for an
// outbox channel) its terminal messages in the outbox.
func (s *Store) endTurn(ctx context.Context, tx pgx.Tx, ev *event.Event, at time.Time, b *batch) (err error) {
	if s.claimed.ended(ev.RunID) {
		// A turn this store saw claimed: the statement below would change
		// no row (its end is its owner's Finish or a takeover's).
		return nil
	}
	b.primary = true
	if err := b.ensureSessions(ctx, tx); err != nil {
		return err
	}
	end := store.EndingOf(ev, at)
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
			b.outbox = true
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

// maxClaimed bounds claimedRuns: a replica's running turns, with room.
const maxClaimed = 1 << 17

// claimedRuns are the runs whose TurnStarted found their turn claimed
// (cluster/pgcoord: owner_epoch set, which nothing clears) and whose ending
// the writer has not seen yet: that ending's turn statement would change no
// row, so it is skipped (issue 21). Only the writer goroutine uses it. A run
// it does not hold (a restart, the bound reached: it starts afresh) has its
// ending written as any other's, which is only dearer.
type claimedRuns struct{ runs map[string]struct{} }

func (c *claimedRuns) add(run string) {
	if c.runs == nil || len(c.runs) >= maxClaimed {
		c.runs = make(map[string]struct{})
	}
	c.runs[run] = struct{}{}
}

// has reports whether run was seen claimed.
func (c *claimedRuns) has(run string) bool {
	_, ok := c.runs[run]
	return ok
}

// ended reports whether run was seen claimed, and forgets it.
func (c *claimedRuns) ended(run string) bool {
	_, ok := c.runs[run]
	delete(c.runs, run)
	return ok
}
