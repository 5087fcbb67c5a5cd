package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway/event"
	"github.com/turnguard/turnguard/internal/testlog"
	"github.com/turnguard/turnguard/runner"
)

const fakeKey = "sk-test-FAKEKEY0123456789"

// TestRunnerFailureShowsOnlyAnErrorID: a runner whose error carries stderr
// lines with a configured secret, and one that panics: what the user reads
// (the Finished event, the outcome, the history) holds neither the error
// nor the panic, only an error id, which the log names with the details.
func TestRunnerFailureShowsOnlyAnErrorID(t *testing.T) {
	logs := &testlog.Buffer{}
	c := testConfig(t, func(c *config.Config) { c.Agents.OpenAI.APIKey = fakeKey })
	rn := runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		cb.StepStarted("tool", "shell")
		if turn.Message == "panic" {
			panic("nil map write near " + fakeKey)
		}
		return runner.Result{}, fmt.Errorf("exec: %w", errors.New("exit status 1: Traceback (most recent call last):\n  File \"a.py\"\nAuthenticationError: bad key "+fakeKey))
	})
	e, err := New(Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": rn}, Log: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	defer e.Shutdown(context.Background())
	finished := make(chan string, 2)
	e.Bus().Subscribe("", func(ev event.Event) {
		if ev.Kind == event.Finished {
			finished <- ev.Message
		}
	})
	id := regexp.MustCompile(`^❌ Something went wrong on my side during shell \(error id (E[0-9A-Z]{5})\) — try again, or tell the operator this id\.$`)
	for _, text := range []string{"hi", "panic"} {
		ack, err := e.Send(context.Background(), SendRequest{SessionKey: text, Channel: "ws", Text: text})
		if err != nil {
			t.Fatal(err)
		}
		out, _ := e.Wait(context.Background(), ack.RunID)
		_, h := e.History(context.Background(), text, 0)
		for _, user := range []string{out.Message, h[len(h)-1].Text, <-finished} {
			m := id.FindStringSubmatch(user)
			if m == nil {
				t.Fatalf("%s: the user reads %q", text, user)
			}
			if !strings.Contains(logs.String(), "errorId="+m[1]) {
				t.Fatalf("%s: the log does not name %s:\n%s", text, m[1], logs)
			}
		}
	}
	if strings.Contains(logs.String(), fakeKey) {
		t.Fatalf("the log holds the secret:\n%s", logs)
	}
}

// TestUserErrorShownWithoutSecrets: a message a runner wrote for the user
// is shown as it is, but never with a configured secret in it.
func TestUserErrorShownWithoutSecrets(t *testing.T) {
	c := testConfig(t, func(c *config.Config) { c.Channels.Telegram.Token = "123:" + fakeKey })
	rn := runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		return runner.Result{}, &runner.UserError{Message: "The agent could not log in with 123:" + fakeKey + "; check its setup."}
	})
	e, err := New(Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": rn}})
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	defer e.Shutdown(context.Background())
	ack, err := e.Send(context.Background(), SendRequest{SessionKey: "k", Channel: "ws", Text: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := e.Wait(context.Background(), ack.RunID)
	if out.Message != "The agent could not log in with [redacted]; check its setup." {
		t.Fatalf("the user reads %q", out.Message)
	}
}
