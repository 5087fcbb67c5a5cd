package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/internal/storequeue"
)

// storeQueue is the engine's QueueStore on the store (storequeue.Queue).
type storeQueue = storequeue.Queue

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
