// Queue controls (/queue): a session's own busy mode, kept in
// Options.Settings across restarts, and the snapshot /queue shows.

package gateway

import (
	"context"
	"fmt"
	"time"
)

// SessionSettings keeps a session's own settings across restarts (the
// busy mode /queue <mode> sets). Implemented by the store (adapted in
// cmd/gateway); optional (nil: they live in memory until the session is
// evicted).
type SessionSettings interface {
	// BusyModeOf returns the busy mode set for sessionKey, "" for none.
	BusyModeOf(ctx context.Context, sessionKey string) (string, error)
	// SetBusyMode records mode for sessionKey durably; "" forgets it.
	SetBusyMode(ctx context.Context, sessionKey, mode string) error
}

// QueueInfo is what /queue shows of a session: the busy rules in force
// for its messages and what waits.
type QueueInfo struct {
	Mode BusyMode
	// Own: Mode was set for this session (/queue <mode>), not configured.
	Own       bool
	Overflow  string // busy.overflow
	MaxQueued int
	Debounce  time.Duration
	// Queue lists the waiting messages, oldest first (StatusOf's).
	Queue []QueuedMessage
}

// QueueInfo returns the session's busy rules for messages from channel and
// what waits (wherever its turn runs: StatusOf, whose error it returns
// along with this replica's view).
func (e *Engine) QueueInfo(ctx context.Context, sessionKey, channel string) (QueueInfo, error) {
	s, err := e.session(ctx, sessionKey)
	if err != nil {
		return QueueInfo{}, fmt.Errorf("queue of %s: %w", sessionKey, err)
	}
	cfg := e.cfg.Current()
	mode, maxQueued := cfg.BusyFor(channel)
	info := QueueInfo{Mode: BusyMode(mode), Overflow: cfg.OverflowFor(channel), MaxQueued: maxQueued, Debounce: cfg.DebounceFor(channel)}
	e.mu.Lock()
	if s.busyMode != "" {
		info.Mode, info.Own = s.busyMode, true
	}
	e.mu.Unlock()
	st, err := e.StatusOf(ctx, sessionKey)
	info.Queue = st.Queue
	return info, err
}

// SetBusyMode sets the busy mode of sessionKey's messages (/queue <mode>),
// over the channel's configured one; "" goes back to the configured one.
// It is stored (Options.Settings) before it applies: on return it holds
// across a restart. An invalid mode is ErrInvalidBusyMode.
func (e *Engine) SetBusyMode(ctx context.Context, sessionKey string, mode BusyMode) error {
	if mode != "" && !mode.Valid() {
		return fmt.Errorf("busy mode %q: %w", mode, ErrInvalidBusyMode)
	}
	s, err := e.session(ctx, sessionKey)
	if err != nil {
		return fmt.Errorf("busy mode of %s: %w", sessionKey, err)
	}
	if e.settings != nil {
		if err := e.settings.SetBusyMode(ctx, sessionKey, string(mode)); err != nil {
			return fmt.Errorf("busy mode of %s: %w", sessionKey, err)
		}
	}
	e.mu.Lock()
	if e.sessions[sessionKey] == s {
		s.busyMode = mode
	}
	e.mu.Unlock()
	return nil
}

// loadBusyMode reads the busy mode stored for s (loadHistory calls it with
// the history). Called without e.mu; the caller installs the result.
func (e *Engine) loadBusyMode(ctx context.Context, key string) BusyMode {
	if e.settings == nil {
		return ""
	}
	m, err := e.settings.BusyModeOf(ctx, key)
	if err != nil {
		e.log.Warn("loading the session's busy mode failed; the configured one applies", "session", key, "err", err)
		return ""
	}
	if mode := BusyMode(m); mode.Valid() {
		return mode
	}
	return ""
}
