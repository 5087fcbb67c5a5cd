package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/storetest"
)

// TestPruneKeepsFileSizeFlat: write, prune, write as much again: the
// second round reuses the pages the prune freed (SQLite's freelist), so the
// file does not grow — no VACUUM needed.
func TestPruneKeepsFileSizeFlat(t *testing.T) {
	s := open(t, dbPath(t), store.Options{Retention: keepDays})
	const n = 400
	storetest.WriteTurns(t, s, "a", n, 0)
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
	storetest.WriteTurns(t, s, "b", n, 60*24*time.Hour)
	pages2, _, err := store.Pages(s)
	if err != nil {
		t.Fatal(err)
	}
	if pages2 > pages1 {
		t.Errorf("page count grew from %d to %d after prune and rewrite: freed pages were not reused", pages1, pages2)
	}
	t.Logf("pages: %d after the first round, %d free after the prune, %d after the second round", pages1, free, pages2)
}

// TestPruneMessagesUsesTheTimeIndex: finding old messages reads the index
// on created_at, not the whole messages table (~200 ms per prune at 200K
// messages, inside the write transaction that blocks every recording).
func TestPruneMessagesUsesTheTimeIndex(t *testing.T) {
	path := dbPath(t)
	s := open(t, path, store.Options{})
	handleAll(s, newTurn("run-1", "s").Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "q" }))
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
