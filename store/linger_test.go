package store_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/storetest"
)

// batchSizes is a BatchWriter that keeps the size of each batch.
type batchSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (b *batchSizes) WriteBatch(_ context.Context, evs []event.Event) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sizes = append(b.sizes, len(evs))
	return nil
}
func (b *batchSizes) Classify(error) store.Failure { return store.Failure{} }
func (b *batchSizes) Probe(context.Context) error  { return nil }
func (b *batchSizes) Check() bool                  { return true }

// With a linger the writer waits that long after taking a batch smaller
// than BatchSize for more events (issue 21: a shared PostgreSQL's batches
// shadow claimed turns; fuller batches cost fewer statements and
// commits); it writes a full batch at once, and without a linger it writes
// what it has.
func TestLingerFillsBatches(t *testing.T) {
	cases := []struct {
		name   string
		linger time.Duration
		gap    time.Duration // between events
		want   []int
	}{
		{"no linger", 0, time.Millisecond, []int{1, 1, 1, 1, 1, 1}},
		{"events within the linger", 10 * time.Millisecond, time.Millisecond, []int{4, 2}},
		{"events farther apart than the linger", 10 * time.Millisecond, 20 * time.Millisecond, []int{1, 1, 1, 1, 1, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := &batchSizes{}
				r, ctl, err := store.NewEventRecorder(w, store.RecorderOptions{BatchSize: 4, Linger: tc.linger, Logger: storetest.Quiet})
				if err != nil {
					t.Fatal(err)
				}
				ctl.Start()
				defer ctl.Stop()
				for i := range 6 {
					tr := storetest.NewTurn(fmt.Sprintf("run-%d", i), "ws:1")
					r.Handle(tr.Ev(event.StepStarted, 0, nil))
					synctest.Wait()
					time.Sleep(tc.gap) // real time: no — inside the synctest bubble: the events' spacing
				}
				if err := r.Flush(context.Background()); err != nil {
					t.Fatal(err)
				}
				w.mu.Lock()
				defer w.mu.Unlock()
				if !slices.Equal(w.sizes, tc.want) {
					t.Errorf("batches of %v events, want %v", w.sizes, tc.want)
				}
			})
		})
	}
}
