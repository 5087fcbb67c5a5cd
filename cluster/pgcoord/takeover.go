package pgcoord

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"
)

// Takeover is what a survivor did with one dead replica epoch.
type Takeover struct {
	Replica string
	Epoch   int64
	// Overdue is how long after the lease expired the takeover's work was
	// done (just before its commit), on the database's clock.
	Overdue time.Duration
	// Turns are the epoch's turns that were running: each is now aborted
	// with stop reason interrupted, its notice in the history (and, for an
	// outbox channel, in the outbox).
	Turns []TakenTurn
	// More is true when this is one batch of a survey's takeover of the
	// epoch (at most takeoverBatch turns, committed on its own) and more of
	// its turns follow in the next; the last batch, which deletes the
	// lease, has More false.
	More bool
}

// takeoverBatch bounds the turns one takeover transaction of a survey
// ends: a dead replica's thousands of turns commit in batches, and each
// batch is handed on (OnTakeover: its notices published) while the next
// commits, instead of all of them after one long transaction.
const takeoverBatch = 1000

// TakenTurn is one turn a takeover ended.
type TakenTurn struct {
	RunID      string
	SessionKey string
	Channel    string
	ChatRef    string
	Notice     string // the words Options.Notice rendered
	Outboxed   bool   // the notice went into the outbox (Options.OutboxChannels)
}

// lease names one replica epoch.
type lease struct {
	epoch   int64
	replica string
}

// Survey takes over every lease that has expired on the database's clock
// and that no other survivor is deleting right now, and returns what it
// took over: tell the sessions' watchers and run their queued messages.
// An epoch's running turns are ended in batches of at most takeoverBatch,
// one Takeover each (More set on all but the last), each its own
// transaction holding the lease FOR SHARE: other survivors end other
// batches of the same epoch at once (each turn once, whichever survivor
// commits it: FOR UPDATE SKIP LOCKED), and the lease, expired, can no
// longer be renewed nor finish a turn in between. The last transaction
// (finishTakeover) holds the lease FOR UPDATE, after every batch, and
// deletes it; a takeover of fewer than takeoverBatch turns is one
// Takeover. An epoch whose running turns are all in other survivors'
// batches is left to them.
// With nothing expired it costs one read. A fenced replica surveys nothing
// (ErrFenced): it is no longer the one to act on what it would find.
func (r *Replica) Survey(ctx context.Context) ([]Takeover, error) {
	var out []Takeover
	_, err := r.survey(ctx, func(t Takeover) { out = append(out, t) })
	return out, err
}

