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

// Claim is a turn a replica asks to run.
type Claim struct {
	RunID      string // the client's idempotency key: unique cluster-wide
	SessionKey string
	Channel    string
	ChatRef    string
	// Text is the user's message, appended to the session's history with
	// the claim ("" appends none). The recorder's TurnStarted of a claimed
	// turn does not append it again.
	Text string
	// Joined are the run ids of queued messages this turn runs (collect
	// mode); they leave the queue with the claim, as RunID's own does.
	Joined []string
	// Limits are the turn's deadline, ceiling, step timeout and sender,
	// written with its row (issue 21: the recorder's TurnStarted of a turn
	// this process claimed then writes nothing; Options.Claims).
	Limits Limits
}

// Limits are a claimed turn's limits and sender (postgres.Limits).
type Limits = postgres.Limits

// Claims are the claims of this process its store's recorder knows about
// (postgres.Claims: Options.Claims).
type Claims = postgres.Claims

// BusyError is Claim's answer when the session has a running turn
// anywhere in the cluster.
type BusyError struct {
	SessionKey    string
	HolderRunID   string // the running turn's run id
	HolderReplica string // the replica that runs it
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("session %q is busy: run %q is running on replica %q", e.SessionKey, e.HolderRunID, e.HolderReplica)
}

// DuplicateError is Claim's answer when the run id already has a turn,
// running or ended, on any replica (cluster-wide idempotency).
type DuplicateError struct {
	RunID      string
	SessionKey string
	State      store.TurnState  // TurnRunning, or how it ended
	StopReason event.StopReason // "" while running
	Replica    string           // its owner; "" for a turn no replica claimed
}

func (e *DuplicateError) Error() string {
	if e.State == store.TurnRunning {
		return fmt.Sprintf("run %q is already running (session %q, replica %q)", e.RunID, e.SessionKey, e.Replica)
	}
	return fmt.Sprintf("run %q already ran: %s (%s)", e.RunID, e.State, e.StopReason)
}

// claimRetries bounds how often Claim retries when its insert conflicted
// with a turn that ended before Claim could read it.
const claimRetries = 8

// Claim makes this replica the owner of c's turn, in one transaction
// committed durably: the turn's row (running, owned by this replica's
// epoch), the user's message in the history, c's queued messages gone.
// It returns nil when the turn is this replica's to run; *BusyError when
// the session has a running turn anywhere (the holder's run id, the same
// for every concurrent loser); *DuplicateError when the run id already has
// a turn; an error wrapping ErrFenced when this replica may not start turns
// (it must not run c). Concurrent claims of one session, from any number
// of replicas, have exactly one winner: the database's unique index
// decides.
func (r *Replica) Claim(ctx context.Context, c Claim) error {
	_, err := r.ClaimAfter(ctx, c)
	return err
}

// ClaimAfter is Claim that also says whether the session's previous turn
// was this epoch's own and ended by it (not taken over): then no other
// replica has published events of the session since this one did, and
// its event numbering simply goes on (cluster/node skips renewing it, a
// stream lookup on the exporter's one goroutine).
func (r *Replica) ClaimAfter(ctx context.Context, c Claim) (prevMine bool, err error) {
	if c.RunID == "" || c.SessionKey == "" {
		return false, fmt.Errorf("claim: run id and session key are required: %w", store.ErrInvalid)
	}
	for range claimRetries {
		if err := r.live(); err != nil {
			return false, fmt.Errorf("claim run %q: %w", c.RunID, err)
		}
		won, mine, err := r.insertClaim(ctx, c)
		if err != nil {
			var answer claimAnswer
			if errors.As(err, &answer) {
				return false, err // busy, a duplicate, or fenced
			}
			// The commit's answer may be lost after the commit (ctx
			// cancelled mid-COMMIT, a dropped connection): read back, never
			// guess. A claim that committed is this replica's to run; left
			// unanswered, the turn would stay running under a live epoch
			// with nothing running it, and the session busy for good.
			if r.claimCommitted(ctx, c) {
				r.opts.Claims.Add(c.RunID, c.Limits)
				return false, nil
			}
			return false, fmt.Errorf("claim run %q: %w", c.RunID, err)
		}
		if won {
			r.opts.Claims.Add(c.RunID, c.Limits)
			return mine, nil
		}
		// Lost to a turn committed after the statement's snapshot: try
		// again (the next statement names it, unless it has already ended).
	}
	return false, fmt.Errorf("claim run %q: session %q: the claim kept conflicting with turns that ended at once", c.RunID, c.SessionKey)
}

