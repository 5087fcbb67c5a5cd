package store

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
)

// TestQueueKeepsEachPublishersOrder pushes from several goroutines at once
// (as publishers of different runs do) into a small queue that the reader
// drains concurrently: nothing is lost or duplicated and each publisher's
// events come out in the order it pushed them.
func TestQueueKeepsEachPublishersOrder(t *testing.T) {
	const publishers, each = 4, 5000
	q := newEvQueue(16)
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			run := string(rune('a' + p))
			for i := 1; i <= each; i++ {
				ev := event.Event{Kind: event.StepCompleted, RunID: run, Seq: uint64(i)}
				for !q.push(&ev) { // full: the reader catches up
					time.Sleep(time.Microsecond) // real time: a real second goroutine drains the queue
				}
			}
		})
	}
	last := map[string]uint64{}
	var batch []event.Event
	for n := 0; n < publishers*each; {
		batch = q.pop(batch[:0], 8)
		if len(batch) == 0 {
			time.Sleep(time.Microsecond) // real time: waiting for the real publisher goroutines
			continue
		}
		for _, ev := range batch {
			if ev.Seq != last[ev.RunID]+1 {
				t.Fatalf("run %s: event %d after %d", ev.RunID, ev.Seq, last[ev.RunID])
			}
			last[ev.RunID] = ev.Seq
			n++
		}
	}
	wg.Wait()
	if q.len() != 0 || len(q.pop(nil, 8)) != 0 {
		t.Errorf("queue not empty after every event was read: len %d", q.len())
	}
	if got := q.claimed(); got != publishers*each {
		t.Errorf("claimed %d positions, want %d", got, publishers*each)
	}
}

// TestQueueFullAndFreed checks the bound: a full queue refuses a push
// until the reader frees a slot, and a read slot keeps no event alive.
func TestQueueFullAndFreed(t *testing.T) {
	q := newEvQueue(3)
	for i := range 3 {
		if !q.push(&event.Event{Seq: uint64(i + 1), FullText: "reply"}) {
			t.Fatalf("push %d into a queue of 3 refused", i+1)
		}
	}
	if q.push(&event.Event{Seq: 4}) {
		t.Fatal("push into a full queue accepted")
	}
	if q.len() != 3 {
		t.Errorf("len = %d, want 3", q.len())
	}
	got := q.pop(nil, 2)
	if len(got) != 2 || got[0].Seq != 1 || got[1].Seq != 2 {
		t.Fatalf("pop(2) = %+v, want events 1 and 2", got)
	}
	for i := range q.slot[:2] {
		if q.slot[i].ev.FullText != "" {
			t.Errorf("slot %d still holds its event after it was read", i)
		}
	}
	for _, seq := range []uint64{4, 5} {
		if !q.push(&event.Event{Seq: seq}) {
			t.Fatalf("push %d after the reader freed slots refused", seq)
		}
	}
	got = q.pop(nil, 10)
	if len(got) != 3 || got[0].Seq != 3 || got[1].Seq != 4 || got[2].Seq != 5 {
		t.Fatalf("pop = %+v, want events 3, 4, 5", got)
	}
}

// TestHandleDropsTheRunsLocals checks that a queued event does not keep its
// run's subscriber state (event.Locals) alive while it waits for the
// writer.
func TestHandleDropsTheRunsLocals(t *testing.T) {
	held := make(chan struct{})
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "t.db"),
		Options{QueueSize: 8, beforeBatch: func() { <-held }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer close(held)
	loc := new(event.Locals)
	s.Handle(event.Event{Kind: event.TurnStarted, RunID: "r1", SessionKey: "k", Locals: loc}) // the writer takes it and waits
	deadline := time.Now().Add(5 * time.Second)
	for s.QueueDepth() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // real time: the real writer goroutine takes the first event
	}
	s.Handle(event.Event{Kind: event.StepStarted, RunID: "r1", SessionKey: "k", Seq: 2, Locals: loc})
	got := s.ring.pop(nil, 8)
	if len(got) != 1 {
		t.Fatalf("queued %d events, want 1", len(got))
	}
	if got[0].Locals != nil {
		t.Error("the queued event still references its run's Locals")
	}
}

// TestHandleTakesNoLockToQueueOrShed checks that Handle takes no lock on
// the paths every step event takes: queued into a ring with room, or shed
// when the ring is full (the disk is slow). The test holds the spill lock
// throughout; a Handle that took it would not return.
func TestHandleTakesNoLockToQueueOrShed(t *testing.T) {
	held := make(chan struct{})
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "t.db"),
		Options{QueueSize: 2, beforeBatch: func() { <-held }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer close(held)
	s.qmu.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 6 { // the writer holds at most one batch; the ring fills; the rest are shed
			s.Handle(event.Event{Kind: event.StepCompleted, RunID: "r1", SessionKey: "k", Seq: uint64(i + 1)})
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // real time: a blocked Handle never returns; the bound only ends the test
		s.qmu.Unlock()
		t.Fatal("Handle waited for the queue lock")
	}
	s.qmu.Unlock()
	if s.Dropped() == 0 {
		t.Error("no event was shed although the ring was full")
	}
}
