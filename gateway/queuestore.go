// Queue persistence: the QueueStore that keeps queued messages across
// restarts, the removal of rows whose turn started or was dropped, and
// RestoreQueued, which queues the kept messages again at start-up.

package gateway

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// QueueStore keeps queued messages across restarts. Send returns
// StatusQueued only after Add committed durably; the engine removes a
// message when it is dropped. A message whose turn starts is forgotten by
// the QueueStore itself when it records that turn's TurnStarted (its RunID
// and Joined), in the same transaction. Implemented by the store
// (adapted in cmd/gateway); optional (nil: queued messages live in memory).
type QueueStore interface {
	AddQueued(ctx context.Context, m QueuedMessage) error
	// RemoveQueued forgets the messages with these run ids (dropped).
	// Unknown ids are ignored.
	RemoveQueued(ctx context.Context, runIDs ...string) error
	// Queued lists every stored queued message, oldest first.
	Queued(ctx context.Context) ([]QueuedMessage, error)
}

// queueStoreTimeout bounds one QueueStore call the engine makes on its own.
const queueStoreTimeout = 10 * time.Second

// removeQueued forgets started or dropped messages in the QueueStore. A
// failure is logged: the message would run again after a restart.
func (e *Engine) removeQueued(ctx context.Context, ids []string) {
	if e.qstore == nil || len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), queueStoreTimeout)
	defer cancel()
	if err := e.qstore.RemoveQueued(ctx, ids...); err != nil {
		e.log.Error("forgetting queued messages failed: they may run again after a restart", "runs", ids, "err", err)
	}
}

// RestoreQueued queues the messages the QueueStore kept (queued before a
// restart), per session in their order, and starts each session's first.
// A collected session's messages are joined into one turn again. Call it
// once after start-up recovery and before channels take messages.
//
// In cluster mode it restores only the messages of sessions no replica is
// running a turn of (that replica has them queued), each sent as if it had
// just arrived (Send: claimed, or forwarded to the session's replica, or
// recognised by its run id if it ran meanwhile), so a message runs once
// whichever replica restores it.
func (e *Engine) RestoreQueued(ctx context.Context) error {
	if e.qstore == nil {
		return nil
	}
	if e.cluster != nil {
		return e.restoreClustered(ctx, nil)
	}
	msgs, err := e.qstore.Queued(ctx)
	if err != nil {
		return fmt.Errorf("restoring queued messages: %w", err)
	}
	cfg := e.cfg.Current()
	var order []*session
	for _, m := range msgs {
		s, err := e.session(ctx, m.SessionKey)
		if err != nil {
			return fmt.Errorf("restoring queued messages: %w", err)
		}
		e.mu.Lock()
		if _, dup := e.waiting[m.RunID]; !dup && e.sessions[m.SessionKey] == s {
			mode, _ := cfg.BusyFor(m.Channel)
			e.enqueueLocked(s, m, BusyMode(mode))
			if !slices.Contains(order, s) {
				order = append(order, s)
			}
		}
		e.mu.Unlock()
	}
	for _, s := range order {
		e.mu.Lock()
		start := e.pumpLocked(s)
		e.mu.Unlock()
		start()
	}
	return nil
}
