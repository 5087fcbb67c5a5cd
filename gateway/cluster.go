// The Cluster interface the engine runs on with several replicas (claims,
// endings, fencing, forwarding), its requests and the errors it answers.

package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/turnguard/turnguard/event"
)

// Cluster is the engine's seam to the other replicas of a scaled-out
// gateway (Options.Cluster, cluster.enabled). nil — the default — is the
// one-process gateway: the engine's own session map decides who is busy,
// a turn's end is recorded by the store's asynchronous event writer, and
// nothing leaves the process.
//
// With a Cluster the engine keeps running its own turns exactly as before
// (its scheduler, heap and abort registry stay local and exact), and asks
// the Cluster at four points:
//
//   - Claim, before it starts a turn in a session that is free here: the
//     session must be free on every replica, and the run id new on every
//     replica;
//   - Finish, with the terminal event of a turn it claimed, before any
//     subscriber sees it: the end is recorded durably once, and a replica
//     that is no longer the turn's owner (it was fenced, a survivor took the
//     turn over) learns it and publishes nothing;
//   - Forward, for a message whose session another replica runs: that
//     replica's engine handles it with its own busy mode, as if the client
//     had sent it there;
//   - Holder and ForwardAbort, for an abort of a run that is not here;
//   - ForwardResolve, for an answer to a question asked on another replica;
//   - ForwardStop, for a /stop of a session whose turn and queue are elsewhere;
//   - ForwardStatus, for what a session runs, queues and asks now when its
//     turn is elsewhere (Engine.StatusOf: one view from every replica).
//
// Export carries every published event to the other replicas' watchers;
// Import is how a channel (the WebSocket server) follows the sessions whose
// turns run elsewhere. The implementations are cluster/inproc (several
// engines in one process: tests) and cluster/node (PostgreSQL decides,
// NATS JetStream carries); cluster/clustertest is the suite both pass.
//
// Every method is safe for concurrent use. The engine never calls Claim,
// Finish, Forward, Holder or ForwardAbort with its own lock held; it calls
// Export from its publisher (serialised per run by its Publish: it must not
// block).
type Cluster interface {
	// Replica is this replica's name, as HeldError.Replica and Holder
	// report it.
	Replica() string
	// Claim reserves c.SessionKey for run c.RunID on every replica, and
	// records c.Text as the user's message of the session's history.
	// Errors: *HeldError (the session runs a turn, here or elsewhere),
	// *RunExistsError (the run id is known: running or ended), or an error
	// wrapping ErrClusterUnavailable (fenced — then also ErrLeaseLost — or
	// the database cannot be reached: retryable). Any error but the first
	// three may hide a claim that committed with its answer lost (a
	// request cancelled mid-COMMIT whose own read-back failed too): the
	// engine reads it back with Holder, and a session held for c.RunID on
	// this replica is its claim.
	Claim(ctx context.Context, c ClaimRequest) error
	// Finish records ev, the terminal event (Finished or Aborted) of a
	// turn this replica claimed: the turn's end, its history message and
	// its outbox rows, at once. An error wrapping ErrNotTurnOwner means the
	// turn is no longer this replica's: its end is someone else's to
	// write, and ev must not be published. Any other error is transient
	// (the caller retries): the same ending again after an attempt whose
	// answer was lost (it had committed) is done, not refused.
	Finish(ctx context.Context, ev event.Event) error
	// Holder returns the run running sessionKey's turn and the replica that
	// owns it; ok is false when the session is free everywhere.
	Holder(ctx context.Context, sessionKey string) (runID, replica string, ok bool, err error)
	// Forward hands req to replica's engine (Engine.Send with
	// req.Forwarded set) and returns its answer; errors the engine
	// returned come back as the same types (*BusyError, *QueueFullError,
	// ErrTooLong …) with the same words, as far as callers branch on
	// them. A replica that cannot be reached (gone, not serving, ctx's
	// deadline passed first) is an error wrapping ErrClusterUnavailable.
	Forward(ctx context.Context, replica string, req SendRequest) (Ack, error)
	// ForwardAbort asks replica's engine to abort (Engine.Abort) and
	// returns once that replica published the Aborted event, or failed.
	ForwardAbort(ctx context.Context, replica string, req AbortRequest) (AbortResult, error)
	// ForwardResolve asks replica's engine to settle a question
	// (Engine.Resolve, with req.Forwarded set) and returns its answer,
	// errors as Resolve's (ErrApprovalNotFound …).
	ForwardResolve(ctx context.Context, replica string, req ResolveRequest) (ResolveResult, error)
	// ForwardStop asks replica's engine to carry out a /stop
	// (Engine.StopWith, with req.Forwarded set): abort the session's turn
	// and drop its queue there. Errors as Stop's (ErrNotOwner …).
	ForwardStop(ctx context.Context, replica string, req StopRequest) (StopResult, error)
	// ForwardStatus asks replica's engine for its Status of sessionKey
	// (the running turn, its reply so far, its queue and open questions)
	// and returns it whole. A replica that cannot be reached is an error
	// wrapping ErrClusterUnavailable.
	ForwardStatus(ctx context.Context, replica, sessionKey string) (TurnStatus, error)
	// Export hands an event this replica published to the other replicas'
	// Import handlers. It never blocks: an event it cannot carry is
	// reported to the watchers as a gap, never skipped silently.
	Export(ev event.Event)
	// Import calls h with every event another replica exports, in each
	// session's order, and gap with a session whose events it could not
	// deliver in order (the watcher must reload that session's history).
	// It also delivers the Aborted event (stop reason interrupted) of each
	// turn a takeover ended, on every replica — the one that took the turn
	// over included, since its engine never ran it. This replica's own
	// exports never come back. h is called from one goroutine at a time
	// and must not block. stop ends it; no call follows its return.
	Import(h event.Handler, gap func(sessionKey string)) (stop func())
}

