package storetest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// testEndTurnWritesOutbox: for a channel that delivers out of band, the
// turn's end brings its terminal messages into the outbox (the texts of
// messages.Ending), exactly one row per (run, kind), and OnOutbox is told
// after the commit; a WebSocket turn (served from the history) has none.
func testEndTurnWritesOutbox(t *testing.T, h *H) {
	type row struct {
		Kind store.OutboxKind
		Text string
	}
	for _, tc := range []struct {
		name    string
		channel string
		end     func(*Turn) event.Event
		want    []row
	}{
		{"reply", "telegram", func(tr *Turn) event.Event {
			return tr.Ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "Hello" })
		}, []row{{store.OutboxFinal, "Hello"}}},
		{"empty reply", "telegram", func(tr *Turn) event.Event {
			return tr.Ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason = event.ReasonStop })
		}, []row{{store.OutboxFinal, "✅ Done (the assistant sent no text)."}}},
		{"timeout with a partial reply", "telegram", func(tr *Turn) event.Event {
			return tr.Ev(event.Aborted, time.Minute, func(e *event.Event) {
				e.StopReason, e.FullText, e.Message = event.ReasonTimeout, "Half an answer", "⚠️ This request hit its time limit."
			})
		}, []row{{store.OutboxFinal, "Half an answer"}, {store.OutboxNotice, "⚠️ This request hit its time limit."}}},
		{"error", "telegram", func(tr *Turn) event.Event {
			return tr.Ev(event.Finished, time.Second, func(e *event.Event) {
				e.StopReason, e.Message = event.ReasonError, "❌ Something went wrong (error id E1)."
			})
		}, []row{{store.OutboxNotice, "❌ Something went wrong (error id E1)."}}},
		{"websocket", "ws", func(tr *Turn) event.Event {
			return tr.Ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "Hello" })
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var told []string
			s := h.Open(t, h.New(t), Config{OutboxChannels: []string{"telegram"}, OnOutbox: func(ch string) {
				mu.Lock()
				defer mu.Unlock()
				told = append(told, ch)
			}})
			tr := NewTurn("run-1", "s")
			tr.Channel = tc.channel
			end := tc.end(tr)
			s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "q" }))
			s.Handle(end)
			s.Handle(end) // a second ending changes nothing
			Flush(t, s)
			pending, err := s.Pending(context.Background(), "", 0)
			if err != nil {
				t.Fatal(err)
			}
			var got []row
			for _, m := range pending {
				if m.RunID != "run-1" || m.Channel != tc.channel || m.ChatRef != "42" {
					t.Errorf("outbox row %+v: want run-1 to %s chat 42", m, tc.channel)
				}
				got = append(got, row{m.Kind, m.Text})
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("outbox = %q, want %q", got, tc.want)
			}
			mu.Lock()
			defer mu.Unlock()
			// Told after the commit that wrote the rows; the repeated ending
			// may land in a batch of its own and tell again (harmless: the
			// claim finds nothing new). Never told for a channel without rows.
			told = slices.Compact(told)
			if wantTold := tc.want != nil; wantTold != slices.Equal(told, []string{"telegram"}) {
				t.Errorf("OnOutbox calls = %q (rows written: %v)", told, wantTold)
			}
		})
	}
}

// testEndTurnKeepsEarlierOutboxRow: a notice already in the outbox for the
// run (the restart's interrupted notice) is kept; the ending adds only what
// is missing and the turn still ends.
func testEndTurnKeepsEarlierOutboxRow(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{OutboxChannels: []string{"telegram"}})
	ctx := context.Background()
	if _, err := s.Enqueue(ctx, store.OutboxMessage{Channel: "telegram", ChatRef: "42", RunID: "run-1",
		Kind: store.OutboxNotice, Text: "earlier"}); err != nil {
		t.Fatal(err)
	}
	tr := NewTurn("run-1", "s")
	HandleAll(s, tr.Ev(event.TurnStarted, 0, nil), tr.Ev(event.Aborted, time.Second, func(e *event.Event) {
		e.StopReason, e.FullText, e.Message = event.ReasonUser, "partial", "⏹️ Stopped."
	}))
	Flush(t, s)
	if st := MustTurn(t, s, "run-1").State; st != store.TurnAborted {
		t.Errorf("turn state = %s, want aborted", st)
	}
	p, err := s.Pending(ctx, "telegram", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 2 || p[0].Text != "earlier" || p[1].Kind != store.OutboxFinal || p[1].Text != "partial" {
		t.Errorf("pending = %+v, want the earlier notice and the partial reply", p)
	}
}

// testUserText: the message that started a run, for Retry; ErrNotFound for
// a run the store does not know.
func testUserText(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	tr := NewTurn("run-1", "s")
	HandleAll(s, tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "summarise the report" }),
		tr.Ev(event.Aborted, time.Minute, func(e *event.Event) { e.StopReason, e.Message = event.ReasonTimeout, "⚠️" }))
	Flush(t, s)
	ctx := context.Background()
	if got, err := s.UserText(ctx, "run-1"); err != nil || got != "summarise the report" {
		t.Errorf("UserText(run-1) = %q, %v", got, err)
	}
	if _, err := s.UserText(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UserText(nope) error = %v, want ErrNotFound", err)
	}
}