// survey is Survey that hands each takeover (or batch of one) to emit as
// soon as it is committed, and says how long until the next lease of
// another epoch expires (0 if there is none), on the database's clock.
func (r *Replica) survey(ctx context.Context, emit func(Takeover)) (time.Duration, error) {
	if err := r.live(); err != nil {
		return 0, fmt.Errorf("survey: %w", err)
	}
	var expired int
	var nextSecs *float64
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE expires_at <= now()),
			extract(epoch FROM min(expires_at) FILTER (WHERE epoch <> $1 AND expires_at > now()) - now())::float8
		FROM leases`, r.epoch).Scan(&expired, &nextSecs); err != nil {
		return 0, fmt.Errorf("survey the leases: %w", err)
	}
	var next time.Duration
	if nextSecs != nil {
		next = time.Duration(*nextSecs * float64(time.Second))
	}
	for done := 0; done < expired; {
		t, ok, elsewhere, err := r.takeOverNext(ctx)
		if err != nil {
			return next, err
		}
		if !ok {
			break
		}
		if len(t.Turns) == takeoverBatch {
			emit(t)
			continue
		}
		done++
		if elsewhere {
			// Its running turns are all in other survivors' batches: the
			// one of them that ends the last deletes the lease.
			continue
		}
		if err := r.finishTakeover(ctx, t, emit); err != nil {
			return next, err
		}
	}
	return next, nil
}

// finishTakeover is the end of a survey's takeover of epoch t, the batch
// this survivor just committed (fewer than takeoverBatch turns, perhaps
// none): other survivors' batches may still be ending the rest. It waits
// for them (the lease FOR UPDATE, takeOver), ends what is still running —
// in batches — and deletes the lease, unless another survivor did first.
// t goes to emit with More false when nothing else was left, so a small
// takeover is one Takeover, as it was one transaction.
func (r *Replica) finishTakeover(ctx context.Context, t Takeover, emit func(Takeover)) error {
	for {
		f, found, err := r.takeOver(ctx, lease{epoch: t.Epoch, replica: t.Replica}, takeoverBatch)
		if err != nil {
			if len(t.Turns) > 0 {
				emit(t) // committed: its ends are due whatever comes next
			}
			return err
		}
		if found && len(f.Turns) == 0 && !f.More && len(t.Turns) > 0 {
			t.More, t.Overdue = false, f.Overdue
			emit(t)
			return nil
		}
		if len(t.Turns) > 0 {
			emit(t)
		}
		if !found {
			return nil
		}
		if !f.More {
			emit(f)
			return nil
		}
		t = f
	}
}

// takeOverNext ends a batch of the running turns of an expired lease that
// no survivor is finishing (deleting); ok false when there is none. It
// holds the lease FOR SHARE, so the survivors end batches of one dead
// epoch at once (each locks its batch's turns, skipping those another
// locked), while the lease can be neither deleted nor renewed; the batch
// has More set and leaves the lease (finishTakeover deletes it).
// elsewhere is true when it found no turn to end but the epoch still has
// running ones: other survivors' batches hold them.
func (r *Replica) takeOverNext(ctx context.Context) (t Takeover, found, elsewhere bool, err error) {
	err = r.retryConflicts(ctx, func() error {
		t, found, elsewhere = Takeover{}, false, false
		return r.inTx(ctx, func(tx pgx.Tx) error {
			var l lease
			err := tx.QueryRow(ctx, `SELECT epoch, replica_id FROM leases WHERE expires_at <= now()
				ORDER BY expires_at LIMIT 1 FOR SHARE SKIP LOCKED`).Scan(&l.epoch, &l.replica)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("lock an expired lease: %w", err)
			}
			found = true
			if t, err = r.interrupt(ctx, tx, l, takeoverBatch, false); err != nil || len(t.Turns) > 0 {
				return err
			}
			err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM turns WHERE owner_replica = $1 AND owner_epoch = $2
				AND state = 'running')`, l.replica, l.epoch).Scan(&elsewhere)
			if err != nil {
				return fmt.Errorf("look for the turns other survivors are ending: %w", err)
			}
			return nil
		})
	})
	if err != nil {
		return Takeover{}, false, false, fmt.Errorf("take over an expired lease: %w", err)
	}
	if len(t.Turns) > 0 {
		r.afterTakeover(t)
	}
	return t, found, elsewhere, nil
}

// resume returns the notice that ends the taken-over turn tr: Notice's,
// or, when Options.Resume dispatches it again, the resuming one, with its
// next attempt queued in tx.
func (r *Replica) resume(ctx context.Context, tx pgx.Tx, tr store.Turn) (string, error) {
	if r.opts.Resume == nil {
		return r.opts.Notice(tr), nil
	}
	prev, err := postgres.ReadResume(ctx, tx, tr.RunID)
	found := err == nil
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return "", fmt.Errorf("resume: %w", err)
	}
	text, err := postgres.ReadUserText(ctx, tx, tr.RunID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return "", fmt.Errorf("resume: %w", err)
	}
	next, m, notice, ok := r.opts.Resume(tr, prev, found, text)
	if !ok {
		return r.opts.Notice(tr), nil
	}
	if next, m, err = store.CheckResume(next, m); err != nil {
		return "", fmt.Errorf("resume: %w", err)
	}
	if err := postgres.QueueResumeTx(ctx, tx, next, m); err != nil {
		return "", fmt.Errorf("resume: %w", err)
	}
	return notice, nil
}

