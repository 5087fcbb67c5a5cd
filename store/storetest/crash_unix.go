//go:build unix

package storetest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

func init() {
	cases = append(cases, testCase{"EndTurnWritesOutboxInSameTx", testEndTurnWritesOutboxInSameTx})
}

// crashEnv and crashLocEnv tell the test binary, started again by
// testEndTurnWritesOutboxInSameTx, to be the process that crashes, and
// where its store is.
const (
	crashEnv    = "TURNGUARD_STORE_CRASH_AT"
	crashLocEnv = "TURNGUARD_STORE_CRASH_LOC"
)

// testEndTurnWritesOutboxInSameTx kills a real process (SIGKILL) that is
// recording a Telegram turn's end — just before the transaction commits and
// just after — and opens its store again: the outbox row exists if and
// only if the turn's end is recorded. Before the commit, the turn is still
// running (the next start reports it interrupted and queues that notice);
// after it, the reply is pending delivery.
func testEndTurnWritesOutboxInSameTx(t *testing.T, h *H) {
	if at := os.Getenv(crashEnv); at != "" {
		crashWhileEnding(t, h, at)
		return
	}
	// The child runs this very subtest: each level of its name, anchored.
	var pattern []string
	for _, part := range strings.Split(t.Name(), "/") {
		pattern = append(pattern, "^"+regexp.QuoteMeta(part)+"$")
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
			loc := h.New(t)
			cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(pattern, "/"), "-test.count=1")
			cmd.Env = append(os.Environ(), crashEnv+"="+tc.at, crashLocEnv+"="+loc)
			out, err := cmd.CombinedOutput() // real time: a real process is killed mid-write
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("crashing process: err %v, want killed by SIGKILL; output:\n%s", err, out)
			}
			s := h.Open(t, loc, Config{OutboxChannels: []string{"telegram"}})
			tr := MustTurn(t, s, "run-1")
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
func crashWhileEnding(t *testing.T, h *H, at string) {
	var armed atomic.Bool
	kill := func(where string) func() {
		return func() {
			if armed.Load() && where == at {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}
	}
	s := h.Open(t, os.Getenv(crashLocEnv), Config{OutboxChannels: []string{"telegram"},
		BeforeCommit: kill("before-commit"), AfterCommit: kill("after-commit")})
	tr := NewTurn("run-1", "s")
	s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "the question" }))
	Flush(t, s)
	armed.Store(true)
	s.Handle(tr.Ev(event.Aborted, time.Minute, func(e *event.Event) {
		e.StopReason, e.FullText, e.Message = event.ReasonTimeout, "The answer", "⚠️ limit"
	}))
	Flush(t, s)
	t.Fatal("the process was not killed")
}