// claimAnswer is what insertClaim returns for a claim the database decided
// against (*BusyError, *DuplicateError, a fence): no read-back needed.
type claimAnswer interface {
	error
	claimAnswer()
}

func (*BusyError) claimAnswer()      {}
func (*DuplicateError) claimAnswer() {}
func (fencedClaim) claimAnswer()     {}

// fencedClaim is a claim refused because this epoch's lease is gone.
type fencedClaim struct{ error }

func (f fencedClaim) Unwrap() error { return f.error }

// Holder returns the run of sessionKey's claimed turn that is running and
// the id of the replica that owns it (as BusyError.HolderReplica names it);
// ok is false when no replica runs a turn of the session. A turn of a
// replica that died stays running until a survivor takes it over. A fenced
// replica still answers: the database is the truth either way.
func (r *Replica) Holder(ctx context.Context, sessionKey string) (runID, replica string, ok bool, err error) {
	err = r.pool.QueryRow(ctx, `SELECT run_id, coalesce(owner_replica, '') FROM turns
		WHERE session_key = $1 AND state = 'running' AND owner_epoch IS NOT NULL`, sessionKey).Scan(&runID, &replica)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", "", false, nil
	case err != nil:
		return "", "", false, fmt.Errorf("holder of session %q: %w", sessionKey, err)
	}
	return runID, replica, true, nil
}

// claimSQL is a claim in one statement, one round trip and one commit
// (issue 21): it reads the turn c runs into (its run id, or the session's
// running claimed turn); only when there is none does it lock this epoch's
// lease FOR KEY SHARE if it has not expired on the database's clock ($6)
// (the busy answer writes nothing, not even a row lock: the condition on
// held is a one-time filter above the lease's scan), and only when the
// lease holds does it write the claim — the session's row if its snapshot
// has none (never an update of an existing one, nor an insert that would
// find it: ON CONFLICT waits for a writer of the row it conflicts with,
// and the recorders' batches, resets and takeovers update it; the turn's
// and message's foreign keys lock it only FOR KEY SHARE, which they do not
// conflict with: TestClaimAndFinishDoNotWaitForTheSessionsWriters), the turn (ON CONFLICT
// DO NOTHING: the unique indexes decide between concurrent claims), the
// user's message and the queued messages' removal, these three only when
// the turn's row was inserted; the turn's row has its limits and sender
// ($9–$12: Claim.Limits). It also says whether the session's previous
// turn was this epoch's own and ended by it. synchronous_commit is set on
// for the statement's transaction (set_config local), so the commit is
// durable whatever the database's default.
const claimSQL = `WITH held AS (SELECT run_id, session_key, state, stop_reason, coalesce(owner_replica, '') AS owner,
			run_id = $1 AS same
		FROM turns WHERE run_id = $1 OR (session_key = $2 AND state = 'running' AND owner_epoch IS NOT NULL)
		ORDER BY run_id = $1 DESC LIMIT 1),
	free AS (SELECT 1 FROM leases WHERE epoch = $6 AND expires_at > now() AND NOT EXISTS (SELECT FROM held) FOR KEY SHARE),
	sess AS (INSERT INTO sessions (key, created_at, updated_at) SELECT $2, now(), now() FROM free
		WHERE NOT EXISTS (SELECT FROM sessions WHERE key = $2) ON CONFLICT (key) DO NOTHING),
	turn AS (INSERT INTO turns (run_id, session_key, channel, chat_ref, state, started_at, updated_at, owner_replica, owner_epoch,
			deadline_at, ceiling_at, step_timeout_ns, sender)
		SELECT $1, $2, $3, $4, 'running', now(), now(), $5, $6, $9, $10, $11, $12 FROM free ON CONFLICT DO NOTHING RETURNING run_id),
	msg AS (INSERT INTO messages (session_key, run_id, role, text, created_at)
		SELECT $2, $1, 'user', $7, now() FROM turn WHERE $7 <> ''),
	dq AS (DELETE FROM queued WHERE run_id = ANY($8) AND EXISTS (SELECT FROM turn)),
	prev AS (SELECT coalesce(owner_replica = $5 AND owner_epoch = $6 AND state <> 'running'
			AND stop_reason <> 'interrupted', false) AS mine
		FROM turns WHERE EXISTS (SELECT FROM turn) AND session_key = $2 AND run_id <> $1 ORDER BY started_at DESC LIMIT 1)
SELECT set_config('synchronous_commit', 'on', true) IS NOT NULL, EXISTS (SELECT FROM free), EXISTS (SELECT FROM turn),
	coalesce((SELECT mine FROM prev), false),
	held.run_id, held.session_key, held.state, held.stop_reason, held.owner, held.same
FROM (SELECT) AS one LEFT JOIN held ON true`

