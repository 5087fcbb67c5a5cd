package ws

import (
	"context"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/store"
)

// TestChatHistoryMarksAResumedNotice: chat.history's messages carry their
// turn's runId, and the notice of an interrupted turn that was dispatched
// again (a resume recorded in a real SQLite store) is marked resumed — the
// web chat offers no Retry on it, as Telegram does not, since a tap would
// run the request a second time. An interrupted turn that was not resumed
// keeps its Retry (no mark).
func TestChatHistoryMarksAResumedNotice(t *testing.T) {
	ctx := context.Background()
	st := openSQLite(t)
	now := time.Now()
	next := store.Resume{RunID: store.ResumeRunID("r2", 2), PrevRunID: "r2", OriginRunID: "r2", SessionKey: "agent:main:main",
		Attempt: 2, OriginStartedAt: now}
	if err := st.QueueResume(ctx, next, store.QueuedMessage{RunID: next.RunID, SessionKey: next.SessionKey, Channel: "ws",
		ChatRef: "c", Text: "second", QueuedAt: now}); err != nil {
		t.Fatal(err)
	}
	history := func(context.Context, string, int) ([]gateway.Message, error) {
		return []gateway.Message{
			{RunID: "r1", Role: "user", Text: "first", Time: now},
			{RunID: "r1", Role: "assistant", Text: "⚠️ Your request was interrupted by a server problem. Please send it again.", StopReason: event.ReasonInterrupted, Time: now},
			{RunID: "r2", Role: "user", Text: "second", Time: now},
			{RunID: "r2", Role: "assistant", Text: messages.Resuming(event.Step{}, 2, 3), StopReason: event.ReasonInterrupted, Time: now},
		}, nil
	}
	e := newTCPEnv(t, envOpts{history: history, opts: Options{Resumed: st.Resumed}})
	c, _ := e.connect("tui", "")
	r := c.call("chat.history", map[string]any{"sessionKey": "main"})
	if !r.OK {
		t.Fatalf("chat.history: %s", r.raw)
	}
	for i, want := range []struct {
		run     string
		resumed any
	}{{"r1", nil}, {"r1", nil}, {"r2", nil}, {"r2", true}} {
		if got := r.str("messages." + string(rune('0'+i)) + ".runId"); got != want.run {
			t.Errorf("message %d: runId %q, want %q", i, got, want.run)
		}
		if got := r.get("messages." + string(rune('0'+i)) + ".resumed"); got != want.resumed {
			t.Errorf("message %d: resumed %v, want %v", i, got, want.resumed)
		}
	}
	if t.Failed() {
		t.Log(r.raw)
	}
}
