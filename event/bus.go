package event

import (
	"sync"
	"sync/atomic"
)

// Handler receives published events. It is called synchronously on the
// publisher's goroutine, so it must not block: a subscriber that needs to do
// I/O copies the event into its own bounded queue and returns. Handlers for
// one run are called in the run's sequence order.
type Handler func(Event)

// Bus fans events out to subscribers: those of one session and those of all
// sessions. The zero Bus is not usable; call NewBus.
//
// Publish takes no lock: the subscriber lists are copy-on-write snapshots, so
// publishing costs two atomic loads, a map lookup (only while some session has
// its own subscribers) and the handlers themselves. Subscribing copies only
// the list it changes.
type Bus struct {
	mu        sync.Mutex // serialises changes to the subscriber lists
	all       atomic.Pointer[[]subscriber]
	bySession sync.Map // session key → *atomic.Pointer[[]subscriber]
	next      uint64
	count     atomic.Int64
	perKey    atomic.Int64 // subscriptions to one session: while 0, Publish skips bySession
}

type subscriber struct {
	id uint64
	h  Handler
}

// NewBus returns an empty bus.
func NewBus() *Bus { return &Bus{} }

// Subscribe registers h for the events of sessionKey, or of every session
// when sessionKey is "". The returned function removes the subscription; it is
// safe to call more than once. Events published before Subscribe returns may
// or may not be delivered.
func (b *Bus) Subscribe(sessionKey string, h Handler) (unsubscribe func()) {
	b.mu.Lock()
	b.next++
	id := b.next
	list := b.list(sessionKey)
	var cur []subscriber
	if p := list.Load(); p != nil {
		cur = *p
	}
	n := append(append(make([]subscriber, 0, len(cur)+1), cur...), subscriber{id: id, h: h})
	list.Store(&n)
	b.count.Add(1)
	if sessionKey != "" {
		b.perKey.Add(1)
	}
	b.mu.Unlock()

	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			list := b.list(sessionKey)
			var cur []subscriber
			if p := list.Load(); p != nil {
				cur = *p
			}
			n := make([]subscriber, 0, len(cur))
			for _, s := range cur {
				if s.id != id {
					n = append(n, s)
				}
			}
			if len(n) == 0 && sessionKey != "" {
				b.bySession.Delete(sessionKey)
				list.Store(nil)
			} else {
				list.Store(&n)
			}
			b.count.Add(-1)
			if sessionKey != "" {
				b.perKey.Add(-1)
			}
		})
	}
}

// list returns the list for sessionKey, creating it. Called with b.mu held.
func (b *Bus) list(sessionKey string) *atomic.Pointer[[]subscriber] {
	if sessionKey == "" {
		return &b.all
	}
	if v, ok := b.bySession.Load(sessionKey); ok {
		return v.(*atomic.Pointer[[]subscriber])
	}
	p := new(atomic.Pointer[[]subscriber])
	b.bySession.Store(sessionKey, p)
	return p
}

// Publish delivers ev to every all-sessions subscriber and then to the
// subscribers of ev.SessionKey, each in subscription order.
func (b *Bus) Publish(ev Event) {
	if p := b.all.Load(); p != nil {
		for _, s := range *p {
			s.h(ev)
		}
	}
	if b.perKey.Load() == 0 {
		return // no session has subscribers of its own: no key to hash
	}
	if v, ok := b.bySession.Load(ev.SessionKey); ok {
		if p := v.(*atomic.Pointer[[]subscriber]).Load(); p != nil {
			for _, s := range *p {
				s.h(ev)
			}
		}
	}
}

// Subscribers reports the number of live subscriptions (for diagnostics).
func (b *Bus) Subscribers() int { return int(b.count.Load()) }
