package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/turnguard/turnguard/gateway/event"
	"github.com/turnguard/turnguard/store"
)

// BenchmarkHandle measures what the bus pays per event: Handle on the
// publishing goroutine, with the writer running. drops/op reports how many
// of those calls found the queue full (the writer could not keep up with a
// tight loop); either way Handle returned without waiting.
func BenchmarkHandle(b *testing.B) {
	s := open(b, dbPath(b), store.Options{})
	ev := newTurn("run-1", "s").ev(event.StepCompleted, time.Second, func(e *event.Event) {
		e.Step = step("tool", "web_search", 1, 0)
	})
	b.ReportAllocs()
	for b.Loop() {
		s.Handle(ev)
	}
	b.StopTimer()
	b.ReportMetric(float64(s.Dropped())/float64(b.N), "drops/op")
	flush(b, s)
}

// BenchmarkHandleFull measures Handle when the queue is full: the drop path.
func BenchmarkHandleFull(b *testing.B) {
	held := make(chan struct{})
	s := open(b, dbPath(b), store.WithBeforeBatch(store.Options{QueueSize: 1}, func() { <-held }))
	b.Cleanup(func() { close(held) })
	ev := newTurn("run-1", "s").ev(event.StepStarted, 0, nil)
	for range 2 { // one held by the writer, one in the queue
		s.Handle(ev)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Handle(ev)
	}
}

// BenchmarkHandleParallel is Handle from many publishing goroutines.
func BenchmarkHandleParallel(b *testing.B) {
	s := open(b, dbPath(b), store.Options{})
	ev := newTurn("run-1", "s").ev(event.StepCompleted, time.Second, func(e *event.Event) {
		e.Step = step("tool", "web_search", 1, 0)
	})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.Handle(ev)
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(s.Dropped())/float64(b.N), "drops/op")
	flush(b, s)
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
					s.Handle(tr.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "What's the weather in Paris?" }))
					for k := range uint32(3) {
						st := step("tool", "web_search", k+1, time.Duration(k)*time.Second)
						s.Handle(tr.ev(event.StepStarted, time.Duration(k)*time.Second, func(e *event.Event) { e.Step = st }))
						s.Handle(tr.ev(event.StepCompleted, time.Duration(k+1)*time.Second, func(e *event.Event) { e.Step = st }))
					}
					s.Handle(tr.ev(event.Progress, 4*time.Second, func(e *event.Event) { e.Message = "⏳ Still working" }))
					s.Handle(tr.ev(event.Recovered, 5*time.Second, nil))
					s.Handle(tr.ev(event.Finished, 6*time.Second, func(e *event.Event) {
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