// ClaimRequest is a turn the engine asks Cluster.Claim to reserve.
type ClaimRequest struct {
	RunID      string
	SessionKey string
	Channel    string
	ChatRef    string
	Text       string   // the user's message ("" when it is already in the history)
	Joined     []string // run ids of the queued messages this turn runs (collect)
	// The turn's limits and sender, as its TurnStarted will carry them:
	// the claim writes them with the turn (issue 21).
	Deadline    time.Time
	Ceiling     time.Time // zero: none
	StepTimeout time.Duration
	Sender      string
}

// AbortRequest is an abort forwarded to the replica that runs the turn
// (the arguments of Engine.Abort).
type AbortRequest struct {
	SessionKey string
	RunID      string
	Reason     event.StopReason
	Requester  string
	Operator   bool
}

// The errors a Cluster returns that the engine branches on.
var (
	// ErrClusterUnavailable: the cluster cannot decide now (the database
	// or NATS is down, or this replica is fenced). Nothing was done; the
	// client may retry.
	ErrClusterUnavailable = errors.New("the cluster cannot take turns right now")
	// ErrNotTurnOwner: Finish found the turn is not this replica's any
	// more (fenced; taken over as interrupted by a survivor).
	ErrNotTurnOwner = errors.New("this replica no longer owns the turn")
	// ErrLeaseLost: Claim was refused because this replica lost its lease
	// (it is fenced, whether or not the engine was told yet: Fenced). It
	// wraps ErrClusterUnavailable. What the engine held under that lease is
	// the survivor's now: a queued message whose claim gets it is dropped
	// here without a word.
	ErrLeaseLost = fmt.Errorf("%w: this replica lost its lease", ErrClusterUnavailable)
)

// HeldError is Claim's answer for a session that runs a turn.
type HeldError struct {
	SessionKey string
	RunID      string // the running turn
	Replica    string // the replica that runs it
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("session %q runs turn %s on replica %s", e.SessionKey, e.RunID, e.Replica)
}

// RunExistsError is Claim's answer for a run id the cluster knows.
type RunExistsError struct {
	RunID      string
	SessionKey string
	Running    bool             // still running (on Replica)
	Replica    string           // its owner
	Outcome    *Outcome         // how it ended, when it did and the cluster knows
	StopReason event.StopReason // "" while running
}

func (e *RunExistsError) Error() string {
	if e.Running {
		return fmt.Sprintf("run %s is running on replica %s", e.RunID, e.Replica)
	}
	return fmt.Sprintf("run %s already ran (%s)", e.RunID, e.StopReason)
}
