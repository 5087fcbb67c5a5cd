package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/event"
)

// stepRows are a batch's StepStarted and StepCompleted events not written
// yet, folded per run into the one change they make to the run's row: one
// statement (updateSteps) writes every run's (issue 21: one UPDATE per
// step event was a third of a turn's statements). apply flushes them
// before any other event of a run with pending steps is applied, so a
// run's steps are written before its ending or anything else that reads or
// writes its row, in the order the events came (the other events of a
// batch touch no run's row but their own).
type stepRows struct {
	byRun map[string]int // index into runs
	runs  []stepRun
	// skipped are the changes flush could not write: their run's row was
	// running and held by another transaction (updateSteps). The writer
	// carries them into its next batch (carry): that transaction ends the
	// turn, and then they change nothing, or rolls back.
	skipped []stepRun
}

// carry puts changes a committed batch skipped before any of this batch's.
func (sr *stepRows) carry(runs []stepRun) {
	for _, r := range runs {
		*sr.run(r.run) = r
	}
}

// stepRun is what a run's step events of one flush do to its row, as the
// events one by one would: StepStarted sets the current step; StepCompleted
// sets the last step and clears the current one if it is the step that
// completed. Before any StepStarted of the flush the current step is the
// row's (known false): then a completion clears it in SQL if the seq
// matches (clear), as the one-event UPDATE did.
type stepRun struct {
	run      string
	known    bool       // cur is the current step (a StepStarted came)
	cur      event.Step // the current step when known (zero: none)
	clear    bool       // !known: clear the row's current step if its seq is clearSeq
	clearSeq event.Step // the completed step whose seq clears it
	lastSet  bool       // a StepCompleted came: last is the row's last step
	last     event.Step
	at       time.Time
	lim      bool        // a claimed turn's TurnStarted came (limits): its limits and sender follow
	limits   event.Event // that TurnStarted's Deadline, Ceiling, StepTimeout and Sender
}

// add folds ev (a StepStarted or StepCompleted) in; false (nothing added)
// when it cannot be folded with the run's pending change (a second
// completion before the current step is known): flush and add again.
func (sr *stepRows) add(ev *event.Event, at time.Time) bool {
	r := sr.run(ev.RunID)
	switch {
	case ev.Kind == event.StepStarted:
		r.known, r.cur, r.clear = true, ev.Step, false
	case r.known:
		if r.cur.IsZero() == ev.Step.IsZero() && r.cur.Seq == ev.Step.Seq {
			r.cur = event.Step{}
		}
		r.lastSet, r.last = true, ev.Step
	case r.clear:
		return false
	default:
		r.clear, r.clearSeq = true, ev.Step
		r.lastSet, r.last = true, ev.Step
	}
	r.at = at
	return true
}

// limits folds in a claimed turn's TurnStarted ev: its limits and sender
// (the columns startClaimed writes) go with the run's steps, in the
// batch's last statement, so the batch locks the turn's row only at its
// end (issue 21: a lock taken at the start was held through the batch, and
// the owner's Finish of the turn waited for it).
func (sr *stepRows) limits(ev *event.Event, at time.Time) {
	r := sr.run(ev.RunID)
	r.lim = true
	r.limits = event.Event{Deadline: ev.Deadline, Ceiling: ev.Ceiling, StepTimeout: ev.StepTimeout, Sender: ev.Sender}
	if at.After(r.at) {
		r.at = at
	}
}

// run is run's pending change, added if it has none.
func (sr *stepRows) run(run string) *stepRun {
	if sr.byRun == nil {
		sr.byRun = map[string]int{}
	}
	i, ok := sr.byRun[run]
	if !ok {
		i = len(sr.runs)
		sr.byRun[run] = i
		sr.runs = append(sr.runs, stepRun{run: run})
	}
	return &sr.runs[i]
}

// pending reports whether run has step changes not written yet.
func (sr *stepRows) pending(run string) bool {
	_, ok := sr.byRun[run]
	return ok
}

// stepSeq is a step's seq column: nil for no step.
func stepSeq(st event.Step) *int64 {
	if st.IsZero() {
		return nil
	}
	q := int64(st.Seq)
	return &q
}

