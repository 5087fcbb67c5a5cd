package gateway

import (
	"context"
	"log/slog"
	"testing"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
)

// BenchmarkApprovalRoundTrip is one question's whole path inside the
// gateway: the runner asks (the question is published to every
// subscriber), the person's answer arrives (Resolve), the runner's Ask
// returns with it, the settlement is published, and the runner asks its
// next question. One op is one question, answered.
//
//	go test -run '^$' -bench ApprovalRoundTrip -benchmem ./gateway/
func BenchmarkApprovalRoundTrip(b *testing.B) {
	asker := runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		for {
			if _, err := turn.Ask(ctx, runner.Question{Title: "Run deploy", Tool: "deploy"}); err != nil {
				return runner.Result{}, err
			}
		}
	})
	c := config.Default()
	c.Agents.Defaults.Runner = config.RunnerDemo
	c.Agents.Defaults.TimeoutSeconds = secs(3600)
	if err := c.Validate(); err != nil {
		b.Fatal(err)
	}
	e, err := New(Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{config.RunnerDemo: asker},
		Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.Start(ctx)
	defer e.Shutdown(context.Background())
	asked := make(chan string, 1)
	unsub := e.Bus().Subscribe("", func(ev event.Event) {
		if ev.Kind == event.ApprovalRequested {
			asked <- ev.Approval.ID
		}
	})
	defer unsub()
	if _, err := e.Send(ctx, SendRequest{SessionKey: "s", Channel: "ws", RunID: "r", Text: "go"}); err != nil {
		b.Fatal(err)
	}
	id := <-asked
	b.ResetTimer()
	for range b.N {
		if _, err := e.Resolve(ctx, ResolveRequest{ApprovalID: id, OptionID: "allow", SessionKey: "s", By: "bench"}); err != nil {
			b.Fatal(err)
		}
		id = <-asked
	}
}
