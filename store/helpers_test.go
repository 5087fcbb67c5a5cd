package store_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// t0 is when the test turns start.
var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

var quiet = slog.New(slog.DiscardHandler)

// dbPath is a fresh database file in the test's temp dir.
func dbPath(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "turnguard.db")
}

// open opens the store at path and closes it at the end of the test.
func open(t testing.TB, path string, opts store.Options) *store.SQLite {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	s, err := store.Open(context.Background(), path, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// flush waits for the writer.
func flush(t testing.TB, s *store.SQLite) {
	t.Helper()
	if err := s.Flush(context.Background()); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// turn builds the events of one run the way the engine publishes them: per
// run sequence numbers, channel and chat, and times offset from t0.
type turn struct {
	run, session, channel, chat string
	seq                         uint64
}

func newTurn(run, session string) *turn {
	return &turn{run: run, session: session, channel: "telegram", chat: "42"}
}

// ev returns the next event of the run, at t0+at, with f applied.
func (tr *turn) ev(k event.Kind, at time.Duration, f func(*event.Event)) event.Event {
	tr.seq++
	e := event.Event{Kind: k, RunID: tr.run, SessionKey: tr.session, Channel: tr.channel, ChatRef: tr.chat,
		Seq: tr.seq, Time: t0.Add(at)}
	if f != nil {
		f(&e)
	}
	return e
}

func step(kind, name string, seq uint32, startedAt time.Duration) event.Step {
	return event.Step{Kind: kind, Name: name, Seq: seq, StartedAt: t0.Add(startedAt)}
}

func handleAll(s *store.SQLite, evs ...event.Event) {
	for _, e := range evs {
		s.Handle(e)
	}
}

func mustHistory(t testing.TB, s *store.SQLite, session string) []store.Message {
	t.Helper()
	h, err := s.History(context.Background(), session, 0)
	if err != nil {
		t.Fatalf("History(%q): %v", session, err)
	}
	return h
}

func mustTurn(t testing.TB, s *store.SQLite, run string) store.Turn {
	t.Helper()
	tr, err := s.Turn(context.Background(), run)
	if err != nil {
		t.Fatalf("Turn(%q): %v", run, err)
	}
	return tr
}

// msg is a history message without its run id and time, for comparisons.
type msg struct {
	Role       store.Role
	Text       string
	StopReason event.StopReason
}

func msgs(h []store.Message) []msg {
	out := make([]msg, len(h))
	for i, m := range h {
		out[i] = msg{m.Role, m.Text, m.StopReason}
	}
	return out
}
