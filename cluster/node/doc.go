// Package node owns the production gateway.Cluster of a scaled-out gateway
// (issue 12, cluster.enabled): one replica's membership, built from the
// pieces below it. PostgreSQL decides (cluster/pgcoord: claims, ends,
// leases, takeover of a dead replica's turns), NATS JetStream carries
// (cluster/natsbus: every replica's events to the others' watchers; core
// request/reply: sends and aborts forwarded to the replica that runs a
// session's turn; cluster/lease: a leader per named duty). It maps their
// answers to the gateway's vocabulary — *gateway.HeldError,
// *gateway.RunExistsError, gateway.ErrClusterUnavailable,
// gateway.ErrNotTurnOwner — and carries the engine's own errors across a
// forward with their types and words, so the engine and the channels
// branch on them as on a local answer.
//
// # Lifecycle
//
// Start joins the database (a new lease epoch; the replica surveys for dead
// replicas by itself) and NATS (the event stream, the exporter). A fenced
// replica (Options.OnFenced: stop the runs, publish nothing of them)
// joins again as a new epoch after Options.RejoinAfter, for the turns
// that start from then on; the fenced epoch's turns are a survivor's to
// end, and their late Finish is refused (gateway.ErrNotTurnOwner). Serve
// makes the local engine answer the requests other replicas forward here.
// Close stops answering, leaves the database (the lease ends at once, so
// nobody waits for it to expire), flushes the exporters and closes NATS.
// Finish the engine's turns first (their ends are Finish calls): a turn
// still claimed at Close is ended as interrupted by Leave, and its end is
// exported as a takeover's is.
//
// # What the other replicas see
//
// Export hands every event this replica publishes to the exporter; Import
// watches every session's events and delivers only those the other
// replicas exported (the watcher skips this replica's exporter's frames
// but keeps their place in each session's sequence). A successful Claim
// of a session whose previous turn another replica ran waits (up to 2 s)
// for that turn's last event to reach the stream — its end is recorded
// before it is exported — and then renews the exporter's numbering of the
// session (natsbus AwaitEnded, Renew), so a session whose turns move
// between replicas stays one sequence. When this
// replica takes over a dead one's turns, it exports an Aborted event (stop
// reason interrupted, the notice as its Message) for each through a second
// exporter that its own Import does not skip (numbered after the stream's
// last frame of its session, looked up 32 sessions at a time), so the watchers on every
// replica, this one included, see the turn end; then it calls
// Options.OnTakeover. A fenced replica exports nothing more: its turns'
// ends are the survivor's to publish.
//
// # Forwarding
//
// Forward and ForwardAbort are NATS requests on the target replica's own
// subjects (tgrpc.<hex of the replica id>.send, .abort, .resolve and .stop — not under the
// events' prefix, whose all-sessions watchers subscribe tg.*.*.*), with
// JSON bodies, answered by the target's engine through Serve (each
// request on a goroutine of its own, at most maxServing at once, under
// the time the caller waits). A request that finds no responder is sent
// again for about 310 ms: interest in a replica that has just started
// serving crosses the NATS cluster's routes asynchronously. An error the
// engine returned travels as its kind and fields and comes back as the
// same Go type with the same words; a replica that does not answer (gone,
// not serving, NATS down, the caller's deadline — default
// DefaultForwardTimeout) is an error wrapping gateway.ErrClusterUnavailable.
//
// # Trust
//
// The bus is a trust boundary (issue 19). The node connects with its own
// NATS credentials (Options.NATS) and an inbox prefix of its own
// (busauth.InboxPrefix), so with busauth.ReplicaUser's permissions no
// other client reads its requests or their answers. Every request it
// forwards is signed with Options.Auth (busauth: HMAC-SHA256 under the
// cluster secret, fresh within busauth.Window, nonce checked), and Serve
// hands the engine only requests with a valid signature: the body's
// Operator, Owner, Requester and By are a replica's word, never a
// client's. Refused requests are answered as refused, counted (Refused)
// and logged at most once every refusedLogEvery.
package node
