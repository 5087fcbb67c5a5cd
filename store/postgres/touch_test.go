package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store/postgres"
	"github.com/turnguard/turnguard/store/storetest"
)

// A recorder's batch touches its sessions' rows (updated_at) without ever
// waiting for a lock (issue 21: with three replicas its statement averaged
// 12–22 ms, all lock waits): a claim's or finish's foreign-key lock on the
// row (FOR KEY SHARE, held until their group commits) does not stop it, a
// row another writer holds is left to that writer, and in shared mode a
// session is touched only when its time moves by more than a second; with
// one gateway it is exact.
func TestSessionTouchNeverWaits(t *testing.T) {
	ctx := context.Background()
	sharedURL := pgtest.New(t)
	cases := []struct {
		name   string
		shared bool
		hold   string        // run by another transaction, open while the batch is written ($1: the session)
		at     time.Duration // the turn's start, after the session's updated_at T0
		want   time.Duration // the session's updated_at after the batch, from T0
	}{
		{"a finish in flight holds the row FOR KEY SHARE", true,
			`INSERT INTO messages (session_key, role, text, created_at) VALUES ($1, 'assistant', 'hi', now())`, 5 * time.Second, 5 * time.Second},
		{"another writer holds the row", true,
			`UPDATE sessions SET reset_after = reset_after WHERE key = $1`, 5 * time.Second, 0},
		{"another writer's lock", true, `SELECT FROM sessions WHERE key = $1 FOR UPDATE`, 5 * time.Second, 0},
		{"moved by less than the bound", true, "", 500 * time.Millisecond, 0},
		{"moved by more than the bound", true, "", 1500 * time.Millisecond, 1500 * time.Millisecond},
		{"one gateway: exact", false, "", 500 * time.Millisecond, 500 * time.Millisecond},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := sharedURL
			if !tc.shared {
				url = pgtest.New(t) // one gateway holds its database
			}
			c, other := connect(t, url), connect(t, url)
			s := open(t, url, postgres.Options{Shared: tc.shared})
			tr := storetest.NewTurn(fmt.Sprintf("run-%d", i), fmt.Sprintf("ws:%d", i))
			if _, err := c.Exec(ctx, `INSERT INTO sessions (key, created_at, updated_at) VALUES ($1, $2, $2)`, tr.Session, storetest.T0); err != nil {
				t.Fatal(err)
			}
			if tc.shared { // its claim (cluster/pgcoord) wrote the turn
				if _, err := c.Exec(ctx, `INSERT INTO turns (run_id, session_key, channel, chat_ref, state, started_at, updated_at, owner_replica, owner_epoch)
					VALUES ($1, $2, $3, $4, 'running', $5, $5, 'r1', 1)`, tr.Run, tr.Session, tr.Channel, tr.Chat, storetest.T0.Add(tc.at)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.hold != "" {
				tx, err := other.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback(ctx) }()
				if _, err := tx.Exec(ctx, tc.hold, tr.Session); err != nil {
					t.Fatal(err)
				}
			}
			wctx, cancel := context.WithTimeout(ctx, 3*time.Second) // what waits for the other transaction never returns before it
			defer cancel()
			if err := postgres.WriteBatch(wctx, s, []event.Event{tr.Ev(event.TurnStarted, tc.at, nil)}); err != nil {
				t.Fatalf("the batch waited for the other transaction's lock: %v", err)
			}
			var got time.Time
			if err := c.QueryRow(ctx, `SELECT updated_at FROM sessions WHERE key = $1`, tr.Session).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if want := storetest.T0.Add(tc.want); !got.Equal(want) {
				t.Errorf("the session's updated_at is T0+%v, want T0+%v", got.Sub(storetest.T0), tc.want)
			}
		})
	}
}

// A batch's claimed turn starts and steps never wait for a running turn's
// row that another transaction holds: that transaction ends the turn (its
// owner's Finish in a group commit, a takeover) and writes its steps
// itself; the batch skips the row (issue 21: waiting for it held the
// batch's other rows, and the next group's finishes waited for those). A
// row no one holds gets its limits, sender and steps; should the ending
// roll back, the next batch writes what was skipped.
func TestStepsNeverWaitForATurnBeingEnded(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	c, other := connect(t, url), connect(t, url)
	s := open(t, url, postgres.Options{Shared: true})
	limits := "shell u1 " + storetest.T0.Add(time.Minute).Format(time.RFC3339)
	cases := []struct {
		name       string
		commit     bool   // the ending commits, else rolls back
		wantEnding string // the held turn's step, sender and deadline after the next batch
	}{
		{"the ending commits", true, "NULL  NULL"},
		{"the ending rolls back", false, limits},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ending, free := storetest.NewTurn(fmt.Sprint("run-ending-", i), fmt.Sprint("ws:e", i)), storetest.NewTurn(fmt.Sprint("run-free-", i), fmt.Sprint("ws:f", i))
			for _, tr := range []*storetest.Turn{ending, free} {
				if _, err := c.Exec(ctx, `WITH s AS (INSERT INTO sessions (key, created_at, updated_at) VALUES ($2, $5, $5))
					INSERT INTO turns (run_id, session_key, channel, chat_ref, state, started_at, updated_at, owner_replica, owner_epoch)
					VALUES ($1, $2, $3, $4, 'running', $5, $5, 'r1', 1)`, tr.Run, tr.Session, tr.Channel, tr.Chat, storetest.T0); err != nil {
					t.Fatal(err)
				}
			}
			tx, err := other.Begin(ctx) // the owner's Finish of the ending turn, not committed yet
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, `UPDATE turns SET state = 'finished', step_kind = NULL WHERE run_id = $1`, ending.Run); err != nil {
				t.Fatal(err)
			}
			var evs []event.Event
			for _, tr := range []*storetest.Turn{ending, free} {
				evs = append(evs, tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Sender, e.Deadline = "u1", storetest.T0.Add(time.Minute) }),
					tr.Ev(event.StepStarted, time.Second, func(e *event.Event) { e.Step = storetest.Step("tool", "shell", 1, time.Second) }))
			}
			wctx, cancel := context.WithTimeout(ctx, 3*time.Second) // what waits for the Finish never returns before it
			defer cancel()
			if err := postgres.WriteBatch(wctx, s, evs); err != nil {
				t.Fatalf("the batch waited for the Finish's lock: %v", err)
			}
			if got := turnLimits(t, c, free.Run); got != limits {
				t.Errorf("the free turn: step, sender, deadline %q, want %q", got, limits)
			}
			end := tx.Rollback
			if tc.commit {
				end = tx.Commit
			}
			if err := end(ctx); err != nil {
				t.Fatal(err)
			}
			next := free.Ev(event.StepCompleted, 2*time.Second, func(e *event.Event) { e.Step = storetest.Step("tool", "shell", 1, time.Second) })
			if err := postgres.WriteBatch(ctx, s, []event.Event{next}); err != nil {
				t.Fatal(err)
			}
			if got := turnLimits(t, c, ending.Run); got != tc.wantEnding {
				t.Errorf("the turn being ended: step, sender, deadline %q, want %q", got, tc.wantEnding)
			}
		})
	}
}

// turnLimits is a turn's step name, sender and deadline, NULL for none.
func turnLimits(t *testing.T, c *pgx.Conn, run string) string {
	t.Helper()
	var got string
	if err := c.QueryRow(context.Background(), `SELECT concat_ws(' ', coalesce(step_name, 'NULL'), sender,
			coalesce(to_char(deadline_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), 'NULL')) FROM turns WHERE run_id = $1`, run).Scan(&got); err != nil {
		t.Fatal(err)
	}
	return got
}
