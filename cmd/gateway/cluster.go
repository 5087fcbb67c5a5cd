package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/turnguard/turnguard/cluster/busauth"
	"github.com/turnguard/turnguard/cluster/node"
	"github.com/turnguard/turnguard/cluster/pgcoord"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"
)

// clusterLeaveWait bounds giving the lease back at shutdown (survivors then
// need not wait for it to expire).
const clusterLeaveWait = 5 * time.Second

// replicaID is cluster.replicaID, or host name and process id.
func replicaID(cfg *config.Config) string {
	if id := cfg.Cluster.ReplicaID; id != "" {
		return id
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "gateway"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// joinCluster makes this gateway a replica (cluster.enabled): it joins the
// lease table, connects to NATS and takes over the turns of replicas that
// died. The engine gets it as its Cluster; forwarded messages and aborts
// are served once the engine exists (serveCluster).
func (a *app) joinCluster(ctx context.Context, cfg *config.Config) error {
	if !cfg.Cluster.Enabled {
		return nil
	}
	msgs := cfg.MessageSet()
	id := replicaID(cfg)
	secret, err := cfg.Cluster.ClusterSecret()
	if err != nil {
		return fmt.Errorf("cluster (cluster.enabled): %w", err)
	}
	key, err := busauth.New(secret, id)
	if err != nil {
		return fmt.Errorf("cluster (cluster.enabled): %w", err)
	}
	nc := cfg.Cluster.NATS
	if !nc.HasCredentials() {
		// Validation let it through: insecureTrustedNetwork said so.
		a.log.Warn("cluster: NATS without credentials (cluster.nats.insecureTrustedNetwork: true): every process that can reach NATS " +
			"can connect, read every chat's events and publish where the replicas do; only the cluster secret stands between it and " +
			"acting as a replica. Run NATS with credentials unless this network is private and every process on it trusted")
	}
	n, err := node.Start(ctx, node.Options{
		DatabaseURL: cfg.Store.URL,
		NATSURLs:    nc.URLs,
		NATS: node.NATSAuth{CredsFile: nc.CredsFile, NKeySeedFile: nc.NKeySeedFile, User: nc.User, Password: nc.Password,
			CAFile: nc.TLS.CAFile, CertFile: nc.TLS.CertFile, KeyFile: nc.TLS.KeyFile},
		Auth:           key,
		ReplicaID:      id,
		Lease:          time.Duration(cfg.Cluster.LeaseSeconds * float64(time.Second)),
		OutboxChannels: outboxChannels(cfg),
		OnOutbox:       a.outboxWritten,
		Notice:         func(t store.Turn) string { return interruptedNotice(msgs, t) },
		Resume:         takeoverResume(a.cfg, a.ops.metrics.ResumeDecision),
		OnFenced:       a.fenced,
		OnTakeover: func(t pgcoord.Takeover) {
			a.log.Warn("took over the turns of a replica that stopped renewing its lease", takeoverAttrs(t)...)
			a.telegramTookOver(t) // their Telegram notices go out at once
			if !t.More {
				// After the last batch: the sessions of the later
				// batches were still held by the dead replica's turns.
				a.restoreTakenQueues(t)
			}
		},
		Logger: a.log.With("cluster", "node"),
		Claims: claimsOf(a.store),
	})
	if err != nil {
		return fmt.Errorf("cluster (cluster.enabled): %w", scrubbed(err, cfg.Secrets()))
	}
	a.node = n
	a.log.Info("joined the cluster", "replica", n.Replica(), "lease_seconds", cfg.Cluster.LeaseSeconds)
	return nil
}

// fenced is told that this replica lost its lease (it could not renew it
// in time: the database was unreachable, or the process was stopped): its
// runs stop and publish nothing — a survivor ends them as interrupted and
// tells their users. The replica keeps serving with a new lease (the node
// joins again) for turns that start from now on.
func (a *app) fenced(err error) {
	a.log.Error("this replica lost its cluster lease: its running turns stop here and are ended by another replica", "err", err)
	if eng := a.live.Load(); eng != nil {
		eng.Fenced()
	}
}

// restoreTakenQueues runs the stored queued messages a replica this one
// just took over had queued in its memory. Which those are the store does
// not say, and they are not only in the sessions of the turns it took
// over: a replica that dies between a turn's recorded ending and its next
// queued message's claim runs no turn of that session (issue 20, found by
// TestLifecycleModelCluster: those messages stayed stored until a
// restart). So every stored queued message is restored
// (Engine.RestoreQueued): one a live replica has queued is recognised by
// its run id (it answers it as queued), or claimed here first, and the
// live replica then hands its copy over or forgets it — a message runs
// once whichever replica restores it. Before the engine runs, start's own
// restore does it.
func (a *app) restoreTakenQueues(pgcoord.Takeover) {
	eng := a.live.Load()
	if eng == nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), startupStoreWait)
		defer cancel()
		if err := eng.RestoreQueued(ctx); err != nil {
			a.log.Error("cannot restore the messages a dead replica had queued; they stay stored", "err", err)
		}
	}()
}

// outboxWritten is told that the store or the cluster put Telegram endings
// into the outbox: the channel claims them.
func (a *app) outboxWritten(string) {
	if ch := a.tgClaim.Load(); ch != nil {
		ch.Claim()
	}
}

// leaveCluster gives the lease back (after the engine's shutdown wrote
// every ending) and disconnects.
func (a *app) leaveCluster() {
	if a.node == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterLeaveWait)
	defer cancel()
	if err := a.node.Close(ctx); err != nil {
		a.log.Warn("leaving the cluster", "err", err)
	}
}

// interruptedNotice is the words of a turn cut off by its replica's death
// (or the last stop): the same text crash recovery gives.
func interruptedNotice(msgs *messages.Set, t store.Turn) string {
	return messages.Render(msgs, event.Event{Kind: event.Aborted, StopReason: event.ReasonInterrupted,
		Elapsed: t.UpdatedAt.Sub(t.StartedAt), Step: t.CurrentStep, LastStep: t.LastStep, StepTimeout: t.StepTimeout})
}

// maxLoggedRuns bounds the run ids a takeover's log line lists.
const maxLoggedRuns = 10

// takeoverAttrs are the log fields of a takeover: the replica and epoch it
// took over, how late, how many turns and (the first maxLoggedRuns of)
// their run ids, and more=true on a batch that more of its turns follow —
// not the struct, whose %v dump carried every notice.
func takeoverAttrs(t pgcoord.Takeover) []any {
	runs := make([]string, 0, min(len(t.Turns), maxLoggedRuns))
	for _, tt := range t.Turns[:min(len(t.Turns), maxLoggedRuns)] {
		runs = append(runs, tt.RunID)
	}
	attrs := []any{"from_replica", t.Replica, "from_epoch", t.Epoch, "overdue_ms", t.Overdue.Milliseconds(),
		"turns", len(t.Turns), "runs", strings.Join(runs, ",")}
	if t.More {
		attrs = append(attrs, "more", true) // one batch of a large takeover; more of its turns follow
	}
	return attrs
}

// claimsOf is where the replica's claims tell the store's recorder about
// them (postgres.Store.Claims); nil for another store.
func claimsOf(s store.Backend) *postgres.Claims {
	if ps, ok := s.(*postgres.Store); ok {
		return ps.Claims()
	}
	return nil
}
