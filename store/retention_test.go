package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

var keepDays = store.Retention{
	History: 30 * 24 * time.Hour, Journal: 7 * 24 * time.Hour, Outbox: 24 * time.Hour, BatchRows: 50,
}

// writeTurns records n finished turns (question, reply, steps) starting at
// t0+from, one a second, across 10 sessions, and enqueues and delivers
// every tenth reply.
func writeTurns(t *testing.T, s *store.SQLite, prefix string, n int, from time.Duration) {
	t.Helper()
	ctx := context.Background()
	reply := strings.Repeat("r", 600)
	for i := range n {
		tr := newTurn(fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("s%d", i%10))
		at := from + time.Duration(i)*time.Second
		handleAll(s,
			tr.ev(event.TurnStarted, at, func(e *event.Event) { e.Text = "question" }),
			tr.ev(event.StepStarted, at, func(e *event.Event) { e.Step = step("tool", "shell", 1, at) }),
			tr.ev(event.StepCompleted, at, func(e *event.Event) { e.Step = step("tool", "shell", 1, at) }),
			tr.ev(event.Finished, at, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, reply }))
		if i%10 != 0 {
			continue // a Telegram reply for every tenth (an Enqueue is a full fsync)
		}
		id, err := s.Enqueue(ctx, store.OutboxMessage{Channel: "telegram", ChatRef: "1", RunID: tr.run, Kind: store.OutboxFinal, Text: reply})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.MarkDelivered(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, s)
}

// TestPruneKeepsFileSizeFlat: write, prune, write as much again: the
// second round reuses the pages the prune freed (SQLite's freelist), so the
// file does not grow — no VACUUM needed.
func TestPruneKeepsFileSizeFlat(t *testing.T) {
	s := open(t, dbPath(t), store.Options{Retention: keepDays})
	const n = 400
	writeTurns(t, s, "a", n, 0)
	pages1, _, err := store.Pages(s)
	if err != nil {
		t.Fatal(err)
	}
	// Everything is older than every bound (outbox times are real ones).
	now := time.Now().Add(60 * 24 * time.Hour)
	ps, err := s.Prune(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	if ps.Turns != n || ps.Messages != 2*n || ps.Journal != 4*n || ps.Outbox != n/10 || ps.Sessions != 10 {
		t.Errorf("Prune deleted %+v, want every row of the %d turns", ps, n)
	}
	_, free, err := store.Pages(s)
	if err != nil {
		t.Fatal(err)
	}
	if free < pages1/2 {
		t.Errorf("after pruning, %d of %d pages are free, want most", free, pages1)
	}
	writeTurns(t, s, "b", n, 60*24*time.Hour)
	pages2, _, err := store.Pages(s)
	if err != nil {
		t.Fatal(err)
	}
	if pages2 > pages1 {
		t.Errorf("page count grew from %d to %d after prune and rewrite: freed pages were not reused", pages1, pages2)
	}
	t.Logf("pages: %d after the first round, %d free after the prune, %d after the second round", pages1, free, pages2)
}

// TestPruneSparesRunningTurnsAndPendingOutbox: however old, a running
// turn's messages and journal entries and an undelivered outbox row stay;
// the per-session message cap keeps the newest messages.
func TestPruneSparesRunningTurnsAndPendingOutbox(t *testing.T) {
	r := keepDays
	r.MaxMessagesPerSession = 4
	s := open(t, dbPath(t), store.Options{Retention: r})
	ctx := context.Background()
	run := newTurn("running", "old")
	s.Handle(run.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "still thinking" }))
	if _, err := s.Enqueue(ctx, store.OutboxMessage{Channel: "telegram", ChatRef: "1", RunID: "undelivered",
		Kind: store.OutboxNotice, Text: "n"}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 { // 10 recent messages in one session
		tr := newTurn(fmt.Sprintf("recent-%d", i), "busy")
		at := 100*24*time.Hour + time.Duration(i)*time.Second
		handleAll(s,
			tr.ev(event.TurnStarted, at, func(e *event.Event) { e.Text = fmt.Sprint("q", i) }),
			tr.ev(event.Finished, at, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, fmt.Sprint("a", i) }))
	}
	flush(t, s)
	if _, err := s.Prune(ctx, t0.Add(100*24*time.Hour+time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := mustTurn(t, s, "running").State; got != store.TurnRunning {
		t.Errorf("running turn after prune: %s", got)
	}
	if h := msgs(mustHistory(t, s, "old")); len(h) != 1 || h[0].Text != "still thinking" {
		t.Errorf("running turn's history after prune = %+v", h)
	}
	if j, _ := s.Journal(ctx, store.Filter{RunID: "running"}); len(j) != 1 {
		t.Errorf("running turn's journal after prune has %d entries, want 1", len(j))
	}
	if p, _ := s.Pending(ctx, "", 0); len(p) != 1 {
		t.Errorf("pending outbox after prune has %d rows, want the undelivered one", len(p))
	}
	if h := msgs(mustHistory(t, s, "busy")); len(h) != 4 || h[0].Text != "q3" || h[3].Text != "a4" {
		t.Errorf("capped session history = %+v, want the newest 4 (q3 a3 q4 a4)", h)
	}
}

// TestPruneMessagesUsesTheTimeIndex: finding old messages reads the index
// on created_at, not the whole messages table (~200 ms per prune at 200K
// messages, inside the write transaction that blocks every recording).
func TestPruneMessagesUsesTheTimeIndex(t *testing.T) {
	path := dbPath(t)
	s := open(t, path, store.Options{})
	handleAll(s, newTurn("run-1", "s").ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "q" }))
	flush(t, s)
	plan, err := store.QueryPlan(context.Background(), path, store.PruneMessagesQuery, int64(1), 100)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "USING COVERING INDEX messages_created") && !strings.Contains(text, "USING INDEX messages_created") {
		t.Errorf("the plan does not use messages_created:\n%s", text)
	}
	for _, l := range plan {
		if strings.HasPrefix(strings.TrimSpace(l), "SCAN messages") {
			t.Errorf("the plan scans the messages table (%q):\n%s", l, text)
		}
	}
}
