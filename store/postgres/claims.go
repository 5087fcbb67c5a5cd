package postgres

import (
	"sync"
	"time"

	"github.com/turnguard/turnguard/event"
)

// Limits are a turn's limits and sender as its row holds them (the
// columns deadline_at, ceiling_at, step_timeout_ns and sender): a claim
// (cluster/pgcoord) writes them with the turn's row, the recorder from the
// turn's TurnStarted.
type Limits struct {
	Deadline    time.Time
	Ceiling     time.Time // zero: no ceiling
	StepTimeout time.Duration
	Sender      string
}

// LimitsOf are the limits ev (a TurnStarted) carries.
func LimitsOf(ev *event.Event) Limits {
	return Limits{Deadline: ev.Deadline, Ceiling: ev.Ceiling, StepTimeout: ev.StepTimeout, Sender: ev.Sender}
}

// Args are l as the columns' values: NULL for a zero time or a step
// timeout that is off.
func (l Limits) Args() (deadline, ceiling, stepTimeout any, sender string) {
	return nullTime(l.Deadline), nullTime(l.Ceiling), nullDuration(l.StepTimeout), l.Sender
}

// same reports whether l and o write the same columns.
func (l Limits) same(o Limits) bool {
	return l.Deadline.Equal(o.Deadline) && l.Ceiling.Equal(o.Ceiling) &&
		max(l.StepTimeout, 0) == max(o.StepTimeout, 0) && l.Sender == o.Sender
}

// maxClaims bounds Claims: the claims whose TurnStarted the recorder has
// not seen yet, with room.
const maxClaims = 1 << 16

// Claims are the turns this process claimed (cluster/pgcoord), with the
// limits each claim wrote, until the recorder sees the turn's TurnStarted
// (issue 21): a start it finds here needs no statement — its claim wrote
// the row, the user's message and the limits — unless its limits differ
// (the configuration changed between the claim and the start): then they
// go with the batch's steps as before. A start it does not find (claimed
// by an earlier life, the bound reached, a claim whose turn never started)
// reads whether it is claimed, as before: only dearer. Safe for concurrent
// use; the nil *Claims holds nothing.
type Claims struct {
	mu   sync.Mutex
	runs map[string]Limits
}

// Add notes that run's claim committed with l. Call it after the commit
// and before the turn's TurnStarted is published.
func (c *Claims) Add(run string, l Limits) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil || len(c.runs) >= maxClaims {
		c.runs = make(map[string]Limits) // forgotten: their starts read as before
	}
	c.runs[run] = l
}

// take returns the limits run's claim wrote, and forgets them.
func (c *Claims) take(run string) (Limits, bool) {
	if c == nil {
		return Limits{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.runs[run]
	delete(c.runs, run)
	return l, ok
}

// Claims is where this process's claims (cluster/pgcoord Options.Claims)
// tell the store's recorder about them; nil unless Options.Shared.
func (s *Store) Claims() *Claims { return s.claims }
