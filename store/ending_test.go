//go:build unix

package store_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// crashEnv tells the test binary, started again by
// TestEndTurnWritesOutboxInSameTx, to be the process that crashes.
const crashEnv = "TURNGUARD_STORE_CRASH_AT"

// TestEndTurnWritesOutboxInSameTx kills a real process (SIGKILL) that is
// recording a Telegram turn's end — just before the transaction commits and
// just after — and opens its SQLite file again: the outbox row exists if
// and only if the turn's end is recorded. Before the commit, the turn is
// still running (the next start reports it interrupted and queues that
// notice); after it, the reply is pending delivery.
func TestEndTurnWritesOutboxInSameTx(t *testing.T) {
	if at := os.Getenv(crashEnv); at != "" {
		crashWhileEnding(t, at)
		return
	}
	for _, tc := range []struct {
		at          string
		ended       bool
		wantPending []string
	}{
		{"before-commit", false, nil},
		{"after-commit", true, []string{"final:The answer", "notice:⚠️ limit"}},
	} {
		t.Run(tc.at, func(t *testing.T) {
			path := dbPath(t)
			cmd := exec.Command(os.Args[0], "-test.run=^TestEndTurnWritesOutboxInSameTx$", "-test.count=1")
			cmd.Env = append(os.Environ(), crashEnv+"="+tc.at, "TURNGUARD_STORE_CRASH_DB="+path)
			out, err := cmd.CombinedOutput() // real time: a real process is killed mid-write
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("crashing process: err %v, want killed by SIGKILL; output:\n%s", err, out)
			}
			s := open(t, path, store.Options{OutboxChannels: []string{"telegram"}})
			tr := mustTurn(t, s, "run-1")
			if ended := tr.State != store.TurnRunning; ended != tc.ended {
				t.Errorf("turn state after the crash = %s, want ended %v", tr.State, tc.ended)
			}
			p, err := s.Pending(context.Background(), "telegram", 0)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range p {
				got = append(got, string(m.Kind)+":"+m.Text)
			}
			if !slices.Equal(got, tc.wantPending) {
				t.Errorf("outbox after the crash = %q, want %q", got, tc.wantPending)
			}
		})
	}
}

// crashWhileEnding is the crashing process: it records a turn's start, then
// its end, and kills itself at the commit hook named at.
func crashWhileEnding(t *testing.T, at string) {
	var armed atomic.Bool
	kill := func(where string) func() {
		return func() {
			if armed.Load() && where == at {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}
	}
	s, err := store.Open(context.Background(), os.Getenv("TURNGUARD_STORE_CRASH_DB"), store.WithCommitHooks(
		store.Options{Logger: quiet, OutboxChannels: []string{"telegram"}}, kill("before-commit"), kill("after-commit")))
	if err != nil {
		t.Fatal(err)
	}
	tr := newTurn("run-1", "s")
	s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "the question" }))
	flush(t, s)
	armed.Store(true)
	s.Handle(tr.Ev(event.Aborted, time.Minute, func(e *event.Event) {
		e.StopReason, e.FullText, e.Message = event.ReasonTimeout, "The answer", "⚠️ limit"
	}))
	flush(t, s)
	t.Fatal("the process was not killed")
}