// takeOver ends epoch l's running turns and deletes its lease whether or
// not it has expired (Leave: this replica's own; Survey: the last
// transactions of a dead one's takeover); found false when the lease was
// gone already. It waits for the lease FOR UPDATE: for every batch, claim
// and finish that holds it, so what it finds running is all that is left.
// With limit > 0 it ends at most limit turns and, when it ended limit,
// leaves the lease (More set): call it again.
func (r *Replica) takeOver(ctx context.Context, l lease, limit int) (t Takeover, found bool, err error) {
	err = r.retryConflicts(ctx, func() error {
		t, found = Takeover{}, false
		return r.inTx(ctx, func(tx pgx.Tx) error {
			var one int
			err := tx.QueryRow(ctx, `SELECT 1 FROM leases WHERE epoch = $1 FOR UPDATE`, l.epoch).Scan(&one)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // taken over already
			}
			if err != nil {
				return fmt.Errorf("lock the lease: %w", err)
			}
			found = true
			t, err = r.interrupt(ctx, tx, l, limit, true)
			return err
		})
	})
	if err != nil {
		return Takeover{}, false, fmt.Errorf("take over %s#%d: %w", l.replica, l.epoch, err)
	}
	if found {
		r.afterTakeover(t)
	}
	return t, found, nil
}

