package main

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnguard/turnguard/cluster/busauth"
	"github.com/turnguard/turnguard/cluster/node"
	"github.com/turnguard/turnguard/cluster/pgcoord"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/store"

	"github.com/turnguard/turnguard/internal/pgtest"
)

var _ tgCluster = (*node.Node)(nil)

// fakeNode is the part of cluster/node's Node the Telegram channel uses.
type fakeNode struct {
	coord *atomic.Pointer[pgcoord.Replica]
	key   *busauth.Key
}

func (n fakeNode) Key() *busauth.Key { return n.key }

func (fakeNode) Conn() *nats.Conn { return nil }
func (fakeNode) Lead(context.Context, string, time.Duration, func(context.Context)) error {
	return nil
}
func (n fakeNode) Coordinator() *pgcoord.Replica { return n.coord.Load() }

// TestTelegramClusterOptions: a replica's Telegram channel polls under a
// lease of cluster.leaseSeconds, names itself by the replica id, claims
// the outbox through the replica's coordinator, and keeps three copies of
// the update stream in a three-node NATS cluster (one otherwise).
func TestTelegramClusterOptions(t *testing.T) {
	if got := telegramCluster(config.Default(), nil); got != nil {
		t.Errorf("one process: %+v, want no cluster", got)
	}
	url := pgtest.New(t)
	join := func() *pgcoord.Replica {
		t.Helper()
		coord, err := pgcoord.JoinURL(context.Background(), url, pgcoord.Options{ReplicaID: "host-a.example-42", Lease: 3 * time.Second,
			Notice: func(store.Turn) string { return "interrupted" }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = coord.Leave(context.Background()) })
		return coord
	}
	key, err := busauth.New([]byte("gateway-test-cluster-secret-0123456789"), "host-a.example-42")
	if err != nil {
		t.Fatal(err)
	}
	n := fakeNode{coord: new(atomic.Pointer[pgcoord.Replica]), key: key}
	n.coord.Store(join())
	for _, tc := range []struct {
		urls     []string
		lease    float64
		replicas int
		ttl      time.Duration
	}{
		{[]string{"nats://a:4222"}, 3, 1, 3 * time.Second},
		{[]string{"nats://a:4222", "nats://b:4222", "nats://c:4222"}, 1, 3, time.Second},
	} {
		cfg := config.Default()
		cfg.Cluster.Enabled, cfg.Cluster.NATS.URLs, cfg.Cluster.LeaseSeconds = true, tc.urls, tc.lease
		cl := telegramCluster(cfg, n)
		if cl.ReplicaID != "host-a.example-42" || cl.Leader == nil {
			t.Errorf("replica %q, leader %v; want the coordinator's id and the node as leader", cl.ReplicaID, cl.Leader)
		}
		if cl.PollerTTL != tc.ttl || cl.Updates.Replicas != tc.replicas {
			t.Errorf("%d URLs, leaseSeconds %v: poller TTL %v, stream copies %d; want %v, %d", len(tc.urls), tc.lease, cl.PollerTTL, cl.Updates.Replicas, tc.ttl, tc.replicas)
		}
		if cl.Updates.Sign == nil || cl.Updates.Verify == nil {
			t.Error("the update stream is neither signed nor verified: anyone who can publish there forges updates")
		}
		if cl.Consumer.MemberTTL < 2*time.Second || cl.Consumer.PinnedTTL < 2*time.Second {
			t.Errorf("consumer TTLs %v / %v below the consumer's 2 s floor", cl.Consumer.MemberTTL, cl.Consumer.PinnedTTL)
		}
	}

	// A fenced replica joins again as a new epoch: the channel claims
	// through the new one.
	cl := telegramCluster(config.Default(), n)
	ctx := context.Background()
	if err := n.coord.Load().Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Claims.ClaimOutbox(ctx, config.ChannelTelegram, 10, time.Minute); err == nil {
		t.Fatal("claimed through a coordinator that left")
	}
	n.coord.Store(join())
	if _, err := cl.Claims.ClaimOutbox(ctx, config.ChannelTelegram, 10, time.Minute); err != nil {
		t.Errorf("claim after joining again: %v", err)
	}
}
