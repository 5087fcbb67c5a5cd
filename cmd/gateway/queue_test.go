package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/store"
)

// TestStoreQueueAdapterRoundTrip: what the engine queues through the
// adapter comes back from a reopened store file (a restart) with every
// field, oldest first, and removing one forgets it.
func TestStoreQueueAdapterRoundTrip(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "gateway.db")
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	want := []gateway.QueuedMessage{
		{RunID: "q1", SessionKey: "telegram:42", Channel: "telegram", ChatRef: "42", Owner: "7", Text: "first", QueuedAt: at, Timeout: 42 * time.Second},
		{RunID: "q2", SessionKey: "main", Channel: "ws", Owner: "op", Text: "second", QueuedAt: at.Add(time.Second)},
		{RunID: "q3", SessionKey: "main", Channel: "ws", Owner: "op", Text: "third", QueuedAt: at.Add(2 * time.Second)},
	}
	st, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range want {
		if err := (storeQueue{st}).AddQueued(ctx, m); err != nil {
			t.Fatalf("AddQueued(%s): %v", m.RunID, err)
		}
	}
	if err := (storeQueue{st}).RemoveQueued(ctx, "q2"); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st, err = store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got, err := storeQueue{st}.Queued(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[2] {
		t.Fatalf("Queued after a restart = %+v, want %+v and %+v", got, want[0], want[2])
	}
}