// updateSteps applies the folded step changes and claimed turns' limits
// (stepRows.limits), a row per run of the arrays, to the runs' rows that
// are running — without waiting for a lock
// (issue 21): a running turn's row that another transaction holds is being
// ended by it (its owner's Finish, in a group commit that holds it until
// the WAL flush; a takeover; an abort), and that ending writes the turn's
// steps itself, so the row is skipped (SKIP LOCKED), where waiting for it
// held the batch's other rows and made the next group of finishes wait in
// turn (with one replica 18 ms a call of lock waits, sampled). Should that
// ending roll back, the changes skipped are written by the writer's next
// batch (stepRows.skipped: the runs its snapshot saw running that it did
// not update).
const updateSteps = `WITH upd AS (UPDATE turns SET
		step_kind = CASE WHEN u.known THEN u.ck WHEN u.clr AND turns.step_seq IS NOT DISTINCT FROM u.clrq THEN NULL ELSE turns.step_kind END,
		step_name = CASE WHEN u.known THEN u.cn WHEN u.clr AND turns.step_seq IS NOT DISTINCT FROM u.clrq THEN NULL ELSE turns.step_name END,
		step_seq = CASE WHEN u.known THEN u.cq WHEN u.clr AND turns.step_seq IS NOT DISTINCT FROM u.clrq THEN NULL ELSE turns.step_seq END,
		last_step_kind = CASE WHEN u.ls THEN u.lk ELSE turns.last_step_kind END,
		last_step_name = CASE WHEN u.ls THEN u.ln ELSE turns.last_step_name END,
		last_step_seq = CASE WHEN u.ls THEN u.lq ELSE turns.last_step_seq END,
		deadline_at = CASE WHEN u.lim THEN u.dl ELSE turns.deadline_at END,
		ceiling_at = CASE WHEN u.lim THEN u.cl ELSE turns.ceiling_at END,
		step_timeout_ns = CASE WHEN u.lim THEN u.sto ELSE turns.step_timeout_ns END,
		sender = CASE WHEN u.lim THEN u.snd ELSE turns.sender END,
		updated_at = u.at
	FROM unnest($1::text[], $2::bool[], $3::text[], $4::text[], $5::bigint[], $6::bool[], $7::bigint[], $8::bool[],
		$9::text[], $10::text[], $11::bigint[], $12::timestamptz[], $13::bool[], $14::timestamptz[], $15::timestamptz[],
		$16::bigint[], $17::text[]) AS u (run, known, ck, cn, cq, clr, clrq, ls, lk, ln, lq, at, lim, dl, cl, sto, snd)
	WHERE turns.run_id = u.run AND turns.state = 'running'
		AND turns.run_id IN (SELECT run_id FROM turns WHERE run_id = ANY ($1) AND state = 'running' FOR NO KEY UPDATE SKIP LOCKED)
	RETURNING turns.run_id)
	SELECT coalesce(array_agg(t.run_id), '{}') FROM turns AS t
	WHERE t.run_id = ANY ($1) AND t.state = 'running' AND NOT EXISTS (SELECT FROM upd WHERE upd.run_id = t.run_id)`

// flush writes the pending step changes, if any, in one statement, and
// keeps those it skipped in sr.skipped.
func (sr *stepRows) flush(ctx context.Context, tx pgx.Tx) error {
	n := len(sr.runs)
	if n == 0 {
		return nil
	}
	runs, ck, cn, lk, ln := make([]string, n), make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n)
	known, clr, ls := make([]bool, n), make([]bool, n), make([]bool, n)
	cq, clrq, lq := make([]*int64, n), make([]*int64, n), make([]*int64, n)
	at := make([]time.Time, n)
	lim, dl, cl, sto, snd := make([]bool, n), make([]any, n), make([]any, n), make([]any, n), make([]string, n)
	for i, r := range sr.runs {
		runs[i], known[i], clr[i], ls[i], at[i] = r.run, r.known, r.clear, r.lastSet, r.at
		ck[i], cn[i], cq[i] = stepText(r.cur, r.cur.Kind), stepText(r.cur, r.cur.Name), stepSeq(r.cur)
		clrq[i] = stepSeq(r.clearSeq)
		lk[i], ln[i], lq[i] = stepText(r.last, r.last.Kind), stepText(r.last, r.last.Name), stepSeq(r.last)
		lim[i], snd[i] = r.lim, r.limits.Sender
		dl[i], cl[i], sto[i] = nullTime(r.limits.Deadline), nullTime(r.limits.Ceiling), nullDuration(r.limits.StepTimeout)
	}
	var skipped []string
	if err := tx.QueryRow(ctx, updateSteps, runs, known, ck, cn, cq, clr, clrq, ls, lk, ln, lq, at, lim, dl, cl, sto, snd).Scan(&skipped); err != nil {
		return fmt.Errorf("steps: %w", err)
	}
	for _, run := range skipped {
		sr.skipped = append(sr.skipped, sr.runs[sr.byRun[run]])
	}
	*sr = stepRows{skipped: sr.skipped}
	return nil
}

// stepText is a step's text column s: nil for no step.
func stepText(st event.Step, s string) *string {
	if st.IsZero() {
		return nil
	}
	return &s
}
