package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/testlog"
	"github.com/turnguard/turnguard/runner"
	execrunner "github.com/turnguard/turnguard/runner/exec"
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
		_, h, _ := e.History(context.Background(), text, 0)
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

// TestExecAgentTracebackStaysWithTheOperator: a real exec agent process
// crashes with a traceback on stderr that prints its API key. The user
// reads an error id; the error ring holds the traceback with the key
// redacted.
func TestExecAgentTracebackStaysWithTheOperator(t *testing.T) {
	script, err := filepath.Abs("testdata/traceback.sh")
	if err != nil {
		t.Fatal(err)
	}
	c := testConfig(t, func(c *config.Config) {
		c.Agents.Defaults.Runner = config.RunnerExec
		c.Agents.Exec.Command, c.Agents.Exec.Env = script, map[string]string{"OPENAI_API_KEY": fakeKey}
	})
	rn, err := execrunner.New(c.Agents.Exec, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{config.RunnerExec: rn}, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	defer e.Shutdown(context.Background())
	ack, err := e.Send(context.Background(), SendRequest{SessionKey: "k", Channel: "ws", Text: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // real time: a real process runs
	defer cancel()
	out, ok := e.Wait(ctx, ack.RunID)
	if !ok {
		t.Fatal("no outcome within 20s")
	}
	m := regexp.MustCompile(`^❌ Something went wrong on my side during plan \(error id (E[0-9A-Z]{5})\)`).FindStringSubmatch(out.Message)
	if m == nil || strings.Contains(out.Message, "Traceback") || strings.Contains(out.Message, fakeKey) {
		t.Fatalf("the user reads %q", out.Message)
	}
	rec, ok := e.ErrorDetail(m[1])
	if !ok || !strings.Contains(rec.Detail, "Incorrect API key provided: [redacted]") || strings.Contains(fmt.Sprint(rec), fakeKey) {
		t.Fatalf("error record %+v", rec)
	}
}
