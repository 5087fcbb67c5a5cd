// The cluster transition "restore": stored queued messages of sessions
// whose replica was fenced or died are sent again (RestoreQueuedOf), merged
// into a session this replica is running, or handed to the replica that
// holds it. Never lost, never run twice (the idempotency cache and the
// store's queue rows).

package gateway

import (
	"context"
	"fmt"
	"slices"
)

// RestoreQueuedOf runs the stored queued messages of sessionKeys (cluster
// mode): the sessions of the turns this replica just took over from a dead
// one, whose queued messages died with its memory. Each is sent as if it
// had just arrived (see RestoreQueued), oldest first, so the first one of
// a session starts and the rest queue behind it here. Without a cluster or
// a QueueStore it does nothing.
func (e *Engine) RestoreQueuedOf(ctx context.Context, sessionKeys []string) error {
	if e.cluster == nil || e.qstore == nil || len(sessionKeys) == 0 {
		return nil
	}
	return e.restoreClustered(ctx, sessionKeys)
}

// restoreClustered runs the stored queued messages of the sessions in only
// (nil: all). A session busy here (a turn running or ending, messages
// queued, a claim in flight) gets those it does not know merged at the
// head of its queue (mergeStoredLocked): they were sent before anything
// queued here since, and they were accepted already (no queue bound
// refuses them). Any other session's are sent as if they had just arrived
// (Send: claimed here and the rest queued behind, or forwarded to the
// replica that runs the session, where a message it has queued already is
// answered as known). Issue 20: a session some replica ran was skipped —
// assumed to have them queued — so the messages a fenced replica left
// stored were lost when a new message started their session before the
// survivor restored them.
func (e *Engine) restoreClustered(ctx context.Context, only []string) error {
	msgs, err := e.qstore.Queued(ctx)
	if err != nil {
		return fmt.Errorf("restoring queued messages: %w", err)
	}
	msgs = slices.DeleteFunc(msgs, func(m QueuedMessage) bool { return only != nil && !slices.Contains(only, m.SessionKey) })
	if len(msgs) == 0 {
		return nil
	}
	e.mu.Lock()
	restored, rest, starts := e.mergeStoredLocked(msgs)
	e.mu.Unlock()
	for _, start := range starts {
		start()
	}
	for _, m := range rest {
		if e.resendStored(ctx, m) {
			restored++
		}
	}
	if restored > 0 {
		e.log.Info("restored stored queued messages", "messages", restored)
	}
	return nil
}

// resendStored sends the stored queued message m as if it had just
// arrived; false (logged) when Send refused it: it stays stored.
func (e *Engine) resendStored(ctx context.Context, m QueuedMessage) bool {
	_, err := e.Send(ctx, SendRequest{SessionKey: m.SessionKey, Channel: m.Channel, ChatRef: m.ChatRef,
		RunID: m.RunID, Text: m.Text, Owner: m.Owner, Timeout: m.Timeout, Resume: m.Resume, Restored: true})
	if err != nil {
		e.log.Warn("a stored queued message could not be sent again; it stays stored", "run", m.RunID,
			"session", m.SessionKey, "err", err)
	}
	return err == nil
}

// mergeStoredLocked puts the stored messages msgs (oldest first) of
// sessions busy here (busyHereLocked) at the head of their queues, each a
// turn of its own, in their order — all but those this replica knows
// already (queued, running or ended here: repeatLocked). It returns how
// many it merged, the messages of the other sessions (rest, in their
// order: the caller sends them) and the pumps to call once e.mu is
// released.
//
// Lock contract: called with e.mu held; it runs entirely under it.
func (e *Engine) mergeStoredLocked(msgs []QueuedMessage) (n int, rest []QueuedMessage, starts []func()) {
	heads := map[*session][]*queued{}
	var order []*session
	for _, m := range msgs {
		if _, known, _ := e.repeatLocked(SendRequest{RunID: m.RunID, SessionKey: m.SessionKey}); known {
			continue
		}
		s, ok := e.sessions[m.SessionKey]
		if !ok || !busyHereLocked(s) {
			rest = append(rest, m)
			continue
		}
		q := &queued{msgs: []QueuedMessage{m}, timeout: m.Timeout, mode: BusyQueue, begun: make(chan struct{})}
		e.waiting[m.RunID] = q
		if _, seen := heads[s]; !seen {
			order = append(order, s)
		}
		heads[s] = append(heads[s], q)
	}
	for _, s := range order {
		s.queue = append(slices.Clone(heads[s]), s.queue...)
		n += len(heads[s])
		starts = append(starts, e.pumpLocked(s))
	}
	return n, rest, starts
}

// busyHereLocked reports whether s is busy on this replica: a turn running
// or ending, messages queued, a claim in flight. Called with e.mu held.
func busyHereLocked(s *session) bool {
	return s.active != nil || len(s.queue) > 0 || s.ending > 0 || s.claiming != nil
}
