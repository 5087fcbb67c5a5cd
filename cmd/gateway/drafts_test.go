package main

// Telegram drafts (channels.telegram.streaming: draft, the default) with
// the built gateway against internal/fakebot, which enforces Telegram's
// draft rules.

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/fakebot"
)

// TestTelegramDraftStopAgainstBinary: a turn streams into a draft with a
// Stop button; a tap on it stops the turn with the user stop notice, which
// follows the draft; the next message runs as usual.
func TestTelegramDraftStopAgainstBinary(t *testing.T) {
	const within = 30 * time.Second
	dir := t.TempDir()
	bot := fakebot.New(t)
	p := startGateway(t, dir, telegramConfig(dir, bot))
	bot.Say("/steps say:Half_way shell:hang")
	d := bot.WaitDraft(within, "with the partial reply", func(d fakebot.Draft) bool { return strings.Contains(d.Text, "Half way") })
	if !d.CanStop || d.Texts[0] != "" && d.Texts[0] != "Half way" {
		t.Errorf("draft %+v: want a Stop button, opened as Thinking… or with the reply", d)
	}
	bot.TapStop(d.DraftID)
	bot.WaitSent(within, "the stop notice", func(s string) bool { return strings.HasPrefix(s, "⏹️ Stopped while shell was running") })
	bot.Say("/steps say:Next_one")
	bot.WaitSent(within, "the next reply", func(s string) bool { return s == "Next one" })
	for _, d := range bot.Drafts() {
		if !d.Followed {
			t.Errorf("draft %d (%q) was not followed by a message:%s", d.DraftID, d.Text, bot)
		}
	}
	if n := bot.Count("Half way"); n != 1 {
		t.Errorf("the partial reply reached the chat %d times, want once:%s", n, bot)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(within); code != 0 {
		t.Fatalf("the gateway exited with %d:\n%s", code, p.log())
	}
}
