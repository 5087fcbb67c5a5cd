package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// BenchmarkHandle measures what the bus pays per accepted event: Handle on
// the publishing goroutine. Between queue-fulls the timer stops while the
// writer catches up, so every timed call takes the enqueue path (drops/op
// must be 0). The event has no session key, so the writer rejects it
// without touching the database and the untimed catch-up stays short;
// Handle's own cost does not depend on the event's content.
//
//   - writer=busy: the writer is inside a transaction (held in the batch
//     hook), as it is under load: Handle is a lock-free copy into a ring.
//   - writer=draining: the writer runs freely and, with nothing to write,
//     empties the queue as fast as it fills, so most sends find it parked
//     and pay for waking it: the worst case.
func BenchmarkHandle(b *testing.B) {
	const queue = 4096
	for _, busy := range []bool{true, false} {
		name := "writer=draining"
		if busy {
			name = "writer=busy"
		}
		b.Run(name, func(b *testing.B) {
			var gate sync.Mutex // held while timing: the writer waits in its batch hook
			opts := store.Options{QueueSize: queue}
			if busy {
				opts = store.WithBeforeBatch(opts, func() { gate.Lock(); gate.Unlock() })
				gate.Lock()
			}
			s := open(b, dbPath(b), opts)
			ev := newTurn("run-1", "").Ev(event.StepCompleted, time.Second, func(e *event.Event) {
				e.Step = step("tool", "web_search", 1, 0)
			})
			catchUp := func() {
				if busy {
					gate.Unlock()
					defer gate.Lock()
				}
				flush(b, s)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if i > 0 && i%queue == 0 {
					b.StopTimer()
					catchUp()
					b.StartTimer()
				}
				s.Handle(ev)
			}
			b.StopTimer()
			b.ReportMetric(float64(s.Dropped())/float64(b.N), "drops/op")
			catchUp()
			if busy {
				gate.Unlock()
			}
		})
	}
}

// BenchmarkHandleFull measures Handle when the queue is full: the drop path.
func BenchmarkHandleFull(b *testing.B) {
	held := make(chan struct{})
	s := open(b, dbPath(b), store.WithBeforeBatch(store.Options{QueueSize: 1}, func() { <-held }))
	b.Cleanup(func() { close(held) })
	ev := newTurn("run-1", "s").Ev(event.StepStarted, 0, nil)
	for range 2 { // one held by the writer, one in the queue
		s.Handle(ev)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Handle(ev)
	}
}

// BenchmarkWriteThroughput measures the writer: turns of a realistic shape
// (start, three steps, a progress notice, the finish: 10 events) are
// enqueued a queue-full at a time and flushed. events/s is what the writer
// sustains on a real file.
func BenchmarkWriteThroughput(b *testing.B) {
	for _, batch := range []int{1, 64, 256} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			const queue = 4096
			s := open(b, dbPath(b), store.Options{QueueSize: queue, BatchSize: batch})
			ctx := context.Background()
			events, n := 0, 0
			for b.Loop() {
				for i := 0; i < queue-10; i += 10 {
					n++
					tr := newTurn(fmt.Sprintf("run-%d", n), fmt.Sprintf("s-%d", n%100))
					s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "What's the weather in Paris?" }))
					for k := range uint32(3) {
						st := step("tool", "web_search", k+1, time.Duration(k)*time.Second)
						s.Handle(tr.Ev(event.StepStarted, time.Duration(k)*time.Second, func(e *event.Event) { e.Step = st }))
						s.Handle(tr.Ev(event.StepCompleted, time.Duration(k+1)*time.Second, func(e *event.Event) { e.Step = st }))
					}
					s.Handle(tr.Ev(event.Progress, 4*time.Second, func(e *event.Event) { e.Message = "⏳ Still working" }))
					s.Handle(tr.Ev(event.Recovered, 5*time.Second, nil))
					s.Handle(tr.Ev(event.Finished, 6*time.Second, func(e *event.Event) {
						e.StopReason, e.FullText = event.ReasonStop, "Sunny, 21°C."
					}))
					events += 10
				}
				if err := s.Flush(ctx); err != nil {
					b.Fatal(err)
				}
			}
			if d := s.Dropped(); d != 0 {
				b.Fatalf("%d events dropped: the benchmark must not overflow the queue", d)
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
