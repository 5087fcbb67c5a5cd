package main

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/fakebot"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/store"
)

// TestTelegramCancelQueuedAgainstBinary (issue 23), the built gateway (its
// SQLite file) and the fake Bot API: a message sent while a turn runs is
// answered "📥 Queued" with a Cancel button; a tap cancels it — the toast
// and the answer, edited without its button, say so, and it is gone from
// the durable queue at once — while the other queued message stays, and
// runs after the running turn; the cancelled one never runs. A second tap
// reads that it is no longer waiting.
func TestTelegramCancelQueuedAgainstBinary(t *testing.T) {
	dir := t.TempDir()
	bot := fakebot.New(t)
	p := startGateway(t, dir, telegramConfig(dir, bot))
	alice := fakebot.User{ID: fakebot.Chat, FirstName: "Alice"}
	const within = 15 * time.Second

	bot.Say("/steps work:8s say:First")
	bot.Say("/steps say:Never")
	queued := func(after int) fakebot.Shown {
		return bot.WaitShown(within, "a queued answer with Cancel", func(s fakebot.Shown) bool {
			return s.ID > after && strings.HasPrefix(s.Text, "📥 Queued") && s.Button(messages.QueueCancelLabel) != ""
		})
	}
	never := queued(0)
	bot.Say("/steps say:Later")
	later := queued(never.ID)
	data := never.Button(messages.QueueCancelLabel)
	if !strings.HasPrefix(data, "qc:") || len(data) > 64 {
		t.Fatalf("the Cancel button's data %q, want qc:<run id> within 64 bytes", data)
	}
	if got := storedTexts(t, filepath.Join(dir, "gateway.db")); !slices.Equal(got, []string{"/steps say:Never", "/steps say:Later"}) {
		t.Fatalf("stored queue %q before the tap", got)
	}

	cancelled := messages.QueueCancelled("/steps say:Never")
	if a := bot.WaitAnswer(within, bot.Press(alice, never.ID, data)); a.Text != cancelled {
		t.Fatalf("the tap answered %q, want %q", a.Text, cancelled)
	}
	if got := storedTexts(t, filepath.Join(dir, "gateway.db")); !slices.Equal(got, []string{"/steps say:Later"}) {
		t.Fatalf("stored queue %q after the tap, want the later message only", got)
	}
	bot.WaitShown(within, "the cancelled answer without its button", func(s fakebot.Shown) bool {
		return s.ID == never.ID && s.Text == cancelled && s.Buttons == nil
	})
	if a := bot.WaitAnswer(within, bot.Press(alice, never.ID, data)); a.Text != messages.QueueNotWaiting {
		t.Fatalf("a second tap answered %q, want %q", a.Text, messages.QueueNotWaiting)
	}
	bot.WaitShown(within, "the first reply", func(s fakebot.Shown) bool { return s.Text == "First" })
	bot.WaitShown(within, "the later reply", func(s fakebot.Shown) bool { return s.ID > later.ID && s.Text == "Later" })
	for _, s := range bot.Shown() {
		if s.Text == "Never" {
			t.Fatalf("the cancelled message ran:%s\ngateway log:\n%s", bot, p.log())
		}
	}
}

// TestQueueModeSurvivesRestart (issue 23), the built gateway and the fake
// Bot API: /queue reject sets the chat's busy mode; after a restart the
// chat still has it — /queue says so, and a message sent while a request
// runs is refused instead of queued — until /queue default.
func TestQueueModeSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	bot := fakebot.New(t)
	cfg := telegramConfig(dir, bot)
	const within = 15 * time.Second
	shown := func(what, text string) {
		t.Helper()
		bot.WaitShown(within, what, func(s fakebot.Shown) bool { return s.Text == text })
	}

	p := startGateway(t, dir, cfg)
	bot.Say("/queue reject")
	shown("the mode set", messages.QueueModeSet("reject"))
	p.signal(syscall.SIGTERM)
	if code := p.wait(within); code != 0 {
		t.Fatalf("the gateway exited with %d:\n%s", code, p.log())
	}

	p = startGateway(t, dir, cfg)
	bot.Say("/queue")
	bot.WaitShown(within, "/queue after the restart", func(s fakebot.Shown) bool {
		return strings.HasPrefix(s.Text, "📥 Busy mode: reject (set for this chat) — ")
	})
	bot.Say("/steps work:5s say:First")
	bot.Say("/steps say:Refused")
	shown("the refusal", messages.Busy)
	shown("the first reply", "First")
	bot.Say("/queue default")
	shown("the configured mode again", messages.QueueModeDefault("queue"))
	if n := bot.Count("Refused"); n != 0 {
		t.Errorf("the refused message ran:%s\ngateway log:\n%s", bot, p.log())
	}
}

// storedTexts lists the texts of the queued messages in the store file at
// path (the gateway holds its lock), oldest first.
func storedTexts(t *testing.T, path string) []string {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, path, store.Options{Unlocked: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ms, err := st.Queued(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.Text)
	}
	return out
}
