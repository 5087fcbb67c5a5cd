package gateway

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
)

// storedHistory is a HistoryLoader over a fixed conversation that behaves
// like the SQLite store: a cancelled context fails the query. fail makes the
// next n loads fail; gate, when set, holds every load until closed.
type storedHistory struct {
	calls atomic.Int32
	fail  atomic.Int32
	gate  chan struct{}
}

var stored = []Message{{Role: "user", Text: "my name is Ada"}, {Role: "assistant", Text: "Hello Ada"}}

func (h *storedHistory) load(ctx context.Context, key string, limit int) ([]Message, error) {
	h.calls.Add(1)
	if h.gate != nil {
		select {
		case <-h.gate:
		case <-ctx.Done():
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("query history: %w", err)
	}
	if h.fail.Add(-1) >= 0 {
		return nil, errors.New("database is locked")
	}
	return append([]Message(nil), stored...), nil
}

// historyRunner reports the history it was given as its answer.
var historyRunner = runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
	return runner.Result{Text: fmt.Sprint(len(turn.History))}, nil
})

func newHistoryEngine(t *testing.T, h *storedHistory) *Engine {
	t.Helper()
	return newStoredEngine(t, h, historyRunner, nil)
}

// TestHistoryLoadSurvivesCancelledRequest: the first request to touch a
// session is cancelled (a client hung up). The runner of the next turn must
// still get the stored conversation.
func TestHistoryLoadSurvivesCancelledRequest(t *testing.T) {
	h := &storedHistory{}
	e := newHistoryEngine(t, h)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	e.History(gone, "k", 0)
	ack, err := e.Send(context.Background(), SendRequest{SessionKey: "k", Channel: "ws", Text: "what is my name?"})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := e.Wait(context.Background(), ack.RunID)
	if out.Text != "2" {
		t.Fatalf("the runner got %s history messages, want the 2 stored ones", out.Text)
	}
}

// TestHistoryLoadFailureIsRetried: a failed load is not marked done; the
// next use loads again.
func TestHistoryLoadFailureIsRetried(t *testing.T) {
	h := &storedHistory{}
	h.fail.Store(1)
	e := newHistoryEngine(t, h)
	var unavail *HistoryUnavailableError
	if _, msgs, err := e.History(context.Background(), "k", 0); !errors.As(err, &unavail) || len(msgs) != 0 {
		t.Fatalf("history after a failed load: %+v, %v; want *HistoryUnavailableError", msgs, err)
	}
	if _, msgs, _ := e.History(context.Background(), "k", 0); len(msgs) != 2 {
		t.Fatalf("history after the retry: %+v", msgs)
	}
	if n := h.calls.Load(); n != 2 {
		t.Fatalf("%d loads, want 2 (one failed, one retried)", n)
	}
}

// TestConcurrentCallersShareOneHistoryLoad: callers arriving while a load
// is in flight wait for it instead of each querying the store, and none sees
// the session before its history is there.
func TestConcurrentCallersShareOneHistoryLoad(t *testing.T) {
	h := &storedHistory{gate: make(chan struct{})}
	e := newHistoryEngine(t, h)
	var wg sync.WaitGroup
	got := make([]int, 8)
	for i := range got {
		wg.Go(func() {
			_, msgs, _ := e.History(context.Background(), "k", 0)
			got[i] = len(msgs)
		})
	}
	for h.calls.Load() == 0 {
		runtime.Gosched()
	}
	close(h.gate)
	wg.Wait()
	for i, n := range got {
		if n != 2 {
			t.Fatalf("caller %d saw %d messages, want 2", i, n)
		}
	}
	if n := h.calls.Load(); n != 1 {
		t.Fatalf("%d loads for concurrent callers, want 1", n)
	}
}

// TestHistoryAfterFailedLoadHasNoDuplicates: a turn runs while the load
// failed; the retried load returns the stored conversation including that
// turn. Each message appears once.
func TestHistoryAfterFailedLoadHasNoDuplicates(t *testing.T) {
	var mu sync.Mutex
	var store []Message
	fail := true
	load := func(ctx context.Context, key string, limit int) ([]Message, error) {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			fail = false
			return nil, errors.New("database is locked")
		}
		return append([]Message(nil), store...), nil
	}
	e, err := New(Options{Config: config.NewSource(testConfig(t, nil)), Runners: map[string]runner.Runner{"demo": historyRunner}, History: load})
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	defer e.Shutdown(context.Background())
	e.Bus().Subscribe("", func(ev event.Event) { // the store's recorder, in short
		mu.Lock()
		defer mu.Unlock()
		switch {
		case ev.Kind == event.TurnStarted:
			store = append(store, Message{Role: "user", Text: ev.Text, Time: ev.Time})
		case ev.Kind.Terminal():
			store = append(store, Message{Role: "assistant", Text: ev.FullText, StopReason: ev.StopReason, Time: ev.Time})
		}
	})
	ack, err := e.Send(context.Background(), SendRequest{SessionKey: "k", Channel: "ws", Text: "one"})
	if err != nil {
		t.Fatal(err)
	}
	e.Wait(context.Background(), ack.RunID)
	_, h, _ := e.History(context.Background(), "k", 0)
	var got []string
	for _, m := range h {
		got = append(got, m.Role+":"+m.Text)
	}
	if fmt.Sprint(got) != "[user:one assistant:0]" {
		t.Fatalf("history %v, want each message once", got)
	}
}
