package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/store"
)

// storeQueue is the engine's QueueStore on the store: a message the engine
// queues behind a running turn is committed durably before its sender is
// told "queued", and is still there after a restart.
type storeQueue struct{ st store.Queue }

var _ gateway.QueueStore = storeQueue{}

func (q storeQueue) AddQueued(ctx context.Context, m gateway.QueuedMessage) error {
	return q.st.AddQueued(ctx, store.QueuedMessage{RunID: m.RunID, SessionKey: m.SessionKey, Channel: m.Channel,
		ChatRef: m.ChatRef, Owner: m.Owner, Text: m.Text, QueuedAt: m.QueuedAt, Timeout: m.Timeout})
}

func (q storeQueue) RemoveQueued(ctx context.Context, runIDs ...string) error {
	return q.st.RemoveQueued(ctx, runIDs...)
}

func (q storeQueue) Queued(ctx context.Context) ([]gateway.QueuedMessage, error) {
	ms, err := q.st.Queued(ctx)
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

// restoreQueued runs the messages queued before the last stop. It is
// called after recoverInterrupted, so each session's interrupted notice is
// in its history before the queued message behind it starts; after the
// channels and the operator parts subscribed to the bus, so a restored
// turn's TurnStarted reaches them; and before the channels take new
// messages, so those queue behind the restored ones.
// A failure is logged: the messages stay stored for the next start.
func restoreQueued(ctx context.Context, eng *gateway.Engine, log *slog.Logger) {
	if err := eng.RestoreQueued(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("store: cannot restore the messages queued before the last stop; they stay stored", "error", err)
	}
}