// insertClaim writes the claim in one statement (claimSQL); won false (and
// nothing written) when the turn lost to one committed after the
// statement's snapshot. A turn c runs into is returned as *BusyError or
// *DuplicateError, a lease that is gone as an error wrapping ErrFenced (it
// fences the replica).
func (r *Replica) insertClaim(ctx context.Context, c Claim) (won, prevMine bool, err error) {
	err = postgres.RetryConflicts(ctx, func() error {
		var sync, leaseOK bool
		var runID, session, state, reason, owner *string
		var same *bool
		deadline, ceiling, stepTimeout, sender := c.Limits.Args()
		err := r.group.queryRow(ctx, claimSQL, []any{c.RunID, c.SessionKey, c.Channel, c.ChatRef, r.id, r.epoch, c.Text,
			append([]string{c.RunID}, c.Joined...), deadline, ceiling, stepTimeout, sender}, &sync, &leaseOK, &won, &prevMine,
			&runID, &session, &state, &reason, &owner, &same)
		switch {
		case err != nil:
			return err
		case runID != nil && *same:
			return &DuplicateError{RunID: *runID, SessionKey: *session, State: store.TurnState(*state),
				StopReason: event.StopReason(*reason), Replica: *owner}
		case runID != nil:
			return &BusyError{SessionKey: *session, HolderRunID: *runID, HolderReplica: *owner}
		case !leaseOK:
			lost := fmt.Errorf("%w: %w", ErrFenced, fmt.Errorf("lease of %s: %w", r.Owner(), ErrLeaseLost))
			r.fence(lost)
			return fencedClaim{fmt.Errorf("claim run %q: %w", c.RunID, lost)}
		}
		return nil
	})
	if err != nil {
		return false, false, err
	}
	if won && testHookClaimCommitted != nil {
		return false, false, testHookClaimCommitted()
	}
	return won, prevMine, nil
}

// readBackTimeout bounds the read that decides an ambiguous claim.
const readBackTimeout = 5 * time.Second

// testHookClaimCommitted, set by tests, runs after a claim committed; its
// error is returned as if the commit's answer had been lost.
var testHookClaimCommitted func() error

