package store

import (
	"sync/atomic"

	"github.com/turnguard/turnguard/event"
)

// evQueue is the recorder's bounded FIFO of events: many producers (the
// goroutines that publish events, through Handle) and one consumer (the
// writer). A push takes no lock: it claims a position with one
// compare-and-swap on tail and publishes the event by storing its slot's
// sequence, so publishers of different runs never wait for each other nor
// for the writer. (A bounded array queue with per-slot sequence numbers, as
// D. Vyukov described it.) Events come out in the order their positions were
// claimed: one publisher's events (a run's) in the order it pushed them.
type evQueue struct {
	tail atomic.Uint64 // the next position a producer claims
	_    [56]byte      // tail on its own cache line: producers write it, the writer does not
	head atomic.Uint64 // the next position the writer reads (written only by the writer)
	_    [56]byte
	n    uint64
	slot []qslot
}

// qslot is one cell. seq == p: free for the producer of position p;
// seq == p+1: holds position p's event, for the writer; the writer frees
// it for position p+n.
type qslot struct {
	seq atomic.Uint64
	ev  event.Event
}

func newEvQueue(size int) *evQueue {
	q := &evQueue{n: uint64(size), slot: make([]qslot, size)}
	for i := range q.slot {
		q.slot[i].seq.Store(uint64(i))
	}
	return q
}

// push appends ev; it reports false, appending nothing, when the queue is
// full. Safe for concurrent use.
func (q *evQueue) push(ev *event.Event) bool {
	pos := q.tail.Load()
	for {
		c := &q.slot[pos%q.n]
		switch d := int64(c.seq.Load() - pos); {
		case d == 0:
			if q.tail.CompareAndSwap(pos, pos+1) {
				c.ev = *ev
				c.seq.Store(pos + 1)
				return true
			}
			pos = q.tail.Load()
		case d < 0:
			return false // the slot still holds the event of pos-n: full
		default:
			pos = q.tail.Load() // another producer claimed pos: try the next
		}
	}
}

// pop appends up to max of the oldest events to dst and frees their slots.
// It stops early at a position a producer claimed but has not filled yet
// (that producer wakes the writer once it has). Only the writer calls it.
func (q *evQueue) pop(dst []event.Event, max int) []event.Event {
	pos := q.head.Load()
	for range max {
		c := &q.slot[pos%q.n]
		if c.seq.Load() != pos+1 {
			break
		}
		dst = append(dst, c.ev)
		c.ev = event.Event{}
		c.seq.Store(pos + q.n)
		pos++
		q.head.Store(pos)
	}
	return dst
}

// len reports how many positions are claimed and not yet read.
func (q *evQueue) len() int {
	h := q.head.Load()
	t := q.tail.Load()
	if t < h {
		return 0
	}
	return int(t - h)
}

// claimed reports how many events were ever pushed (or are being pushed).
func (q *evQueue) claimed() uint64 { return q.tail.Load() }
