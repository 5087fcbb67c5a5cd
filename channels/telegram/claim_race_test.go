package telegram

import (
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestClaimBeforeOnEventDoesNotStallChat: the store (subscribed first, as in cmd/gateway) commits a turn's
// ending and the channel claims the row before its own onEvent runs (other
// subscribers — metrics, alerts — sit in between). The next answer must
// not wait claimWait (10 s) behind a placeholder that never fills.
func TestClaimBeforeOnEventDoesNotStallChat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))
		st.slowSubscribers = true
		h := newHarness(t, setup{store: st})
		h.say(alice, "/steps say:Hello")
		h.advance(3 * time.Second)
		h.say(alice, "/status")
		h.advance(3 * time.Second)
		h.wantScreen(alice, "Hello", textIdle)
		h.advance(10 * time.Second)
		h.wantScreen(alice, "Hello", textIdle)
		if logs := h.logs.String(); strings.Contains(logs, "has not recorded a turn's ending in time") {
			t.Errorf("a false warning was logged:\n%s", logs)
		}
	})
}
