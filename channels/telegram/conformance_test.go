package telegram

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/turnguard/turnguard/channels/conv/convtest"
	"github.com/turnguard/turnguard/config"
)

// tgPerson is a person in a private chat with the bot: what they type is an
// update; what they read is each message the bot sends to the chat, in
// order (edits of the live progress message are not new texts).
type tgPerson struct {
	h    *harness
	chat int64
	read int // sendMessage calls already returned by Next
}

// TestConformance runs the conversation core's conformance suite through
// the real Telegram client against the fake Bot API (fake time), wired as
// cmd/gateway wires it: durable endings written by a real SQLite store
// (its own file per case) and claimed from its outbox.
func TestConformance(t *testing.T) {
	convtest.Run(t, func(t *testing.T, adjust func(*config.Config)) convtest.Harness {
		s := setup{adjust: adjust, store: openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))}
		return &tgPerson{h: newHarness(t, s), chat: alice}
	})
}

func (p *tgPerson) Send(text string) { p.h.say(p.chat, text) }

func (p *tgPerson) Next(ctx context.Context) (string, error) {
	for {
		var sent []string
		for _, c := range p.h.api.callsTo("sendMessage", p.chat) {
			if c.Fault == "" {
				sent = append(sent, c.Text)
			}
		}
		if len(sent) > p.read {
			p.read++
			return sent[p.read-1], nil
		}
		select {
		case <-p.h.api.notify:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}
