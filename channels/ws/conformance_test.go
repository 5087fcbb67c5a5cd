package ws

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/turnguard/turnguard/channels/conv/convtest"
	"github.com/turnguard/turnguard/config"
)

// wsPerson is a person using a WebSocket client (the web chat, the TUI):
// chat.send for what they type; what they read is the words of chat.send's
// answers (a busy message's status, a refusal) and of the chat events —
// replies, stop and timeout notices, a command's words — and the progress
// notices on tool lines.
type wsPerson struct {
	c       *client
	session string
	n       int
	texts   []string
	frames  chan frame // read by one goroutine: a read deadline would break the connection
}

// TestConformance runs the conversation core's conformance suite over a
// real gorilla WebSocket client on an in-memory pipe (fake time): as the
// TUI connects, and as the web chat page does (its client id and mode, a
// signed device key, the gateway token, its own session) — the web chat's
// server side.
func TestConformance(t *testing.T) {
	for _, client := range []string{"tui", "webchat"} {
		t.Run(client, func(t *testing.T) {
			convtest.Run(t, func(t *testing.T, adjust func(*config.Config)) convtest.Harness {
				p := &wsPerson{session: "main", frames: make(chan frame, 64)}
				if client == "tui" {
					e := newPipeEnv(t, envOpts{adjust: adjust})
					p.c, _ = e.connect("tui", "")
				} else {
					const token = "web-token-conformance"
					e := newPipeEnv(t, envOpts{adjust: adjust, opts: Options{Token: token}})
					p.c, p.session = e.connectSigned("webchat", deviceKey(7), token, nil), "agent:main:web"
				}
				p.c.wait = 24 * time.Hour // fake time: the cases wait up to minutes for a deadline
				go p.readAll()
				return p
			})
		})
	}
}

// readAll reads frames until the connection closes.
func (p *wsPerson) readAll() {
	defer close(p.frames)
	for {
		f, err := p.c.readRaw()
		if err != nil {
			return
		}
		p.frames <- f
	}
}

func (p *wsPerson) Send(text string) {
	p.n++
	id := p.c.request("chat.send", map[string]any{"sessionKey": p.session, "message": text, "idempotencyKey": fmt.Sprintf("p-%d", p.n)})
	for f := range p.frames {
		if f.Type == "res" && f.ID == id {
			switch {
			case f.Error != nil:
				p.texts = append(p.texts, f.Error.Message)
			case f.str("text") != "":
				p.texts = append(p.texts, f.str("text"))
			}
			return
		}
		p.see(f)
	}
	p.c.t.Fatalf("the connection closed before chat.send %q was answered", text)
}

func (p *wsPerson) Next(ctx context.Context) (string, error) {
	for len(p.texts) == 0 {
		select {
		case f, ok := <-p.frames:
			if !ok {
				return "", errors.New("the connection closed")
			}
			p.see(f)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	s := p.texts[0]
	p.texts = p.texts[1:]
	return s, nil
}

// see keeps the words of an event frame.
func (p *wsPerson) see(f frame) {
	if f.Type != "event" {
		return
	}
	var s string
	switch {
	case f.Event == "chat" && f.str("state") == "final":
		s = f.str("message.content.0.text")
	case f.Event == "chat" && (f.str("state") == "aborted" || f.str("state") == "error"):
		s = f.str("errorMessage")
	case f.Event == "agent":
		s = f.str("data.progressText")
	}
	if s != "" {
		p.texts = append(p.texts, s)
	}
}