// interrupt does a takeover inside tx: it ends l's running turns as
// interrupted (through turns_by_owner: only that epoch's rows), appends
// their notices to the history, journals them, enqueues them for outbox
// channels (one per run: UNIQUE (run_id, kind)), expires the questions
// (approvals) they waited on and touches their sessions. With limit > 0
// it ends at most limit turns. When exclusive, tx holds l's lease row FOR
// UPDATE: unless it ended limit turns (More set), it also releases the
// epoch's outbox claims and deletes the lease. Otherwise (a survivor's
// batch) tx holds the lease FOR SHARE, as other survivors' batches may:
// it locks its turns FOR UPDATE SKIP LOCKED (another batch has the
// others) and leaves the lease: the Takeover has More set.
func (r *Replica) interrupt(ctx context.Context, tx pgx.Tx, l lease, limit int, exclusive bool) (Takeover, error) {
	t := Takeover{Replica: l.replica, Epoch: l.epoch}
	// The batch's run ids first, through turns_by_owner (LIMIT NULL: all),
	// then each row by its key: one plan for any size.
	var batch []string
	idSQL := `SELECT run_id FROM turns WHERE owner_replica = $1 AND owner_epoch = $2 AND state = 'running'
		LIMIT nullif($3::int, 0)`
	if !exclusive {
		idSQL += ` FOR UPDATE SKIP LOCKED`
	}
	idRows, err := tx.Query(ctx, idSQL, l.replica, l.epoch, max(limit, 0))
	if err == nil {
		batch, err = pgx.CollectRows(idRows, pgx.RowTo[string])
	}
	if err != nil {
		return t, fmt.Errorf("find the turns: %w", err)
	}
	rows, err := tx.Query(ctx, `UPDATE turns SET state = 'aborted', stop_reason = $3, updated_at = now(), ended_at = now()
		FROM unnest($4::text[]) AS batch(run_id)
		WHERE turns.run_id = batch.run_id AND owner_replica = $1 AND owner_epoch = $2 AND state = 'running'
		RETURNING turns.run_id, session_key, channel, chat_ref, sender, started_at,
			greatest(started_at, (SELECT renewed_at FROM leases WHERE epoch = $2)),
			coalesce(step_kind, ''), coalesce(step_name, ''), coalesce(step_seq, 0),
			coalesce(last_step_kind, ''), coalesce(last_step_name, ''), coalesce(last_step_seq, 0),
			coalesce(step_timeout_ns, 0)`,
		l.replica, l.epoch, string(event.ReasonInterrupted), batch)
	if err != nil {
		return t, fmt.Errorf("end the turns: %w", err)
	}
	turns, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Turn, error) {
		var tr store.Turn
		var curSeq, lastSeq, stepTimeout int64
		err := row.Scan(&tr.RunID, &tr.SessionKey, &tr.Channel, &tr.ChatRef, &tr.Sender, &tr.StartedAt, &tr.UpdatedAt,
			&tr.CurrentStep.Kind, &tr.CurrentStep.Name, &curSeq, &tr.LastStep.Kind, &tr.LastStep.Name, &lastSeq, &stepTimeout)
		tr.State, tr.StopReason = store.TurnAborted, event.ReasonInterrupted
		tr.StartedAt, tr.UpdatedAt = tr.StartedAt.UTC(), tr.UpdatedAt.UTC()
		tr.CurrentStep.Seq, tr.LastStep.Seq, tr.StepTimeout = uint32(curSeq), uint32(lastSeq), time.Duration(stepTimeout)
		return tr, err
	})
	if err != nil {
		return t, fmt.Errorf("end the turns: %w", err)
	}
	n := len(turns)
	var (
		sessions, runIDs, notices                   = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		stepKinds, stepNames, lastSteps             = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		stepSeqs, elapsed                           = make([]int64, 0, n), make([]int64, 0, n)
		obChannels, obChatRefs, obRunIDs, obNotices []string
	)
	t.Turns = make([]TakenTurn, 0, n)
	for _, tr := range turns {
		notice, err := r.resume(ctx, tx, tr)
		if err != nil {
			return t, err
		}
		tt := TakenTurn{RunID: tr.RunID, SessionKey: tr.SessionKey, Channel: tr.Channel, ChatRef: tr.ChatRef, Notice: notice}
		sessions, runIDs, notices = append(sessions, tr.SessionKey), append(runIDs, tr.RunID), append(notices, notice)
		stepKinds, stepNames = append(stepKinds, tr.CurrentStep.Kind), append(stepNames, tr.CurrentStep.Name)
		stepSeqs, elapsed = append(stepSeqs, int64(tr.CurrentStep.Seq)), append(elapsed, int64(tr.UpdatedAt.Sub(tr.StartedAt)))
		lastSteps = append(lastSteps, tr.LastStep.Label())
		if notice != "" && tr.ChatRef != "" && r.outbox[tr.Channel] {
			obChannels, obChatRefs = append(obChannels, tr.Channel), append(obChatRefs, tr.ChatRef)
			obRunIDs, obNotices = append(obRunIDs, tr.RunID), append(obNotices, notice)
			tt.Outboxed = true
		}
		t.Turns = append(t.Turns, tt)
	}
	// The rest is written in one round trip (a pgx batch, run in order
	// inside tx): a batch of a large takeover costs two round trips more
	// than the lock, not eight.
	b := &pgx.Batch{}
	if n > 0 {
		b.Queue(`INSERT INTO journal (run_id, session_key, seq, kind, stop_reason,
				step_kind, step_name, step_seq, last_step, elapsed_ns, message, at)
			SELECT r, s, 0, $7, $8, sk, sn, sq, ls, el, x, now()
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $9::bigint[], $10::text[])
				AS u(r, s, sk, sn, sq, ls, el, x)`,
			runIDs, sessions, stepKinds, stepNames, stepSeqs, lastSteps, event.Aborted.String(),
			string(event.ReasonInterrupted), elapsed, notices)
		b.Queue(`INSERT INTO messages (session_key, run_id, role, text, stop_reason, created_at)
			SELECT s, r, 'assistant', x, $4, now() FROM unnest($1::text[], $2::text[], $3::text[]) AS u(s, r, x)
			WHERE x <> ''`, sessions, runIDs, notices, string(event.ReasonInterrupted))
		if len(obRunIDs) > 0 {
			b.Queue(`INSERT INTO outbox (channel, chat_ref, run_id, kind, text, created_at)
				SELECT c, cr, r, 'notice', x, now() FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS u(c, cr, r, x)
				ON CONFLICT (run_id, kind) DO NOTHING`, obChannels, obChatRefs, obRunIDs, obNotices)
		}
		// The questions (approvals) they waited on: nobody can answer
		// them any more.
		b.Queue(`UPDATE approvals SET status = 'expired', resolved_at = now()
			WHERE run_id = ANY($1) AND status = 'pending'`, runIDs)
		// Sessions locked in key order: no deadlock with another writer
		// that locks several. FOR NO KEY UPDATE, as the update itself:
		// a claim's foreign-key lock on a session (FOR KEY SHARE) does not
		// wait for it, nor it for the claim.
		b.Queue(`UPDATE sessions SET updated_at = greatest(updated_at, now())
			WHERE key IN (SELECT key FROM sessions WHERE key = ANY($1) ORDER BY key FOR NO KEY UPDATE)`, sessions)
	}
	var overdue float64
	scanOverdue := func(row pgx.Row) error { return row.Scan(&overdue) }
	t.More = !exclusive || (limit > 0 && n == limit)
	if t.More {
		// A batch: the lease stays (expired, under this lock until the
		// commit) for the next one and the last transaction.
		b.Queue(`SELECT extract(epoch FROM clock_timestamp() - expires_at)::float8
			FROM leases WHERE epoch = $1`, l.epoch).QueryRow(scanOverdue)
	} else {
		// The outbox rows the dead epoch had claimed and not sent are
		// claimable at once, not when their hold ends: a reply it was
		// sending when it died reaches its chat a lease after the death,
		// not a hold (a minute) after. (Delivered twice only if Telegram
		// had accepted it.)
		b.Queue(`UPDATE outbox SET claimed_by = NULL, claimed_until = NULL
			WHERE delivered_at IS NULL AND failed_at IS NULL AND claimed_by = $1`, ownerOf(l.replica, l.epoch))
		b.Queue(`DELETE FROM leases WHERE epoch = $1
			RETURNING extract(epoch FROM clock_timestamp() - expires_at)::float8`, l.epoch).QueryRow(scanOverdue)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return t, fmt.Errorf("write the ends (history, journal, outbox, questions, sessions) and the lease: %w", err)
	}
	t.Overdue = time.Duration(overdue * float64(time.Second))
	return t, nil
}

