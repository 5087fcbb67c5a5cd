package telegram

import (
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestSplitReplyNotRepeatedOnResend: a long reply goes out in two messages; the first is accepted, the
// second fails (5xx, every try). The sweep resends the reply: the person
// must not read the first part twice.
func TestSplitReplyNotRepeatedOnResend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := setup{store: openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))}
		h := newHarness(t, s)
		word := strings.Repeat("x", 40)
		var words []string
		for range 150 {
			words = append(words, word)
		}
		h.api.fail(fault{Method: "sendMessage", Chat: alice, Skip: 1, Times: maxAttempts, Status: 503, Desc: "503"})
		h.say(alice, "/steps say:"+strings.Join(words, "_"))
		h.advance(time.Minute)
		h.advance(resendInterval)
		h.advance(time.Minute)
		scr := h.screen(alice)
		for i, m := range scr {
			t.Logf("%d: %d chars, starts %.20q", i, len(m), m)
		}
		if len(scr) != 2 {
			t.Fatalf("the chat shows %d messages, want the reply's 2 parts once each", len(scr))
		}
	})
}
