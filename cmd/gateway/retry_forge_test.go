package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/fakebot"
	"github.com/turnguard/turnguard/messages"
)

// TestForgedRetryAgainstBinary (issue 19), the built gateway and the fake
// Bot API: forged callback data — the predictable run id of a message that
// finished normally, in the earlier "retry:<run id>" form, eight times —
// starts nothing and each tap reads the expired toast (eight forged taps
// started eight runs before). A real Retry button under a timeout notice
// is refused to another user id, runs once for its sender, and is refused
// when replayed after that retry ended.
func TestForgedRetryAgainstBinary(t *testing.T) {
	dir := t.TempDir()
	bot := fakebot.New(t)
	// Timeouts of a second: a hanging step's notice comes at once.
	cfg := strings.Replace(telegramConfig(dir, bot), "    abortGraceSeconds: 5\n", "    abortGraceSeconds: 1\n    stepTimeoutSeconds: 1\n", 1)
	p := startGateway(t, dir, cfg)
	alice := fakebot.User{ID: fakebot.Chat, FirstName: "Alice"}
	mallory := fakebot.User{ID: 666, FirstName: "Mallory"}
	const within = 15 * time.Second

	msgID := bot.Say("/steps say:Hello")
	reply := bot.WaitShown(within, "the reply", func(s fakebot.Shown) bool { return s.Text == "Hello" })
	if reply.Buttons != nil {
		t.Fatalf("a reply carries buttons %q", reply.Labels())
	}
	forged := fmt.Sprintf("retry:tg-%d-%d", fakebot.Chat, msgID)
	for range 8 {
		if a := bot.WaitAnswer(within, bot.Press(alice, reply.ID, forged)); a.Text != messages.RetryExpired {
			t.Fatalf("a forged tap %q answered %q, want %q", forged, a.Text, messages.RetryExpired)
		}
	}

	bot.Say("/steps shell:hang")
	notice := bot.WaitShown(within, "the timeout notice with Retry", func(s fakebot.Shown) bool {
		return strings.HasPrefix(s.Text, "⚠️ No progress") && s.Buttons != nil
	})
	data := notice.Button("🔁 Retry")
	if !strings.HasPrefix(data, "rt:") || len(data) > 64 {
		t.Fatalf("the Retry button's data %q, want rt:<token> within 64 bytes", data)
	}
	if a := bot.WaitAnswer(within, bot.Press(mallory, notice.ID, data)); a.Text != messages.RetryNotOwner {
		t.Fatalf("another user's tap answered %q, want %q", a.Text, messages.RetryNotOwner)
	}
	if a := bot.WaitAnswer(within, bot.Press(alice, notice.ID, data)); a.Text != messages.RetrySending {
		t.Fatalf("the sender's tap answered %q, want %q", a.Text, messages.RetrySending)
	}
	bot.WaitShown(within, "the retried request's notice", func(s fakebot.Shown) bool {
		return s.ID > notice.ID && strings.HasPrefix(s.Text, "⚠️ No progress")
	})
	if a := bot.WaitAnswer(within, bot.Press(alice, notice.ID, data)); a.Text != messages.RetryUsed {
		t.Fatalf("the replayed tap answered %q, want %q", a.Text, messages.RetryUsed)
	}
	// A chat's updates are handled in order, and a message sent now waits
	// for (or replaces) any turn a tap started: once it is answered, such
	// a turn would show.
	bot.Say("/steps say:Marker")
	bot.WaitShown(within, "the marker", func(s fakebot.Shown) bool { return s.Text == "Marker" })
	if n := bot.Count("Hello") + bot.Count("I stopped this request"); n != 1 {
		t.Errorf("the finished message ran %d times, want once:%s", n, bot)
	}
	if n := bot.Count("No progress"); n != 2 {
		t.Errorf("%d timeout notices, want 2 (the request and its one retry):%s\ngateway log:\n%s", n, bot, p.log())
	}
}
