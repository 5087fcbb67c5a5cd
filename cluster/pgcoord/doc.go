// Package pgcoord owns the cluster's coordination on PostgreSQL: which
// replica is alive (a lease row per replica epoch, judged by the database's
// clock only), which replica runs a session's turn (a claim: the turn's row
// in the store's turns table, owned by a replica epoch, at most one running
// per session cluster-wide), how an owned turn ends (Finish: the end, its
// history message and its outbox rows in one transaction, refused to a
// stale owner), what happens to a dead replica's turns (Survey: a survivor
// ends them as interrupted, with the notice in the history and the outbox,
// in one transaction per dead epoch, or per batch of a large one) and which replica delivers an outbox
// row (ClaimOutbox). It builds on store/postgres's schema (migration 2) and
// imports no gateway package: the interrupted notice's words come from the
// caller (Options.Notice).
//
// # Who calls what
//
// A replica calls Join once at start and keeps the *Replica for as long as
// it runs; every method is safe for concurrent use. The engine calls Claim
// before it accepts a turn, Finish with the turn's terminal event before it
// publishes it, and Survey every Options.SurveyEvery (or sets
// Options.OnTakeover and lets the replica survey by itself). A replica that
// is fenced (Fenced is closed, OnFenced called) must stop its runs and
// publish nothing more of them: their ends are written by the survivor that
// takes its lease over. To run turns again it Joins anew (a new epoch).
//
// # Claims are rows of turns, not a table of their own
//
// A claim is the turn's row in turns with owner_replica and owner_epoch
// set, written by Claim synchronously with the user's message; a partial
// unique index (turns_claimed_session: session_key WHERE state = 'running'
// AND owner_epoch IS NOT NULL) makes a second claim of a busy session fail
// in the database, whatever replica makes it, and the run id being the
// primary key makes idempotency cluster-wide. A separate claims table would
// have needed a second row per turn kept in step with the first by every
// writer (the async recorder writes the turn's row from its TurnStarted,
// possibly after Finish or a takeover ended the claim), and a takeover
// would have had to end both. With one row there is one truth: Turn,
// History and the outbox show what the claim decided. The index only
// covers claimed rows, so the one-process gateway (store/postgres
// Options.Shared false), whose recorder writes turns with no owner, is
// unconstrained and unaffected, and no event batch can ever fail on it.
//
// # An end is written once
//
// The event recorder (store/postgres) never ends a claimed turn and never
// restarts one: its TurnStarted for a claimed row only records the turn's
// limits (the claim wrote the row and the user's message), and its
// Finished/Aborted changes no claimed row (it still journals the event).
// A claimed turn's end is written by exactly one of its owner's Finish or a
// takeover, each a conditional UPDATE of the row while it is running, so
// the reply or notice is in the history and the outbox once — and a stale
// owner's late Finish matches no row (ErrStale). The recorder's
// RunningTurns and MarkInterrupted leave claimed turns alone too, so the
// one-process crash recovery never ends another replica's turn.
//
// # Leases and fencing
//
// Join inserts a lease row with a new epoch (expires_at = now() + lease on
// the database's clock) and supersedes older epochs of the same replica id
// (they expire at once, so a survivor takes their turns over). A goroutine
// renews it every lease/3 (retrying every lease/12 after a failure), always
// as "now() + lease" on the server: the replica never sends a time of its
// own, so wall-clock skew between replicas cannot move a lease. A renewal
// that finds the row gone, expired or superseded fences the replica for
// good (ErrLeaseLost). A replica that has not had a renewal succeed for
// 2/3 of the lease, counted on its own monotonic clock from when that
// renewal was sent (a lower bound on the server's now() that set the
// expiry), fences itself: that is at least lease/3 before any survivor can
// see the lease expired, so it has stopped before anyone takes over (a
// process stopped longer than that — SIGSTOP, a VM pause — fences at once
// when it runs again, before it can finish anything: Finish checks the
// fence first, then the database checks the lease and the owner). A fenced
// replica tries once to expire its lease at once, so survivors do not wait
// for the rest of it. Fencing is final for an epoch.
//
// # Takeover
//
// Survey finds expired leases (expires_at <= now(), the database's clock)
// and ends each epoch's running turns as aborted with stop reason
// interrupted (through the index on owner and epoch: only that epoch's
// rows, never a sweep), appends each notice to its session's history,
// journals it, enqueues it in the outbox for an out-of-band channel
// (UNIQUE (run_id, kind): one notice per run) and deletes the lease. The
// turns are ended in batches of at most takeoverBatch, a transaction each
// holding the lease FOR SHARE and its turns FOR UPDATE SKIP LOCKED, so the
// survivors end batches of one epoch at once, each turn in exactly one;
// each batch goes to OnTakeover (Takeover.More) while the next commits.
// The last transaction holds the lease FOR UPDATE — it waits for every
// batch, claim and finish holding the lease — ends whatever is still
// running and deletes the lease (a small takeover is one Takeover).
// Claim and Finish hold the owner's lease row FOR KEY SHARE and require
// it unexpired, so a claim that commits beside a batch began before the
// expiry, and its turn is ended by that last transaction.
package pgcoord
