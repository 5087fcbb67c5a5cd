// Package jsstream owns creating JetStream streams, consumers and buckets
// the way every replica of a starting cluster can do it at once: create
// first, update only what exists with another configuration, and wait out
// the moments when the NATS cluster cannot place it yet (a peer not caught
// up, no meta leader) instead of failing the replica's start-up. It is a
// mechanism: it imports nothing of turnguard's.
package jsstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream error codes that say "not now" rather than "no": the cluster
// cannot place the replicas yet, or has no meta leader.
const (
	codeNoPeers      jetstream.ErrorCode = 10005 // "no suitable peers for placement"
	codeNotAvailable jetstream.ErrorCode = 10008 // "JetStream system temporarily unavailable"
	codeNotLeader    jetstream.ErrorCode = 10009 // "JetStream cluster not leader"
)

// Backoff bounds the wait between attempts: it starts at the first value
// and doubles up to the second.
var Backoff = [2]time.Duration{50 * time.Millisecond, time.Second}

// Stream creates the stream sc, or updates it to sc when a stream of that
// name exists (see Ensure).
func Stream(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig) (jetstream.Stream, error) {
	return Ensure(ctx,
		func(ctx context.Context) (jetstream.Stream, error) { return js.CreateStream(ctx, sc) },
		func(ctx context.Context) (jetstream.Stream, error) { return js.UpdateStream(ctx, sc) },
		jetstream.ErrStreamNameAlreadyInUse)
}

// Consumer creates the durable consumer cc on s, or updates it (see
// Ensure).
func Consumer(ctx context.Context, s jetstream.Stream, cc jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	return Ensure(ctx,
		func(ctx context.Context) (jetstream.Consumer, error) { return s.CreateConsumer(ctx, cc) },
		func(ctx context.Context) (jetstream.Consumer, error) { return s.UpdateConsumer(ctx, cc) },
		jetstream.ErrConsumerExists)
}

// KeyValue creates the bucket kc, or updates it (see Ensure).
func KeyValue(ctx context.Context, js jetstream.JetStream, kc jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return Ensure(ctx,
		func(ctx context.Context) (jetstream.KeyValue, error) { return js.CreateKeyValue(ctx, kc) },
		func(ctx context.Context) (jetstream.KeyValue, error) { return js.UpdateKeyValue(ctx, kc) },
		jetstream.ErrBucketExists)
}

// Ensure calls create, and update when create fails with exists. Replicas
// starting together all create: concurrent creations with one
// configuration all succeed, whereas concurrent CreateOrUpdate calls (an
// update first) have left all but one unanswered until their timeout on a
// nats-server 2.x cluster.
//
// A transient refusal (Transient) is retried with backoff until ctx ends;
// the error then returned is the last refusal, wrapped with the number of
// attempts. Any other error is returned at once, unwrapped.
func Ensure[T any](ctx context.Context, create, update func(context.Context) (T, error), exists error) (T, error) {
	wait := Backoff[0]
	for attempt := 1; ; attempt++ {
		v, err := create(ctx)
		if errors.Is(err, exists) {
			v, err = update(ctx)
		}
		if err == nil || !Transient(err) {
			return v, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			var zero T
			return zero, fmt.Errorf("after %d attempts: %w", attempt, err)
		case <-t.C:
		}
		wait = min(2*wait, Backoff[1])
	}
}

// Transient reports whether err is JetStream saying it cannot do it yet:
// no peers to place replicas on, the system temporarily unavailable, no
// meta leader, no JetStream answering yet, or a request that timed out
// while the cluster formed.
func Transient(err error) bool {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case codeNoPeers, codeNotAvailable, codeNotLeader:
			return true
		}
		return false
	}
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout)
}
