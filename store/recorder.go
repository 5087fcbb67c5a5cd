package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
)

// Handle records ev. It is an event.Handler for bus.Subscribe("", …): it is
// called on the publishing goroutine, so it never blocks, never does I/O
// and never fails. It appends ev to the writer's queue. Delta events are
// ignored (the reply is recorded whole when the turn ends).
//
// Beyond Options.QueueSize queued events (a slow or failing disk), events
// are shed by kind:
//   - TurnStarted, Aborted, Finished and ForceFinalized are never shed:
//     they wait beyond the queue size (counted in Spilled). A lost ending
//     would leave its turn "running" and the next start would tell the user
//     a false "interrupted"; a lost start would let an ending create the
//     turn without its question. They are bounded by the turns that can
//     run: while the store cannot write, new turns are refused (see
//     Health). SessionReset (/new, which is not a turn and is not refused)
//     is kept too, until another QueueSize events have spilled.
//   - StepStarted, StepCompleted, Paused, Resumed, Progress and Recovered
//     are shed and counted (Dropped): losing them only makes the recorded
//     current step, the journal and the stall history less detailed.
//
// Events are written in the order Handle received them, whatever was shed
// (calls that overlap are in some order; one publisher's, such as one run's,
// in its own). Handle takes no lock while nothing has spilled: the queue is a
// lock-free ring (eventqueue.go), so publishers of different runs do not wait for
// each other or for the writer. After Close every event is dropped and
// counted.
//
// The writer goroutine applies queued events in order, in batches of up to
// Options.BatchSize per transaction:
//   - TurnStarted creates the session if new, the turn (state running) and
//     the user's message in the history.
//   - StepStarted / StepCompleted update the turn's current and last step.
//   - Aborted and Finished end the turn (state aborted / finished, stop
//     reason, end time) and append the assistant message described on
//     Message; they create the turn if its TurnStarted was lost. Only the
//     first ending of a turn counts. For a turn of an outbox channel
//     (Options.OutboxChannels) the first ending also writes its terminal
//     messages to the outbox, in the same transaction (committed durably);
//     Options.OnOutbox is called after the commit.
//   - Every event except Delta, including the above, is journaled.
//
// A batch that fails for the state of the disk or the file (full, I/O
// error, read-only, locked) is kept and retried with backoff until it is
// written; meanwhile Health reports the store as unwritable. An event
// without a run id or session key is counted as failed.
func (s *SQLite) Handle(ev event.Event) {
	if ev.Kind == event.Delta {
		return
	}
	if s.closed.Load() {
		s.dropped.Add(1)
		return
	}
	ev.Locals = nil // the run's subscriber state is not the store's to keep alive
	// Lock-free unless an event that is never shed meets a full ring or
	// what spilled: nothing spilled and the ring has room, or the event is
	// shed.
	if s.spillN.Load() != 0 || !s.ring.push(&ev) {
		if !neverShed(ev.Kind) || !s.enqueueSlow(&ev) {
			s.dropped.Add(1)
			return
		}
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// enqueueSlow queues ev, an event that is never shed, when the ring was
// full or events have spilled (a slow or failing disk): behind what
// spilled, so the order holds, or into the ring if the writer has made room
// and nothing spilled. It reports false when ev is shed all the same (a
// SessionReset past QueueSize spilled events).
//
// A push that checked spillN before another publisher spilled may still land
// in the ring ahead of the spilled events: the two calls overlapped, so either
// order is the order Handle received them in. One publisher's (one run's)
// next event sees the spill and queues behind it.
func (s *SQLite) enqueueSlow(ev *event.Event) bool {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	switch {
	case len(s.spill) == 0 && s.ring.push(ev):
	case neverShed(ev.Kind) && (ev.Kind != event.SessionReset || len(s.spill) < int(s.ring.n)):
		s.spill = append(s.spill, *ev)
		s.spillN.Store(int64(len(s.spill)))
		s.spilled.Add(1)
	default:
		return false
	}
	return true
}

// neverShed reports whether events of kind k are kept however long the
// queue is.
func neverShed(k event.Kind) bool {
	switch k {
	case event.TurnStarted, event.Aborted, event.Finished, event.ForceFinalized, event.SessionReset:
		return true
	}
	return false
}

// Dropped reports how many events Handle shed because the queue was full
// (or refused because the store was closed).
func (s *SQLite) Dropped() uint64 { return s.dropped.Load() }

// QueueDepth reports how many events are waiting for the writer.
func (s *SQLite) QueueDepth() int {
	return s.ring.len() + int(s.spillN.Load())
}

// enqueued reports how many events Handle has accepted: every position of
// the ring ever claimed and every event that spilled.
func (s *SQLite) enqueued() uint64 { return s.ring.claimed() + s.spilled.Load() }

// Stats returns the recorder's counters.
func (s *SQLite) Stats() Stats {
	return Stats{
		Enqueued: s.enqueued(), Written: s.written.Load(), Dropped: s.dropped.Load(),
		Spilled: s.spilled.Load(), Failed: s.failed.Load(), QueueDepth: s.QueueDepth(),
	}
}

// Flush returns nil once every event that Handle accepted before the call
// has been written or counted as failed. It returns ctx's error if ctx ends
// first (as it will while the store cannot write), and ErrClosed if the
// store is closed before then (Close itself writes what was queued).
func (s *SQLite) Flush(ctx context.Context) error {
	target := s.enqueued()
	for {
		s.mu.Lock()
		reached, wait := s.processed >= target, s.progress
		s.mu.Unlock()
		if reached {
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return fmt.Errorf("flush store: %w", ctx.Err())
		case <-s.done:
			s.mu.Lock()
			reached = s.processed >= target
			s.mu.Unlock()
			if reached {
				return nil
			}
			return fmt.Errorf("flush store: %w", ErrClosed)
		}
	}
}

// run is the writer goroutine: it writes the queue, checks the file and,
// while the store cannot write, probes it.
func (s *SQLite) run() {
	defer close(s.done)
	check := time.NewTimer(checkInterval)
	defer check.Stop()
	batch := make([]event.Event, 0, s.batchSize)
	stopping := false
	for {
		if stopping && time.Now().UnixNano() > s.closeBy.Load() {
			s.abandonQueue()
			return
		}
		if batch = s.take(batch); len(batch) > 0 {
			s.writeUntilDone(batch, &stopping)
			clear(batch) // do not keep the texts alive until the slots are reused
			batch = batch[:0]
			select {
			case <-check.C:
				s.maintain()
				check.Reset(checkInterval)
			default:
			}
			continue
		}
		if stopping {
			return
		}
		select {
		case <-s.wake:
		case <-s.stop:
			stopping = true
		case <-s.poke:
			s.maintain()
		case <-check.C:
			s.maintain()
			check.Reset(checkInterval)
		}
	}
}

// abandonQueue counts every queued event failed, without writing it: Close
// ran out of time (CloseDrainLimit).
func (s *SQLite) abandonQueue() {
	var n int
	var scratch []event.Event
	for {
		scratch = s.ring.pop(scratch[:0], 256)
		if len(scratch) == 0 {
			break
		}
		n += len(scratch)
		clear(scratch)
	}
	s.qmu.Lock()
	n += len(s.spill)
	clear(s.spill)
	s.spill = nil
	s.spillN.Store(0)
	s.qmu.Unlock()
	if n > 0 {
		s.log.Error("store: closing took too long; queued events not recorded", "count", n, "limit", CloseDrainLimit)
		s.counted(0, uint64(n))
	}
}

// take moves up to a batch of queued events into batch, in the order
// Handle received them: the ring first, then what spilled past it.
func (s *SQLite) take(batch []event.Event) []event.Event {
	if batch = s.ring.pop(batch, s.batchSize); len(batch) > 0 || s.spillN.Load() == 0 {
		return batch
	}
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if batch = s.ring.pop(batch, s.batchSize); len(batch) > 0 {
		return batch // pushed after the first look: they come first (see enqueueSlow)
	}
	n := min(len(s.spill), s.batchSize)
	batch = append(batch, s.spill[:n]...)
	clear(s.spill[:n])
	if s.spill = s.spill[n:]; len(s.spill) == 0 {
		s.spill = nil
	}
	s.spillN.Store(int64(len(s.spill)))
	return batch
}

// writeUntilDone writes batch, retrying with backoff while it fails for
// the state of the disk or the file. Once the store is closing it tries
// once more and counts what still fails as failed.
func (s *SQLite) writeUntilDone(batch []event.Event, stopping *bool) {
	backoff := firstRetry
	for {
		rest, err := s.write(batch)
		if err == nil {
			s.setHealth(nil)
			return
		}
		batch = rest // what was written or counted failed is done
		s.setHealth(err)
		if *stopping {
			s.log.Error("store: closing while the store cannot write; events not recorded",
				"count", len(batch), "first_run", batch[0].RunID, "err", err)
			s.counted(0, uint64(len(batch)))
			return
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-s.stop:
			t.Stop()
			*stopping = true
		}
		backoff = min(2*backoff, maxRetry)
		s.checkFile()
	}
}

// write applies batch in one transaction. Events that cannot be valid are
// counted as failed without touching the database. If the transaction fails
// because of one event's content (a constraint, a value too big), each
// event is retried in its own transaction so that the bad one costs only
// itself. Any other failure (disk full, I/O error, a lock held past the
// busy timeout) — of the batch or of one of those retries — is returned
// with rest, the events of batch neither written nor counted failed (in
// order, never empty): the caller retries them.
func (s *SQLite) write(batch []event.Event) (rest []event.Event, err error) {
	if s.beforeBatch != nil {
		s.beforeBatch()
	}
	ctx := context.Background()
	var ok, bad uint64
	valid := batch
	for i := range batch {
		if err := validEvent(&batch[i]); err != nil {
			valid = nil
			break
		}
	}
	if valid == nil { // rare: copy the valid ones out, log the first bad one
		var firstErr error
		for i := range batch {
			if err := validEvent(&batch[i]); err != nil {
				if bad++; firstErr == nil {
					firstErr = fmt.Errorf("run %q, %s: %w", batch[i].RunID, batch[i].Kind, err)
				}
				continue
			}
			valid = append(valid, batch[i])
		}
		s.log.Error("store: invalid events not recorded", "count", bad, "first", firstErr)
	}
	if len(valid) > 0 {
		err = s.batchTx(ctx, valid, func(tx *sql.Tx) error {
			for i := range valid {
				if err := s.apply(ctx, tx, &valid[i]); err != nil {
					return err
				}
			}
			return nil
		})
	}
	switch {
	case err == nil:
		ok += uint64(len(valid))
		s.committed(valid)
	case !eventSpecific(err):
		s.counted(0, bad)
		return valid, fmt.Errorf("write %d events: %w", len(valid), err)
	default:
		for i := range valid {
			ev := &valid[i]
			one := valid[i : i+1]
			err := s.batchTx(ctx, one, func(tx *sql.Tx) error { return s.apply(ctx, tx, ev) })
			switch {
			case err == nil:
				ok++
				s.committed(one)
			case eventSpecific(err):
				bad++
				s.log.Error("store: event not recorded", "run", ev.RunID, "kind", ev.Kind.String(), "err", err)
			default: // the disk, not the event: keep the rest for a retry
				s.counted(ok, bad)
				return valid[i:], fmt.Errorf("write event %d of %d: %w", i+1, len(valid), err)
			}
		}
	}
	s.counted(ok, bad)
	return nil, nil
}

// batchTx runs fn, which applies evs, in one write transaction. When evs
// end a turn of an outbox channel (its terminal message goes into the
// outbox with it), the commit is durable (synchronous=FULL, like Enqueue):
// the message survives a power loss, not only a crash of the process.
func (s *SQLite) batchTx(ctx context.Context, evs []event.Event, fn func(*sql.Tx) error) error {
	body := fn
	if s.beforeCommit != nil {
		body = func(tx *sql.Tx) error {
			if err := fn(tx); err != nil {
				return err
			}
			s.beforeCommit()
			return nil
		}
	}
	var err error
	if slices.ContainsFunc(evs, s.toOutbox) {
		err = s.durably(ctx, body)
	} else {
		err = s.inTx(ctx, body)
	}
	if err == nil && s.afterCommit != nil {
		s.afterCommit()
	}
	return err
}

// toOutbox reports whether ev ends a turn whose terminal message the store
// writes to the outbox (Options.OutboxChannels).
func (s *SQLite) toOutbox(ev event.Event) bool {
	return (ev.Kind == event.Aborted || ev.Kind == event.Finished) && ev.ChatRef != "" && s.outboxChannels[ev.Channel]
}

// committed calls Options.OnOutbox once for each outbox channel whose turn
// endings evs (just committed) hold.
func (s *SQLite) committed(evs []event.Event) {
	if s.onOutbox == nil || len(s.outboxChannels) == 0 {
		return
	}
	var told []string
	for i := range evs {
		if ch := evs[i].Channel; s.toOutbox(evs[i]) && !slices.Contains(told, ch) {
			told = append(told, ch)
			s.onOutbox(ch)
		}
	}
}

// counted adds to the written and failed counters and wakes Flush.
func (s *SQLite) counted(ok, bad uint64) {
	s.written.Add(ok)
	s.failed.Add(bad)
	s.mu.Lock()
	s.processed += ok + bad
	close(s.progress)
	s.progress = make(chan struct{})
	s.mu.Unlock()
}

// eventSpecific reports whether err is due to the content of a statement
// rather than the state of the database.
func eventSpecific(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_RANGE:
		return true
	}
	return false
}

// validEvent rejects what cannot be recorded.
func validEvent(ev *event.Event) error {
	switch {
	case ev.RunID == "" && ev.Kind != event.SessionReset:
		return fmt.Errorf("%w: no run id", ErrInvalid)
	case ev.SessionKey == "":
		return fmt.Errorf("%w: no session key", ErrInvalid)
	case ev.Kind.String() == "unknown":
		return fmt.Errorf("%w: unknown event kind %d", ErrInvalid, ev.Kind)
	}
	return nil
}

// apply records one valid event inside tx.
func (s *SQLite) apply(ctx context.Context, tx *sql.Tx, ev *event.Event) error {
	at := ev.Time
	if at.IsZero() {
		at = time.Now()
	}
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
			nullNanos(ev.Deadline), nullNanos(ev.Ceiling), nullDuration(ev.StepTimeout))
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
		k, n, q := stepArgs(ev.Step)
		if _, err := stmt(st.stepStarted).ExecContext(ctx, k, n, q, now, ev.RunID); err != nil {
			return fmt.Errorf("step started: %w", err)
		}
	case event.StepCompleted:
		k, n, q := stepArgs(ev.Step)
		if _, err := stmt(st.stepCompleted).ExecContext(ctx, k, n, q, now, ev.RunID); err != nil {
			return fmt.Errorf("step completed: %w", err)
		}
	case event.Aborted, event.Finished:
		if err := s.endTurn(ctx, tx, ev, now); err != nil {
			return err
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
func (s *SQLite) endTurn(ctx context.Context, tx *sql.Tx, ev *event.Event, now int64) error {
	st := &s.st
	state, text := TurnFinished, ev.FullText
	started := now
	var cur event.Step // a finished turn has no running step
	if ev.Kind == event.Aborted {
		state, text, cur = TurnAborted, joinEnding(ev.FullText, ev.Message), ev.Step
		if ev.Elapsed > 0 {
			started = now - int64(ev.Elapsed) // only used if TurnStarted was lost
		}
	} else if ev.StopReason != event.ReasonStop {
		text = joinEnding(ev.FullText, ev.Message)
	}
	if _, err := tx.StmtContext(ctx, st.upsertSession).ExecContext(ctx, ev.SessionKey, now); err != nil {
		return fmt.Errorf("upsert session: %w", err)
	}
	ck, cn, cq := stepArgs(cur)
	lk, ln, lq := stepArgs(ev.LastStep)
	res, err := tx.StmtContext(ctx, st.endTurn).ExecContext(ctx,
		ev.RunID, ev.SessionKey, ev.Channel, ev.ChatRef, state, string(ev.StopReason), started, now,
		ck, cn, cq, lk, ln, lq)
	if err != nil {
		return fmt.Errorf("end turn: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return nil // already ended: its message is in the history (and the outbox)
	}
	if s.toOutbox(*ev) {
		if err := s.outboxEnding(ctx, tx, ev, now); err != nil {
			return err
		}
	}
	if text == "" {
		return nil
	}
	if _, err := tx.StmtContext(ctx, st.insertMessage).ExecContext(ctx,
		ev.SessionKey, ev.RunID, RoleAssistant, text, string(ev.StopReason), now); err != nil {
		return fmt.Errorf("insert assistant message: %w", err)
	}
	return nil
}

// outboxEnding puts the terminal messages of the turn ev ends into the
// outbox, inside the transaction that records the end: the reply ("final")
// and, for a turn that did not end normally, the notice ("notice"), with the
// texts messages.Ending decides. A run has at most one row of each kind
// (UNIQUE (run_id, kind)): one already there (the restart's interrupted
// notice, an earlier ending of a reused run id) is kept.
func (s *SQLite) outboxEnding(ctx context.Context, tx *sql.Tx, ev *event.Event, now int64) error {
	final, notice := messages.Ending(string(ev.StopReason), ev.FullText, ev.Message)
	for _, m := range []struct {
		kind OutboxKind
		text string
	}{{OutboxFinal, final}, {OutboxNotice, notice}} {
		if m.text == "" {
			continue
		}
		if _, err := tx.StmtContext(ctx, s.st.insertOutbox).ExecContext(ctx,
			ev.Channel, ev.ChatRef, ev.RunID, string(m.kind), m.text, now); err != nil {
			return fmt.Errorf("outbox %s message: %w", m.kind, err)
		}
	}
	return nil
}

// joinEnding is the history text of a turn that did not end normally: the
// partial reply, a blank line, the notice.
func joinEnding(partial, notice string) string {
	switch {
	case partial == "":
		return notice
	case notice == "":
		return partial
	}
	return partial + "\n\n" + notice
}

// stepArgs are the nullable column values of a step.
func stepArgs(st event.Step) (kind, name, seq any) {
	if st.IsZero() {
		return nil, nil, nil
	}
	return st.Kind, st.Name, int64(st.Seq)
}

// journalRow is the insertJournal arguments for ev. It keeps the journal
// compact: no user text, no reply text.
func journalRow(ev *event.Event, at time.Time) []any {
	msg := ev.Message
	elapsed := ev.Elapsed
	switch ev.Kind {
	case event.Paused:
		msg = ev.Text
	case event.Finished:
		if ev.StopReason == event.ReasonStop {
			msg = ""
		}
	case event.StepCompleted:
		if elapsed == 0 && !ev.Step.StartedAt.IsZero() {
			elapsed = at.Sub(ev.Step.StartedAt)
		}
	}
	return []any{
		ev.RunID, ev.SessionKey, int64(ev.Seq), ev.Kind.String(), string(ev.StopReason),
		ev.Step.Kind, ev.Step.Name, int64(ev.Step.Seq), ev.LastStep.Label(), int64(elapsed), msg, nanos(at),
	}
}

// stmts are the writer's prepared statements, prepared once on the write
// connection and bound to each batch's transaction.
type stmts struct {
	upsertSession, startTurn, insertMessage, stepStarted, stepCompleted, endTurn, insertJournal, insertOutbox *sql.Stmt
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
				deadline_at, ceiling_at, step_timeout_ns)
			VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?5, ?6, ?7, ?8)
			ON CONFLICT (run_id) DO UPDATE SET session_key = excluded.session_key, channel = excluded.channel,
				chat_ref = excluded.chat_ref, state = 'running', stop_reason = '', started_at = excluded.started_at,
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
		st.stepCompleted, st.endTurn, st.insertJournal, st.insertOutbox} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	return errors.Join(errs...)
}
