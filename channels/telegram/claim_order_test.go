package telegram

import (
	"context"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/store"
)

// TestOlderOutboxRowGoesBeforeAWaitingEnding: a turn's ending holds its
// place in the chat while the store writes it; an outbox row recorded
// before it (a notice left by the previous process, a resend) that claim
// takes meanwhile is older, so the person reads it first — not after the
// newer reply.
func TestOlderOutboxRowGoesBeforeAWaitingEnding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))
		h := newHarness(t, setup{store: st})
		st.hold() // the store has not written the turn's ending yet
		h.say(alice, "/steps say:Hello")
		h.advance(2 * time.Second)
		if _, err := st.st.Enqueue(context.Background(), store.OutboxMessage{Channel: "telegram", ChatRef: "1001",
			RunID: "tg-1001-7", Kind: store.OutboxNotice, Text: "⚠️ The older notice"}); err != nil {
			t.Fatal(err)
		}
		st.release()
		h.advance(5 * time.Second)
		h.wantScreen(alice, "⚠️ The older notice", "Hello")
	})
}
