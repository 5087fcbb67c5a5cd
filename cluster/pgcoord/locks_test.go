package pgcoord

import (
	"context"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/pgtest"
)

// A claim and a finish never wait for the writers of their session's row
// (issue 21: with three replicas the claim's sessions insert averaged 30 ms
// of lock waits): a recorder touching the row's updated_at, a reset, a
// takeover hold it FOR NO KEY UPDATE until they commit; a claim makes the
// row only when it is not there, and its and the finish's foreign-key
// checks lock it FOR KEY SHARE, which does not conflict.
func TestClaimAndFinishDoNotWaitForTheSessionsWriters(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	a := join(t, url, "a", 30*time.Second)
	p := db(t, url)
	if err := a.Claim(ctx, Claim{RunID: "run-1", SessionKey: "ws:1", Channel: "ws", Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Finish(ctx, finished("run-1", "hello")); err != nil {
		t.Fatal(err)
	}
	tx, err := p.Begin(ctx) // the recorder's touch of the session, not committed yet
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `UPDATE sessions SET updated_at = now() WHERE key = 'ws:1'`); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second) // what waits for the touch never returns before it
	defer cancel()
	if err := a.Claim(wctx, Claim{RunID: "run-2", SessionKey: "ws:1", Channel: "ws", Text: "again"}); err != nil {
		t.Fatalf("the claim waited for the session's writer: %v", err)
	}
	if err := a.Finish(wctx, finished("run-2", "hello again")); err != nil {
		t.Fatalf("the finish waited for the session's writer: %v", err)
	}
}
