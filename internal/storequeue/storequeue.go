// Package storequeue adapts the store's durable queue (store.Queue) to the
// engine's QueueStore: the gateway's wiring uses it, and so do the
// channels' tests that check what a queued message leaves in the store.
package storequeue

import (
	"context"

	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/store"
)

// Queue is the engine's QueueStore on the store: a message the engine
// queues behind a running turn is committed durably before its sender is
// told "queued", and is still there after a restart.
type Queue struct{ St store.Queue }

var _ gateway.QueueStore = Queue{}

// AddQueued stores m durably (store.Queue.AddQueued).
func (q Queue) AddQueued(ctx context.Context, m gateway.QueuedMessage) error {
	return q.St.AddQueued(ctx, store.QueuedMessage{RunID: m.RunID, SessionKey: m.SessionKey, Channel: m.Channel,
		ChatRef: m.ChatRef, Owner: m.Owner, Text: m.Text, QueuedAt: m.QueuedAt, Timeout: m.Timeout})
}

// RemoveQueued forgets the messages with these run ids.
func (q Queue) RemoveQueued(ctx context.Context, runIDs ...string) error {
	return q.St.RemoveQueued(ctx, runIDs...)
}

// Queued lists every stored queued message, oldest first.
func (q Queue) Queued(ctx context.Context) ([]gateway.QueuedMessage, error) {
	ms, err := q.St.Queued(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]gateway.QueuedMessage, len(ms))
	for i, m := range ms {
		out[i] = gateway.QueuedMessage{RunID: m.RunID, SessionKey: m.SessionKey, Channel: m.Channel,
			ChatRef: m.ChatRef, Owner: m.Owner, Text: m.Text, QueuedAt: m.QueuedAt, Timeout: m.Timeout}
	}
	return out, nil
}
