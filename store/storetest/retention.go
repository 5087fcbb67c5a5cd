package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// testPruneSparesRunningTurnsAndPendingOutbox: however old, a running
// turn's messages and journal entries and an undelivered outbox row stay;
// the per-session message cap keeps the newest messages.
func testPruneSparesRunningTurnsAndPendingOutbox(t *testing.T, h *H) {
	r := KeepDays
	r.MaxMessagesPerSession = 4
	s := h.Open(t, h.New(t), Config{Retention: r})
	ctx := context.Background()
	run := NewTurn("running", "old")
	s.Handle(run.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "still thinking" }))
	if _, err := s.Enqueue(ctx, store.OutboxMessage{Channel: "telegram", ChatRef: "1", RunID: "undelivered",
		Kind: store.OutboxNotice, Text: "n"}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 { // 10 recent messages in one session
		tr := NewTurn(fmt.Sprintf("recent-%d", i), "busy")
		at := 100*24*time.Hour + time.Duration(i)*time.Second
		HandleAll(s,
			tr.Ev(event.TurnStarted, at, func(e *event.Event) { e.Text = fmt.Sprint("q", i) }),
			tr.Ev(event.Finished, at, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, fmt.Sprint("a", i) }))
	}
	Flush(t, s)
	if _, err := s.Prune(ctx, T0.Add(100*24*time.Hour+time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := MustTurn(t, s, "running").State; got != store.TurnRunning {
		t.Errorf("running turn after prune: %s", got)
	}
	if hist := Msgs(MustHistory(t, s, "old")); len(hist) != 1 || hist[0].Text != "still thinking" {
		t.Errorf("running turn's history after prune = %+v", hist)
	}
	if j, _ := s.Journal(ctx, store.Filter{RunID: "running"}); len(j) != 1 {
		t.Errorf("running turn's journal after prune has %d entries, want 1", len(j))
	}
	if p, _ := s.Pending(ctx, "", 0); len(p) != 1 {
		t.Errorf("pending outbox after prune has %d rows, want the undelivered one", len(p))
	}
	if hist := Msgs(MustHistory(t, s, "busy")); len(hist) != 4 || hist[0].Text != "q3" || hist[3].Text != "a4" {
		t.Errorf("capped session history = %+v, want the newest 4 (q3 a3 q4 a4)", hist)
	}
}
