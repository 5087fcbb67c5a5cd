package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// heldWriter opens a store whose writer blocks before each batch until the
// test lets it go; entered reports each time it is held.
func heldWriter(t *testing.T, opts store.Options) (s *store.SQLite, entered <-chan struct{}, release func()) {
	t.Helper()
	in := make(chan struct{})
	gate := make(chan struct{})
	var once sync.Once
	s = open(t, dbPath(t), store.WithBeforeBatch(opts, func() {
		select {
		case in <- struct{}{}: // the test is watching: hold until released
			<-gate
		case <-gate: // released: run freely
		}
	}))
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release) // before Close (cleanups run last-in first-out)
	return s, in, release
}

func TestHandleDropsWhenQueueFull(t *testing.T) {
	s, entered, release := heldWriter(t, store.Options{QueueSize: 4})
	tr := newTurn("run-1", "s")
	s.Handle(tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "go" }))
	<-entered // the writer has taken the first event and is held

	// 4 fill the queue, 10 overflow. None may block: a blocked Handle hangs
	// the test (and the engine).
	for i := range 14 {
		s.Handle(tr.Ev(event.Progress, time.Duration(i+1)*time.Second, func(e *event.Event) {
			e.Step = step("tool", "slow", 1, 0)
		}))
	}
	if got := s.Dropped(); got != 10 {
		t.Errorf("Dropped() = %d, want 10", got)
	}
	if got := s.QueueDepth(); got != 4 {
		t.Errorf("QueueDepth() = %d, want 4", got)
	}
	s.Handle(event.Event{Kind: event.Delta, RunID: "run-1", SessionKey: "s"}) // ignored, not dropped
	if got := s.Dropped(); got != 10 {
		t.Errorf("after a Delta, Dropped() = %d, want 10", got)
	}

	release()
	flush(t, s)
	j, err := s.Journal(context.Background(), store.Filter{RunID: "run-1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(j) != 5 {
		t.Errorf("journal has %d entries, want the 5 accepted events", len(j))
	}
	st := s.Stats()
	if st.Enqueued != 5 || st.Written != 5 || st.Dropped != 10 || st.QueueDepth != 0 {
		t.Errorf("stats = %+v", st)
	}
}

func TestFlushHonoursContext(t *testing.T) {
	s, entered, release := heldWriter(t, store.Options{})
	s.Handle(newTurn("run-1", "s").Ev(event.TurnStarted, 0, nil))
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Flush(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Flush with a held writer and a cancelled context = %v, want context.Canceled", err)
	}
	release()
	flush(t, s)
}

func TestMemoryStore(t *testing.T) {
	s := open(t, ":memory:", store.Options{})
	tr := newTurn("run-1", "s")
	handleAll(s,
		tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text = "hi" }),
		tr.Ev(event.Finished, time.Second, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "hello" }))
	flush(t, s)
	want := []msg{{Role: store.RoleUser, Text: "hi", StopReason: ""}, {Role: store.RoleAssistant, Text: "hello", StopReason: event.ReasonStop}}
	if got := msgs(mustHistory(t, s, "s")); !slices.Equal(got, want) {
		t.Errorf("history = %q, want %q", got, want)
	}
	if _, err := s.Enqueue(context.Background(), store.OutboxMessage{Channel: "ws", RunID: "run-1",
		Kind: store.OutboxFinal, Text: "hello"}); err != nil {
		t.Errorf("Enqueue in memory: %v", err)
	}
}

func TestOpenRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	if _, err := store.Open(ctx, "", store.Options{}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Open(\"\") = %v, want ErrInvalid", err)
	}
	missing := t.TempDir() + "/no/such/dir/x.db"
	if s, err := store.Open(ctx, missing, store.Options{}); err == nil {
		s.Close()
		t.Errorf("Open in a missing directory succeeded")
	}
}

// TestEndingsNeverDroppedWhenQueueFull: a full queue sheds progress-type
// events but keeps every turn's start and ending, in order, so no ended turn
// is left "running" (which the next start would report as interrupted).
func TestEndingsNeverDroppedWhenQueueFull(t *testing.T) {
	s, entered, release := heldWriter(t, store.Options{QueueSize: 3})
	s.Handle(newTurn("warm", "w").Ev(event.TurnStarted, 0, nil))
	<-entered // the writer is held; everything below waits in the queue

	const turns = 20
	for i := range turns {
		tr := newTurn(fmt.Sprintf("run-%02d", i), fmt.Sprintf("s%02d", i))
		at := time.Duration(i) * time.Second
		handleAll(s,
			tr.Ev(event.TurnStarted, at, func(e *event.Event) { e.Text = "q" }),
			tr.Ev(event.StepStarted, at, func(e *event.Event) { e.Step = step("tool", "t", 1, at) }),
			tr.Ev(event.Progress, at, func(e *event.Event) { e.Step = step("tool", "t", 1, at) }),
		)
		if i%2 == 0 {
			s.Handle(tr.Ev(event.Finished, at, func(e *event.Event) { e.StopReason, e.FullText = event.ReasonStop, "a" }))
		} else {
			s.Handle(tr.Ev(event.Aborted, at, func(e *event.Event) {
				e.StopReason, e.Message = event.ReasonTimeout, "⏱️ stopped"
			}))
		}
	}
	if s.Dropped() == 0 {
		t.Errorf("Dropped() = 0: the overflow of progress events should be shed and counted")
	}
	release()
	flush(t, s)
	running, err := s.RunningTurns(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range running {
		if r.RunID != "warm" {
			t.Errorf("turn %s is still recorded as running: the next start would tell its user it was interrupted", r.RunID)
		}
	}
	for i := range turns {
		h := mustHistory(t, s, fmt.Sprintf("s%02d", i))
		if len(h) != 2 || h[1].Role != store.RoleAssistant {
			t.Errorf("session s%02d history = %+v, want the question and the ending", i, msgs(h))
		}
	}
	if st := s.Stats(); st.Failed != 0 || st.Spilled == 0 {
		t.Errorf("stats = %+v, want nothing failed and the kept starts and endings counted as spilled", st)
	}

	// The next start: only the turn that really never ended is cut off.
	release()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, s.Path(), store.Options{})
	running, err = s2.RunningTurns(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(running) != 1 || running[0].RunID != "warm" {
		t.Errorf("after a restart, running turns = %+v: only \"warm\" may get an interrupted notice", running)
	}
}
