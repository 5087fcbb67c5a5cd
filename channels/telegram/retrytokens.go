package telegram

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/turnguard/turnguard/store"
)

// memTokens keeps Retry buttons' tokens in memory, for a channel without a
// store (Options.Runs): the last maxRecentRuns of them, by their secret's
// hash, as a store keeps them. A restart forgets them, so their buttons
// are refused as expired.
type memTokens struct {
	mu    sync.Mutex
	byKey map[string]*store.RetryToken
	order []string // oldest first
}

var _ store.RetryTokens = (*memTokens)(nil)

func newMemTokens() *memTokens { return &memTokens{byKey: map[string]*store.RetryToken{}} }

func (m *memTokens) SaveRetryToken(_ context.Context, secret string, t store.RetryToken) error {
	key := store.RetryTokenHash(secret)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byKey[key]; ok {
		return nil
	}
	if len(m.order) >= maxRecentRuns {
		delete(m.byKey, m.order[0])
		m.order = m.order[1:]
	}
	t.UsedBy, t.UsedAt = "", time.Time{}
	m.byKey[key] = &t
	m.order = append(m.order, key)
	return nil
}

func (m *memTokens) RetryToken(_ context.Context, secret string) (store.RetryToken, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.byKey[store.RetryTokenHash(secret)]
	if !ok {
		return store.RetryToken{}, fmt.Errorf("retry token: %w", store.ErrNotFound)
	}
	return *t, nil
}

func (m *memTokens) UseRetryToken(_ context.Context, secret, usedBy string, at time.Time) (store.RetryToken, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.byKey[store.RetryTokenHash(secret)]
	switch {
	case !ok:
		return store.RetryToken{}, fmt.Errorf("use retry token: %w", store.ErrNotFound)
	case t.UsedBy != "":
		return *t, fmt.Errorf("use retry token of run %q: %w", t.RunID, store.ErrTokenUsed)
	}
	was := *t
	t.UsedBy, t.UsedAt = usedBy, at
	return was, nil
}

func (m *memTokens) ReleaseRetryToken(_ context.Context, secret, usedBy string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t, ok := m.byKey[store.RetryTokenHash(secret)]; ok && t.UsedBy == usedBy {
		t.UsedBy, t.UsedAt = "", time.Time{}
	}
	return nil
}
