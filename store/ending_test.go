//go:build unix

package store_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// TestEndTurnWritesOutbox: for a channel that delivers out of band, the
// turn's end brings its terminal messages into the outbox (the texts of
// messages.Ending), exactly one row per (run, kind), and OnOutbox is told
// after the commit; a WebSocket turn (served from the history) has none.
func TestEndTurnWritesOutbox(t *testing.T) {
	type row struct {
		Kind store.OutboxKind
		Text string
	}
	for _, tc := range []struct {
		name    string
		channel string
		end     func(*turn) event.Event
		want    []row
	}{
		{"reply", "telegram", func(tr *turn) event.Event {
			return tr.ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "Hello" })
		}, []row{{store.OutboxFinal, "Hello"}}},
		{"empty reply", "telegram", func(tr *turn) event.Event {
			return tr.ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason = event.ReasonStop })
		}, []row{{store.OutboxFinal, "✅ Done (the assistant sent no text)."}}},
		{"timeout with a partial reply", "telegram", func(tr *turn) event.Event {
			return tr.ev(event.Aborted, time.Minute, func(e *event.Event) {
				e.StopReason, e.FullText, e.Message = event.ReasonTimeout, "Half an answer", "⚠️ This request hit its time limit."
			})
		}, []row{{store.OutboxFinal, "Half an answer"}, {store.OutboxNotice, "⚠️ This request hit its time limit."}}},
		{"error", "telegram", func(tr *turn) event.Event {
			return tr.ev(event.Finished, time.Second, func(e *event.Event) {
				e.StopReason, e.Message = event.ReasonError, "❌ Something went wrong (error id E1)."
			})
		}, []row{{store.OutboxNotice, "❌ Something went wrong (error id E1)."}}},
		{"websocket", "ws", func(tr *turn) event.Event {
			return tr.ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "Hello" })
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var told []string
			s := open(t, dbPath(t), store.Options{OutboxChannels: []string{"telegram"}, OnOutbox: func(ch string) {
				mu.Lock()
				defer mu.Unlock()
				told = append(told, ch)
			}})
			tr := newTurn("run-1", "s")
			tr.channel = tc.channel
			end := tc.end(tr)
			s.Handle(tr.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "q" }))
			s.Handle(end)
			s.Handle(end) // a second ending changes nothing
			flush(t, s)
			pending, err := s.Pending(context.Background(), "", 0)
			if err != nil {
				t.Fatal(err)
			}
			var got []row
			for _, m := range pending {
				if m.RunID != "run-1" || m.Channel != tc.channel || m.ChatRef != "42" {
					t.Errorf("outbox row %+v: want run-1 to %s chat 42", m, tc.channel)
				}
				got = append(got, row{m.Kind, m.Text})
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("outbox = %q, want %q", got, tc.want)
			}
			mu.Lock()
			defer mu.Unlock()
			if wantTold := tc.want != nil; wantTold != slices.Equal(told, []string{"telegram"}) {
				t.Errorf("OnOutbox calls = %q (rows written: %v)", told, wantTold)
			}
		})
	}
}

// TestEndTurnKeepsEarlierOutboxRow: a notice already in the outbox for the
// run (the restart's interrupted notice) is kept; the ending adds only what
// is missing and the turn still ends.
func TestEndTurnKeepsEarlierOutboxRow(t *testing.T) {
	s := open(t, dbPath(t), store.Options{OutboxChannels: []string{"telegram"}})
	ctx := context.Background()
	if _, err := s.Enqueue(ctx, store.OutboxMessage{Channel: "telegram", ChatRef: "42", RunID: "run-1",
		Kind: store.OutboxNotice, Text: "earlier"}); err != nil {
		t.Fatal(err)
	}
	tr := newTurn("run-1", "s")
	handleAll(s, tr.ev(event.TurnStarted, 0, nil), tr.ev(event.Aborted, time.Second, func(e *event.Event) {
		e.StopReason, e.FullText, e.Message = event.ReasonUser, "partial", "⏹️ Stopped."
	}))
	flush(t, s)
	if st := mustTurn(t, s, "run-1").State; st != store.TurnAborted {
		t.Errorf("turn state = %s, want aborted", st)
	}
	p, err := s.Pending(ctx, "telegram", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 2 || p[0].Text != "earlier" || p[1].Kind != store.OutboxFinal || p[1].Text != "partial" {
		t.Errorf("pending = %+v, want the earlier notice and the partial reply", p)
	}
}

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
	s.Handle(tr.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "the question" }))
	flush(t, s)
	armed.Store(true)
	s.Handle(tr.ev(event.Aborted, time.Minute, func(e *event.Event) {
		e.StopReason, e.FullText, e.Message = event.ReasonTimeout, "The answer", "⚠️ limit"
	}))
	flush(t, s)
	t.Fatal("the process was not killed")
}

// TestUserText: the message that started a run, for Retry; ErrNotFound for
// a run the store does not know.
func TestUserText(t *testing.T) {
	s := open(t, dbPath(t), store.Options{})
	tr := newTurn("run-1", "s")
	handleAll(s, tr.ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "summarise the report" }),
		tr.ev(event.Aborted, time.Minute, func(e *event.Event) { e.StopReason, e.Message = event.ReasonTimeout, "⚠️" }))
	flush(t, s)
	ctx := context.Background()
	if got, err := s.UserText(ctx, "run-1"); err != nil || got != "summarise the report" {
		t.Errorf("UserText(run-1) = %q, %v", got, err)
	}
	if _, err := s.UserText(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UserText(nope) error = %v, want ErrNotFound", err)
	}
}