// afterTakeover logs t and tells OnOutbox of the channels it enqueued for.
func (r *Replica) afterTakeover(t Takeover) {
	if len(t.Turns) > 0 || t.Epoch != r.epoch {
		r.log.Warn("cluster: took over a replica's lease", "dead", t.Replica, "dead_epoch", t.Epoch,
			"turns", len(t.Turns), "overdue", t.Overdue)
	}
	if r.opts.OnOutbox == nil {
		return
	}
	told := map[string]bool{}
	for _, tt := range t.Turns {
		if tt.Outboxed && !told[tt.Channel] {
			told[tt.Channel] = true
			r.opts.OnOutbox(tt.Channel)
		}
	}
}

// takeoverQueue bounds the takeovers (batches) committed and not yet
// handed to OnTakeover.
const takeoverQueue = 4

// retryConflicts runs fn again when the server aborted its transaction for
// a deadlock or a serialization failure (postgres.RetryConflicts).
func (r *Replica) retryConflicts(ctx context.Context, fn func() error) error {
	return postgres.RetryConflicts(ctx, fn)
}

// surveyLoop surveys until ctx is done or the replica is fenced: every
// SurveyEvery, and as soon as the next lease of another epoch is due to
// expire (a wait measured by the database, as an interval), so a dead
// replica's turns are taken over within moments of its lease's end.
//
// OnTakeover is called on a goroutine of its own, in commit order, so a
// takeover's batches are handed on while the next commits; at most
// takeoverQueue wait for it (then the survey waits).
func (r *Replica) surveyLoop(ctx context.Context) {
	const (
		minWait = 5 * time.Millisecond // between two surveys, at least
		margin  = 2 * time.Millisecond // past the next expiry, so it has passed on the server
	)
	taken := make(chan Takeover, takeoverQueue)
	delivered := make(chan struct{})
	go func() {
		defer close(delivered)
		for t := range taken {
			r.opts.OnTakeover(t)
		}
	}()
	defer func() { close(taken); <-delivered }() // committed takeovers are all handed on
	emit := func(t Takeover) { taken <- t }
	for {
		wait := r.opts.SurveyEvery
		next, err := r.survey(ctx, emit)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrFenced):
			return
		case err != nil:
			r.log.Warn("cluster: survey failed", "error", err)
		}
		if next > 0 && next+margin < wait {
			wait = next + margin
		}
		if wait < minWait {
			wait = minWait
		}
		if sleepUntil(ctx, time.Now().Add(wait)) != nil {
			return
		}
	}
}
