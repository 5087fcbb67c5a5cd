package ws

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/store"
)

// TestChatAbortCancelsAQueuedRun: chat.abort with a queued message's runId
// (OpenClaw's cancel of one queued run) answers {ok, aborted: true,
// runIds: [id]}, removes it from the durable queue (a real SQLite file)
// before answering, and it never runs; the running turn and the other
// queued message are untouched. Another client cannot cancel it; a second
// cancel finds nothing.
func TestChatAbortCancelsAQueuedRun(t *testing.T) {
	ctx := context.Background()
	st := openSQLite(t)
	e := newTCPEnv(t, envOpts{opts: Options{Token: "T"}, queue: sqliteQueue{st}})
	owner := e.connectDevice(deviceKey(21), "T", nil)
	stranger := e.connectDevice(deviceKey(22), "T", nil)
	send := func(id, text string) frame {
		t.Helper()
		return owner.call("chat.send", map[string]any{"sessionKey": "main", "message": text, "idempotencyKey": id})
	}
	send("r1", "/steps shell:hang")
	for _, id := range []string{"r2", "r3"} {
		if r := send(id, "/steps say:Reply_"+id); !r.OK || r.str("status") != "queued" {
			t.Fatalf("chat.send %s: %s", id, r.raw)
		}
	}
	stored := func() []string {
		t.Helper()
		ms, err := st.Queued(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range ms {
			ids = append(ids, m.RunID)
		}
		return ids
	}
	if got := stored(); !slices.Equal(got, []string{"r2", "r3"}) {
		t.Fatalf("stored queue %v, want r2 r3", got)
	}
	if r := stranger.call("chat.abort", map[string]any{"sessionKey": "main", "runId": "r2"}); r.OK || r.Error.Code != "FORBIDDEN" {
		t.Fatalf("another client's cancel: %s", r.raw)
	}
	r := owner.call("chat.abort", map[string]any{"sessionKey": "main", "runId": "r2"})
	if !r.OK || r.get("ok") != true || r.get("aborted") != true || r.str("runIds") != "[r2]" ||
		r.str("text") != messages.QueueCancelled("/steps say:Reply_r2") {
		t.Fatalf("chat.abort of the queued r2: %s", r.raw)
	}
	if got := stored(); !slices.Equal(got, []string{"r3"}) {
		t.Fatalf("stored queue after the cancel %v, want r3", got)
	}
	if r := owner.call("chat.abort", map[string]any{"sessionKey": "main", "runId": "r2"}); !r.OK || r.get("aborted") != false || r.str("runIds") != "[]" {
		t.Fatalf("a second cancel of r2: %s", r.raw)
	}
	// The web chat's Cancel (queued: true) never stops a running turn.
	if r := owner.call("chat.abort", map[string]any{"sessionKey": "main", "runId": "r1", "queued": true}); !r.OK || r.get("aborted") != false {
		t.Fatalf("a queued-only cancel of the running r1: %s", r.raw)
	}
	// The running turn is stopped (the TUI's Esc): r3 runs, r2 never does.
	if r := owner.call("chat.abort", map[string]any{"sessionKey": "main", "runId": "r1"}); !r.OK || r.get("aborted") != true {
		t.Fatalf("chat.abort of the running r1 (still running after the queued-only cancel): %s", r.raw)
	}
	if f := owner.chat("r3", "final"); f.str("message.content.0.text") != "Reply r3" {
		t.Fatalf("r3's final: %s", f.raw)
	}
	if got := owner.runEvents("r2"); len(got) != 0 {
		t.Fatalf("the cancelled r2 ran: %v", got)
	}
}

// sqliteQueue is the engine's QueueStore on a real SQLite store (as
// cmd/gateway wires it), so a test sees what a queued message leaves on
// disk. Queued is not used here: nothing is restored.
type sqliteQueue struct{ st *store.SQLite }

func (q sqliteQueue) AddQueued(ctx context.Context, m gateway.QueuedMessage) error {
	return q.st.AddQueued(ctx, store.QueuedMessage{RunID: m.RunID, SessionKey: m.SessionKey, Channel: m.Channel,
		ChatRef: m.ChatRef, Owner: m.Owner, Text: m.Text, QueuedAt: m.QueuedAt, Timeout: m.Timeout})
}

func (q sqliteQueue) RemoveQueued(ctx context.Context, runIDs ...string) error {
	return q.st.RemoveQueued(ctx, runIDs...)
}

func (sqliteQueue) Queued(context.Context) ([]gateway.QueuedMessage, error) { return nil, nil }

// openSQLite opens a real SQLite store in a temporary directory, closed
// when the test ends.
func openSQLite(t *testing.T) *store.SQLite {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "gateway.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestQueueCancelReachesTheSessionsOtherClients: when a queued message is
// cancelled — by chat.abort of its runId from one gorilla client, or by
// Telegram's Cancel button (the engine's CancelQueued, as the Telegram
// channel calls it) — every other client watching the session gets a
// "queue" event at once (state "cancelled", the message's runId, the
// words), so a second web chat tab marks it not sent without a reload. A
// client watching another session gets nothing.
func TestQueueCancelReachesTheSessionsOtherClients(t *testing.T) {
	e := newTCPEnv(t, envOpts{opts: Options{Token: "T"}})
	owner := e.connectDevice(deviceKey(31), "T", nil)
	tab := e.connectDevice(deviceKey(31), "T", nil) // the same person's second tab
	other := e.connectDevice(deviceKey(32), "T", nil)
	for _, c := range []*client{tab, other} {
		key := map[*client]string{tab: "main", other: "elsewhere"}[c]
		if r := c.call("chat.history", map[string]any{"sessionKey": key}); !r.OK {
			t.Fatalf("chat.history: %s", r.raw)
		}
	}
	send := func(id, text string) {
		t.Helper()
		if r := owner.call("chat.send", map[string]any{"sessionKey": "main", "message": text, "idempotencyKey": id}); !r.OK {
			t.Fatalf("chat.send %s: %s", id, r.raw)
		}
	}
	send("q1", "/steps shell:hang")
	send("q2", "first queued")
	send("q3", "second queued")
	cancelled := func(c *client, run string) frame {
		t.Helper()
		return c.until("the queue event of "+run, func(f frame) bool { return f.Event == "queue" && f.str("runId") == run })
	}

	if r := owner.call("chat.abort", map[string]any{"sessionKey": "main", "runId": "q2", "queued": true}); !r.OK || r.get("aborted") != true {
		t.Fatalf("chat.abort of the queued q2: %s", r.raw)
	}
	f := cancelled(tab, "q2")
	if f.str("state") != "cancelled" || f.str("sessionKey") != "agent:main:main" || f.str("text") != messages.QueueCancelled("first queued") {
		t.Fatalf("the other tab's queue event: %s", f.raw)
	}

	// Telegram's Cancel button goes through the engine's CancelQueued.
	if res, err := e.eng.CancelQueued(context.Background(), "agent:main:main", "q3", "", true); err != nil || !res.Aborted {
		t.Fatalf("CancelQueued(q3) = %+v, %v", res, err)
	}
	if f := cancelled(tab, "q3"); f.str("text") != messages.QueueCancelled("second queued") {
		t.Fatalf("the queue event of q3: %s", f.raw)
	}
	cancelled(owner, "q3")

	if r := owner.call("chat.abort", map[string]any{"sessionKey": "main", "runId": "q1"}); !r.OK || r.get("aborted") != true {
		t.Fatalf("chat.abort of the running q1: %s", r.raw)
	}
	owner.chat("q1", "aborted")
	if r := other.call("status", nil); !r.OK {
		t.Fatalf("status: %s", r.raw)
	}
	for _, f := range other.all {
		if f.Event == "queue" {
			t.Fatalf("a client of another session got %s", f.raw)
		}
	}
}