// claimCommitted reports whether c's turn is in the database, running under
// this replica's epoch: the claim whose answer was an error committed. It
// reads on ctx's values but not its cancellation (a request cancelled
// mid-COMMIT is the case it decides), bounded by readBackTimeout. false
// when the read fails too: the claim stays unanswered.
func (r *Replica) claimCommitted(ctx context.Context, c Claim) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readBackTimeout)
	defer cancel()
	var mine bool
	err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM turns
		WHERE run_id = $1 AND session_key = $2 AND state = 'running' AND owner_epoch = $3)`,
		c.RunID, c.SessionKey, r.epoch).Scan(&mine)
	if err != nil {
		r.log.Error("a claim's answer was lost and reading it back failed; its session may stay busy until this replica's lease is taken over",
			"run", c.RunID, "session", c.SessionKey, "err", err)
		return false
	}
	return mine
}

// inTx runs fn in a transaction committed with synchronous_commit on, run
// again on a conflict (postgres.RetryConflicts).
func (r *Replica) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return postgres.RetryConflicts(ctx, func() error { return r.inTxOnce(ctx, fn) })
}

func (r *Replica) inTxOnce(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
			return err
		}
		return fn(tx)
	})
}

// Finish ends this replica's turn ev.RunID with ev, its terminal event
// (event.Finished or event.Aborted, its words rendered as the engine
// publishes it), in one transaction committed durably: the turn's state,
// stop reason and steps; the assistant message store.EndingOf says; for an
// outbox channel (Options.OutboxChannels, with a chat reference) the rows
// store.EndingOutbox says. Call it before publishing ev.
//
// It matches only the turn still running under this replica's epoch, while
// the epoch's lease is valid on the database's clock; otherwise it writes
// nothing and returns an error wrapping ErrStale (and ErrFenced when the
// replica is fenced): a survivor has ended the turn as interrupted, or will
// — publish nothing. An unknown run id wraps store.ErrNotFound.
func (r *Replica) Finish(ctx context.Context, ev event.Event) error {
	return r.finish(ctx, ev, true)
}

// finish is Finish; tests pass checkFence false to show that the database
// refuses a stale owner by itself.
func (r *Replica) finish(ctx context.Context, ev event.Event, checkFence bool) error {
	if ev.Kind != event.Finished && ev.Kind != event.Aborted || ev.RunID == "" {
		return fmt.Errorf("finish: %s event of run %q is not an ending: %w", ev.Kind, ev.RunID, store.ErrInvalid)
	}
	if err := r.live(); err != nil && checkFence {
		if r.committedBefore(ctx, ev) {
			return nil
		}
		return fmt.Errorf("finish run %q: %w (%w)", ev.RunID, ErrStale, err)
	}
	end := store.EndingOf(&ev, ev.Time)
	ck, cn, cq := store.StepColumns(end.Current)
	lk, ln, lq := store.StepColumns(ev.LastStep)
	out := store.EndingOutbox(&ev) // its channel and chat are the turn row's
	kinds, texts := make([]string, len(out)), make([]string, len(out))
	for i, m := range out {
		kinds[i], texts[i] = string(m.Kind), m.Text
	}
	var leaseOK bool
	var session, channel, chatRef *string
	err := postgres.RetryConflicts(ctx, func() error {
		var sync bool
		return r.group.queryRow(ctx, finishSQL, []any{ev.RunID, string(end.State), string(ev.StopReason), ck, cn, cq, lk, ln, lq, r.epoch,
			kinds, texts, r.opts.OutboxChannels, end.Text}, &sync, &leaseOK, &session, &channel, &chatRef)
	})
	switch {
	case err != nil:
		return fmt.Errorf("finish run %q: %w", ev.RunID, err)
	case !leaseOK:
		lost := fmt.Errorf("%w: %w", ErrFenced, fmt.Errorf("lease of %s: %w", r.Owner(), ErrLeaseLost))
		r.fence(lost)
		if r.committedBefore(ctx, ev) {
			return nil
		}
		return fmt.Errorf("finish run %q: %w (%w)", ev.RunID, ErrStale, lost)
	case session == nil:
		if err := r.whyNotMine(ctx, r.pool, ev); err != nil {
			return fmt.Errorf("finish run %q: %w", ev.RunID, err)
		}
		return nil
	}
	if r.outbox[*channel] && *chatRef != "" && len(out) > 0 && r.opts.OnOutbox != nil {
		r.opts.OnOutbox(*channel)
	}
	return nil
}

// finishSQL is a Finish in one statement, one round trip and one commit
// (issue 21): it locks this epoch's lease FOR KEY SHARE if it has not
// expired on the database's clock ($10) and only then ends the turn still
// running under the epoch ($1: state, stop reason, steps), and for the
// turn it ended inserts the terminal messages ($11 kinds, $12 texts) into
// the outbox when the turn's channel is one of $13 and it has a chat
// reference, and the assistant message ($14, none when "") into the
// history. It leaves the sessions row alone (the recorder's ending updates
// it). synchronous_commit is on for its transaction, as claimSQL's.
const finishSQL = `WITH lease AS (SELECT 1 FROM leases WHERE epoch = $10 AND expires_at > now() FOR KEY SHARE),
	t AS (UPDATE turns SET state = $2, stop_reason = $3, updated_at = now(), ended_at = now(),
			step_kind = $4, step_name = $5, step_seq = $6,
			last_step_kind = coalesce($7, last_step_kind), last_step_name = coalesce($8, last_step_name),
			last_step_seq = coalesce($9, last_step_seq)
		WHERE run_id = $1 AND state = 'running' AND owner_epoch = $10 AND EXISTS (SELECT FROM lease)
		RETURNING session_key, channel, chat_ref),
	o AS (INSERT INTO outbox (channel, chat_ref, run_id, kind, text, created_at)
		SELECT t.channel, t.chat_ref, $1, m.kind, m.text, now() FROM t, unnest($11::text[], $12::text[]) AS m (kind, text)
		WHERE t.chat_ref <> '' AND t.channel = ANY ($13::text[])
		ON CONFLICT (run_id, kind) DO NOTHING),
	m AS (INSERT INTO messages (session_key, run_id, role, text, stop_reason, created_at)
		SELECT t.session_key, $1, 'assistant', $14, $3, now() FROM t WHERE $14 <> '')
