package conv_test

import (
	"context"
	"sync"
	"testing"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/channels/conv/convtest"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
)

// loopback is a whole channel: a person's messages go through conv.Handle,
// the bus's events of the session come back as texts. It is the proof that
// a new channel is one package plus one line of wiring.
type loopback struct {
	eng  *gateway.Engine
	cfg  *config.Source
	key  string
	mu   sync.Mutex
	out  []string // what the person has not read yet
	wake chan struct{}
}

func newLoopback(eng *gateway.Engine, cfg *config.Source, key string) *loopback {
	l := &loopback{eng: eng, cfg: cfg, key: key, wake: make(chan struct{}, 1)}
	eng.Bus().Subscribe(key, l.onEvent)
	return l
}

// onEvent turns the events a person must see into texts. It never blocks.
func (l *loopback) onEvent(ev event.Event) {
	switch {
	case ev.Kind == event.Finished && ev.StopReason == event.ReasonStop:
		l.show(ev.FullText)
	case ev.Kind == event.Finished, ev.Kind == event.Aborted, ev.Kind == event.Progress:
		l.show(ev.Message)
	}
}

func (l *loopback) show(text string) {
	l.mu.Lock()
	l.out = append(l.out, text)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Send is a person's message arriving.
func (l *loopback) Send(text string) {
	ans := conv.Handle(context.Background(), l.eng, l.cfg.Current(), conv.Inbound{
		SessionKey: l.key, Channel: "loopback", ChatRef: l.key, Text: text,
	})
	if ans.Text != "" {
		l.show(ans.Text)
	}
}

// Next is the next text the person sees.
func (l *loopback) Next(ctx context.Context) (string, error) {
	for {
		l.mu.Lock()
		if len(l.out) > 0 {
			s := l.out[0]
			l.out = l.out[1:]
			l.mu.Unlock()
			return s, nil
		}
		l.mu.Unlock()
		select {
		case <-l.wake:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

func TestLoopbackConformance(t *testing.T) {
	convtest.Run(t, func(t *testing.T, adjust func(*config.Config)) convtest.Harness {
		c := config.Default()
		adjust(c)
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		src, d := config.NewSource(c), demo.New()
		eng, err := gateway.New(gateway.Options{Config: src, Runners: map[string]runner.Runner{"demo": d}})
		if err != nil {
			t.Fatal(err)
		}
		eng.Start(context.Background())
		t.Cleanup(func() { d.Release(); eng.Shutdown(context.Background()) })
		return newLoopback(eng, src, "loopback:alice")
	})
}
