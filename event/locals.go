package event

import (
	"fmt"
	"sync/atomic"
)

// MaxLocals is how many Local slots a process may create (NewLocal): one per
// subscriber that keeps state per run, so a handful.
const MaxLocals = 4

// Locals is one run's storage for its subscribers: a fixed array of slots,
// one per Local, held by whoever publishes the run's events (the gateway
// keeps it in the run) and carried on each of them (Event.Locals). A
// subscriber that keeps state per run finds it through its Local in O(1),
// without a keyed lookup in a process-wide map, however many runs are live.
//
// A run's events are published one at a time, so a handler reading or
// setting the run's slots while it handles one of the run's events needs no
// lock. Nothing else may touch them: not a copy of the event kept and read
// later or on another goroutine, not a timer. The zero Locals is empty.
type Locals struct {
	slots [MaxLocals]any
}

// Local is a typed slot in every run's Locals. Create one per subscriber at
// start-up with NewLocal (they are never freed).
type Local[T any] struct {
	i int
}

var nextLocal atomic.Int32

// NewLocal returns a new slot. It panics past MaxLocals slots: slots are
// created once per subscriber type at start-up, never per request.
func NewLocal[T any]() Local[T] {
	i := int(nextLocal.Add(1)) - 1
	if i >= MaxLocals {
		panic(fmt.Sprintf("event: more than %d Local slots", MaxLocals))
	}
	return Local[T]{i: i}
}

// Get returns the value set in ev's run for this slot, or nil if none is set
// or ev carries no Locals (an event published without a run, such as a
// SessionReset, or one a test built by hand).
func (l Local[T]) Get(ev Event) *T {
	if ev.Locals == nil {
		return nil
	}
	v, _ := ev.Locals.slots[l.i].(*T)
	return v
}

// Set stores v (nil clears the slot) in ev's run; it reports false, storing
// nothing, when ev carries no Locals.
func (l Local[T]) Set(ev Event, v *T) bool {
	if ev.Locals == nil {
		return false
	}
	if v == nil {
		ev.Locals.slots[l.i] = nil
	} else {
		ev.Locals.slots[l.i] = v
	}
	return true
}
