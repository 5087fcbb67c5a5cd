package postgres_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/postgres"
)

// What a replica's cached history is checked against (gateway.HistoryChecker,
// issue 21): HistoryMarked's mark is the session's last message id and its
// reset mark; HistorySince returns, in one statement, the messages after a
// mark (oldest first, at most the number asked), the reset mark now and the
// busy mode; another session's messages are not in it.
func TestHistorySinceAMark(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	s := open(t, url, postgres.Options{Shared: true})
	db := connect(t, url)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	msg := func(session, run, role, text, reason string) {
		t.Helper()
		exec(`INSERT INTO sessions (key, created_at, updated_at) VALUES ($1, now(), now()) ON CONFLICT DO NOTHING`, session)
		exec(`INSERT INTO messages (session_key, run_id, role, text, stop_reason, created_at) VALUES ($1, $2, $3, $4, $5, now())`,
			session, run, role, text, reason)
	}

	// A session that has nothing yet.
	h, mark, err := s.HistoryMarked(ctx, "k", 10)
	if err != nil || len(h) != 0 || mark != (postgres.HistoryMark{}) {
		t.Fatalf("HistoryMarked of a new session = %v, %+v, %v", h, mark, err)
	}
	since, err := s.HistorySince(ctx, "k", mark, 3)
	if err != nil || !reflect.DeepEqual(since, postgres.HistorySince{}) {
		t.Fatalf("HistorySince of a new session = %+v, %v", since, err)
	}

	msg("k", "r1", "user", "one", "")
	msg("k", "r1", "assistant", "re one", "stop")
	msg("other", "o1", "user", "elsewhere", "")
	h, mark, err = s.HistoryMarked(ctx, "k", 10)
	if err != nil || len(h) != 2 || mark.LastID == 0 || mark.ResetAfter != 0 {
		t.Fatalf("HistoryMarked = %v, %+v, %v", h, mark, err)
	}
	since, err = s.HistorySince(ctx, "k", mark, 3)
	if err != nil || !reflect.DeepEqual(since, postgres.HistorySince{Mark: mark}) {
		t.Fatalf("HistorySince with nothing new = %+v, %v (mark %+v)", since, err, mark)
	}

	msg("k", "r2", "user", "two", "")
	msg("other", "o2", "user", "elsewhere", "")
	msg("k", "r2", "assistant", "re two", "error")
	msg("k", "r3", "user", "three", "")
	exec(`INSERT INTO session_settings (session_key, busy_mode, updated_at) VALUES ('k', 'queue', now())`)
	since, err = s.HistorySince(ctx, "k", mark, 2)
	want := []postgres.HistoryKey{{RunID: "r2", Role: store.RoleUser}, {RunID: "r2", Role: store.RoleAssistant, StopReason: event.ReasonError}}
	if err != nil || !reflect.DeepEqual(since.Messages, want) || since.BusyMode != "queue" || since.Mark.ResetAfter != 0 {
		t.Fatalf("HistorySince = %+v, %v; want the messages %+v and busy mode queue", since, err, want)
	}
	// The mark reached is the last message returned's: what follows it comes next.
	next, err := s.HistorySince(ctx, "k", since.Mark, 5)
	if err != nil || !reflect.DeepEqual(next.Messages, []postgres.HistoryKey{{RunID: "r3", Role: store.RoleUser}}) {
		t.Fatalf("HistorySince after the reached mark = %+v, %v", next, err)
	}

	// A /new moves the reset mark, which the check returns.
	exec(`UPDATE sessions SET reset_after = (SELECT max(id) FROM messages) WHERE key = 'k'`)
	after, err := s.HistorySince(ctx, "k", next.Mark, 5)
	if err != nil || after.Mark.ResetAfter == 0 || len(after.Messages) != 0 {
		t.Fatalf("HistorySince after a reset = %+v, %v", after, err)
	}
}
