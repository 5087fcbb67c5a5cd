// Package convtest is the conformance suite of the conversation core: the
// same cases — the commands, the busy modes, the delivery of answers and
// notices — run against every channel, through what a person does (sends a
// message) and sees (the texts that reach them, in order). A channel passes
// it by implementing Harness over its real transport (Telegram: the real
// client against the fake Bot API; WebSocket: a real gorilla client over an
// in-memory pipe) with a real engine and the demo runner behind it.
//
// Every case runs inside a testing/synctest bubble (fake, deterministic
// time): a harness must be buildable in one, and its Next must block on
// something the bubble sees as durably blocked (a channel, a net.Pipe).
// Nothing is slept on; time moves only when every goroutine waits.
package convtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
)

// Harness is one person talking to the gateway through the channel under
// test, in one conversation (one session).
type Harness interface {
	// Send is the person sending text. It returns once the channel has
	// handed the message on (the engine has it, or the channel answered
	// it); answers it produced are then the next texts Next returns.
	Send(text string)
	// Next returns the next text the person sees — a reply, a stop or
	// timeout notice, the answer to a command, the answer to a message
	// sent while busy (queued, refused, …) — in the order they see them.
	// It returns ctx's error when ctx ends first. Texts a channel shows
	// that others do not (Telegram's tool lines) may be among them.
	Next(ctx context.Context) (string, error)
}

// NewHarness builds a harness inside the calling synctest bubble: a real
// engine with the demo runner (under the name "demo", the default runner),
// configured by adjust (never nil) applied to the channel's test configuration, the
// channel under test, and one person connected to it. The harness cleans
// up after itself (t.Cleanup), releasing the demo runner's hung steps.
type NewHarness func(t *testing.T, adjust func(*config.Config)) Harness

// patience is how long (fake time) a case waits for a text it expects.
const patience = 10 * time.Minute

// Run runs every conformance case against the channel newHarness builds,
// each in its own synctest bubble.
func Run(t *testing.T, newHarness NewHarness) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				adjust := c.adjust
				if adjust == nil {
					adjust = func(*config.Config) {}
				}
				p := &person{t: t, h: newHarness(t, adjust)}
				c.run(p)
			})
		})
	}
}

// person drives a harness and remembers everything it saw, for failure
// messages.
type person struct {
	t    *testing.T
	h    Harness
	seen []string
}

func (p *person) send(text string) {
	p.t.Helper()
	p.seen = append(p.seen, "» "+text)
	p.h.Send(text)
}

// next returns the next text seen within d.
func (p *person) next(d time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	s, err := p.h.Next(ctx)
	if err == nil {
		p.seen = append(p.seen, s)
	}
	return s, err
}

// expect reads what the person sees until a text for which match holds
// and returns it; the texts before it are skipped (a channel's own
// extras), unless one matches a forbidden word.
func (p *person) expect(what string, match func(string) bool, forbidden ...string) string {
	p.t.Helper()
	for {
		s, err := p.next(patience)
		if err != nil {
			p.t.Fatalf("waiting for %s: %v; the person saw:\n%s", what, err, p.transcript())
		}
		if match(s) {
			return s
		}
		for _, f := range forbidden {
			if strings.Contains(s, f) {
				p.t.Fatalf("waiting for %s the person saw %q, which must not appear; everything seen:\n%s", what, s, p.transcript())
			}
		}
	}
}

// see waits for a text that contains want.
func (p *person) see(want string, forbidden ...string) string {
	p.t.Helper()
	return p.expect(quote(want), func(s string) bool { return strings.Contains(s, want) }, forbidden...)
}

// seeExactly waits for a text that is want.
func (p *person) seeExactly(want string, forbidden ...string) {
	p.t.Helper()
	p.expect("exactly "+quote(want), func(s string) bool { return s == want }, forbidden...)
}

// quiet checks that nothing with one of the words arrives within d (fake
// time); other texts are fine.
func (p *person) quiet(d time.Duration, words ...string) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		s, err := p.next(left)
		if errors.Is(err, context.DeadlineExceeded) {
			return
		}
		if err != nil {
			p.t.Fatalf("while checking that nothing arrives: %v", err)
		}
		for _, w := range words {
			if strings.Contains(s, w) {
				p.t.Fatalf("the person saw %q, which must not appear; everything seen:\n%s", s, p.transcript())
			}
		}
	}
}

func (p *person) transcript() string {
	var b strings.Builder
	for _, s := range p.seen {
		b.WriteString("  " + quote(s) + "\n")
	}
	return b.String()
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, "\n", `\n`) + `"` }
