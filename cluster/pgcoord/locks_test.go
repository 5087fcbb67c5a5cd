package pgcoord

import (
	"context"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/testwait"
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

// A takeover locks its sessions FOR NO KEY UPDATE, as its update needs:
// a transaction holding a session's row FOR KEY SHARE (a foreign key's
// check: a message or a turn of the session being written) does not hold
// it up, as FOR UPDATE did.
func TestTakeoverDoesNotWaitForASessionsForeignKeyLock(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	const lease = time.Second
	var seen takeovers
	dead := join(t, url, "dead", lease)
	join(t, url, "survivor", lease, func(o *Options) { o.OnTakeover = seen.add })
	p := db(t, url)
	if err := dead.Claim(ctx, Claim{RunID: "run-1", SessionKey: "ws:1", Channel: "ws", Text: "work"}); err != nil {
		t.Fatal(err)
	}
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO messages (session_key, role, text, created_at) VALUES ('ws:1', 'user', 'hi', now())`); err != nil {
		t.Fatal(err)
	}
	die(dead)
	testwait.Until(t, lease+3*time.Second, "the survivor takes the dead replica over while the session's row is held FOR KEY SHARE", func() bool {
		n, _, _ := seen.of(dead.Epoch())
		return n > 0
	})
}
