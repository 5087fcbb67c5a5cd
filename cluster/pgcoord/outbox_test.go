package pgcoord

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/turnguard/turnguard/store"

	"github.com/turnguard/turnguard/internal/pgtest"
)

// A chat's outbox rows are held by one replica at a time and sent in
// order: a row behind an earlier one another replica holds is not
// claimed; HoldOutbox, asked before each send, refuses a row behind a
// pending one (ErrBehind), a row this replica does not hold, and every row
// once its lease is lost (ErrNotHeld: it must drop them unsent).
func TestOutboxChatHeldByOneReplicaInOrder(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	a, b := join(t, url, "a", 5*time.Second), join(t, url, "b", 5*time.Second)
	p := db(t, url)
	if _, err := p.Exec(ctx, `INSERT INTO outbox (channel, chat_ref, run_id, kind, text, created_at)
		VALUES ('telegram', '7', 'r1', 'final', 'first', now()), ('telegram', '7', 'r2', 'final', 'second', now()),
			('telegram', '8', 'r3', 'final', 'other chat', now())`); err != nil {
		t.Fatal(err)
	}
	first, err := a.ClaimOutbox(ctx, "telegram", 1, time.Minute)
	if err != nil || len(first) != 1 || first[0].RunID != "r1" {
		t.Fatalf("a claims one row: %+v, %v; want r1", first, err)
	}
	got, err := b.ClaimOutbox(ctx, "telegram", 10, time.Minute)
	if err != nil || len(got) != 1 || got[0].RunID != "r3" {
		t.Fatalf("b claims: %+v, %v; want only the other chat's r3 (r2 is behind a's r1)", got, err)
	}
	if err := b.HoldOutbox(ctx, first[0].ID, time.Minute); !errors.Is(err, store.ErrNotHeld) {
		t.Errorf("b holds a's row: %v; want ErrNotHeld", err)
	}
	both, err := a.ClaimOutbox(ctx, "telegram", 10, time.Minute)
	if err != nil || len(both) != 2 {
		t.Fatalf("a claims again: %+v, %v; want r1 and r2", both, err)
	}
	if err := a.HoldOutbox(ctx, both[1].ID, time.Minute); !errors.Is(err, store.ErrBehind) {
		t.Errorf("a holds r2 while r1 is pending: %v; want ErrBehind", err)
	}
	if err := a.HoldOutbox(ctx, both[0].ID, time.Minute); err != nil {
		t.Errorf("a holds r1: %v; want nil", err)
	}
	if _, err := p.Exec(ctx, `UPDATE outbox SET delivered_at = now() WHERE id = $1`, both[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := a.HoldOutbox(ctx, both[0].ID, time.Minute); !errors.Is(err, store.ErrNotHeld) {
		t.Errorf("a holds r1 once delivered: %v; want ErrNotHeld", err)
	}
	if err := a.HoldOutbox(ctx, both[1].ID, time.Minute); err != nil {
		t.Errorf("a holds r2 once r1 is delivered: %v; want nil", err)
	}
	// a's lease runs out before its renewal notices: it sends nothing more.
	expire(t, p, a)
	if err := a.HoldOutbox(ctx, both[1].ID, time.Minute); !errors.Is(err, store.ErrNotHeld) {
		t.Errorf("a holds r2 with its lease lost: %v; want ErrNotHeld", err)
	}
}
