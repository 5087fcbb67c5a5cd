package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/turnguard/turnguard/store"
)

// WaitTurn polls st, written by another process (a gateway under test),
// until the turn runID satisfies ok, for at most 10 s; what names the wait
// in the failure.
func WaitTurn(t testing.TB, st store.Reader, runID, what string, ok func(store.Turn) bool) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if turn, err := st.Turn(ctx, runID); err == nil && ok(turn) {
			return
		}
		time.Sleep(20 * time.Millisecond) // real time: polling another process's database
	}
	t.Fatalf("turn %s never recorded %s", runID, what)
}

// WaitTurnFile is WaitTurn on the SQLite store file at path, opened without
// its lock (the gateway writing it holds the lock).
func WaitTurnFile(t testing.TB, path, runID, what string, ok func(store.Turn) bool) {
	t.Helper()
	st, err := store.Open(context.Background(), path, store.Options{Unlocked: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	WaitTurn(t, st, runID, what, ok)
}
