package telegram

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/store"
)

// TestLateEndingRowDeliveredOnce: a durable ending whose wait for its
// outbox row ran out is sent from memory; if the store wrote the row
// meanwhile (claim left it alone: the ending was inflight), the enqueue
// finds a duplicate. A row still pending is delivered here — not skipped
// and lost — and one already delivered is not sent again.
func TestLateEndingRowDeliveredOnce(t *testing.T) {
	for _, tc := range []struct {
		name      string
		delivered bool
		screen    []string
		states    []string
	}{
		{name: "row pending", screen: []string{"⚠️ late notice"}, states: []string{"notice:delivered"}},
		{name: "row delivered", delivered: true, states: []string{"notice:delivered"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ob := newFakeOutbox()
				id, err := ob.Enqueue(context.Background(), store.OutboxMessage{Channel: "telegram", ChatRef: "1001",
					RunID: "tg-1001-9", Kind: store.OutboxNotice, Text: "⚠️ late notice"})
				if err != nil {
					t.Fatal(err)
				}
				if tc.delivered {
					_ = ob.MarkDelivered(context.Background(), id)
				}
				h := newHarness(t, setup{outbox: ob, noRun: true})
				c := h.ch
				c.mu.Lock()
				c.enqueueLocked(c.chatLocked(alice), &outItem{kind: itemNotice, runID: "tg-1001-9", text: "⚠️ late notice", fromMemory: true})
				c.mu.Unlock()
				h.advance(time.Minute)
				if got := h.screen(alice); !slices.Equal(got, tc.screen) {
					t.Errorf("chat shows %q, want %q", got, tc.screen)
				}
				if got := ob.states(); !slices.Equal(got, tc.states) {
					t.Errorf("outbox = %q, want %q", got, tc.states)
				}
			})
		})
	}
}