SELECT set_config('synchronous_commit', 'on', true) IS NOT NULL, EXISTS (SELECT FROM lease), t.session_key, t.channel, t.chat_ref
FROM (SELECT) AS one LEFT JOIN t ON true`

// committedBefore reports whether an earlier attempt of this epoch at the
// same ending committed (its answer was lost) — asked when the replica is
// fenced before the retry could write: the ending is recorded, so it must
// be published (a survivor takes over only running turns, so no one else
// would end it for the watchers). A fenced replica may read: the database
// is the truth either way.
func (r *Replica) committedBefore(ctx context.Context, ev event.Event) bool {
	return r.whyNotMine(ctx, r.pool, ev) == nil
}

// querier is what whyNotMine reads through: a transaction or the pool.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// whyNotMine explains a Finish of ev that matched no row: store.ErrNotFound,
// ErrStale with the turn's state and owner — or nil when the row shows that
// this epoch's own earlier attempt at the same ending committed (its answer
// was lost: a timeout, a dropped connection), so the retry is done: the
// ending is recorded once and must be published. A takeover's end is never
// mistaken for it: it is stop reason interrupted, which no Finish of a live
// owner records (a fenced replica's Finish is refused before it gets here).
func (r *Replica) whyNotMine(ctx context.Context, tx querier, ev event.Event) error {
	runID := ev.RunID
	var state, reason, owner string
	var epoch *int64
	err := tx.QueryRow(ctx, `SELECT state, stop_reason, coalesce(owner_replica, ''), owner_epoch FROM turns WHERE run_id = $1`,
		runID).Scan(&state, &reason, &owner, &epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("read the turn: %w", err)
	}
	if state == string(store.TurnRunning) {
		return fmt.Errorf("%w: the turn runs under replica %q epoch %v, not %s", ErrStale, owner, deref(epoch), r.Owner())
	}
	if epoch != nil && *epoch == r.epoch && reason == string(ev.StopReason) && ev.StopReason != event.ReasonInterrupted {
		return nil // this epoch's own ending, committed by an attempt whose answer was lost
	}
	return fmt.Errorf("%w: the turn already ended (%s, %s)", ErrStale, state, reason)
}

func deref(p *int64) any {
	if p == nil {
		return "none"
	}
	return *p
}
