package node

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnguard/turnguard/cluster/lease"
)

// leaseName is what a leader lease may be called: it names a KV bucket.
var leaseName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Lead runs fn while this replica holds the leader lease name (cluster/lease:
// a key in the JetStream bucket TG_LEASE_<name>, whose keys live ttl
// after their holder's last renewal), so that among the replicas that Lead
// one name, one runs fn at a time. fn's ctx ends when the lease is lost
// (before the key can expire, so before anyone else can take it) or when
// ctx ends; once fn has returned the lease is given up, and Lead campaigns
// again, until ctx ends (then it returns nil). It returns an error only
// when the bucket cannot be set up. Cancel ctx before Close.
func (n *Node) Lead(ctx context.Context, name string, ttl time.Duration, fn func(ctx context.Context)) error {
	if !leaseName.MatchString(name) {
		return fmt.Errorf("lead %q: a lease name is letters, digits, - and _", name)
	}
	js, err := jetstream.New(n.nc)
	if err != nil {
		return fmt.Errorf("lead %q: %w", name, err)
	}
	kv, err := lease.EnsureBucket(ctx, js, lease.BucketConfig{Bucket: "TG_LEASE_" + name, TTL: ttl, Replicas: n.opts.StreamReplicas})
	if err != nil {
		return fmt.Errorf("lead %q: %w", name, err)
	}
	log := n.log.With("lease", name)
	for ctx.Err() == nil {
		// The campaign outlives ctx until fn has returned: the key is
		// given up only then, so the next leader never overlaps fn.
		round, endRound := context.WithCancel(context.WithoutCancel(ctx))
		cand, err := lease.Campaign(round, kv, name, n.opts.ReplicaID, lease.Options{OnError: func(err error) {
			log.Warn("cluster: leader lease", "error", err)
		}})
		if err != nil {
			endRound()
			return fmt.Errorf("lead %q: %w", name, err)
		}
		if term, err := cand.Await(ctx); err == nil {
			log.Info("cluster: leading")
			run, stop := context.WithCancel(ctx)
			go func() {
				select {
				case <-term.Lost():
					log.Warn("cluster: leadership lost", "error", term.Err())
					stop()
				case <-run.Done():
				}
			}()
			fn(run)
			stop()
		}
		endRound()
		<-cand.Done()
		if ctx.Err() == nil { // fn returned by itself, or the lease was lost: let another try first
			select {
			case <-ctx.Done():
			case <-time.After(ttl / 10):
			}
		}
	}
	return nil
}
