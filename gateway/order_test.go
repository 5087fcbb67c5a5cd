package gateway

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
)

// blockingRunner answers "next" at once and blocks on anything else until
// its context is cancelled.
var blockingRunner = runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
	if turn.Message == "next" {
		return runner.Result{Text: "answer"}, nil
	}
	cb.StepStarted("tool", "shell")
	<-ctx.Done()
	return runner.Result{}, context.Cause(ctx)
})

func newRawEngine(t testing.TB, rn runner.Runner, adjust func(*config.Config)) *Engine {
	t.Helper()
	c := testConfig(t, adjust)
	e, err := New(Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": rn}})
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	return e
}

// sendWhenFree sends req, again and again while the session is busy; it
// returns nil once the turn is accepted, or Send's other error.
func sendWhenFree(ctx context.Context, e *Engine, req SendRequest) error {
	for {
		_, err := e.Send(ctx, req)
		if !errors.Is(err, ErrBusy) {
			return err
		}
		runtime.Gosched()
	}
}

// TestStopNoticeBeforeNextMessageInHistory: a user stops a turn and sends the
// next message the moment the session is free. The history must show the
// stop notice before the next message, never after it (2,000 tries, -race).
func TestStopNoticeBeforeNextMessageInHistory(t *testing.T) {
	e := newRawEngine(t, blockingRunner, nil)
	defer e.Shutdown(context.Background())
	ctx := context.Background()
	for i := range 2000 {
		key := fmt.Sprintf("s%d", i)
		if _, err := e.Send(ctx, SendRequest{SessionKey: key, Channel: "ws", RunID: key + "-1", Text: "work"}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			if _, err := e.Abort(ctx, key, "", event.ReasonUser, "", false); err != nil {
				t.Error(err)
			}
		})
		if err := sendWhenFree(ctx, e, SendRequest{SessionKey: key, Channel: "ws", RunID: key + "-2", Text: "next"}); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if out, ok := e.Wait(ctx, key+"-2"); !ok || out.Status != StatusOK {
			t.Fatalf("second turn: %+v", out)
		}
		_, h, _ := e.History(ctx, key, 0)
		var got []string
		for _, m := range h {
			got = append(got, m.Role+":"+string(m.StopReason))
		}
		want := "[user: assistant:user user: assistant:stop]"
		if fmt.Sprint(got) != want {
			t.Fatalf("iteration %d: history %v, want %s (%+v)", i, got, want, h)
		}
	}
}

// TestNoEventBeforeTurnStartedWhenSendRacesShutdown: whatever the
// interleaving of Send and Shutdown, a subscriber sees a run's TurnStarted
// first and its events in sequence, with exactly one terminal event, and
// never TurnStarted after the terminal one (2,000 tries, -race).
func TestNoEventBeforeTurnStartedWhenSendRacesShutdown(t *testing.T) {
	for i := range 2000 {
		e := newRawEngine(t, blockingRunner, nil)
		var mu sync.Mutex
		seen := map[string][]event.Event{}
		e.Bus().Subscribe("", func(ev event.Event) {
			mu.Lock()
			seen[ev.RunID] = append(seen[ev.RunID], ev)
			mu.Unlock()
		})
		var wg sync.WaitGroup
		wg.Go(func() {
			e.Send(context.Background(), SendRequest{SessionKey: "k", Channel: "ws", RunID: "r", Text: "work"})
		})
		runtime.Gosched()
		e.Shutdown(context.Background())
		wg.Wait()
		e.Shutdown(context.Background())
		mu.Lock()
		evs := seen["r"]
		mu.Unlock()
		if len(evs) == 0 {
			continue // Send lost the race: refused
		}
		var kinds []string
		terminal := 0
		for j, ev := range evs {
			kinds = append(kinds, ev.Kind.String())
			if ev.Seq != uint64(j+1) {
				t.Fatalf("iteration %d: seq %d at position %d: %v", i, ev.Seq, j, kinds)
			}
			if ev.Kind.Terminal() {
				terminal++
			}
		}
		if evs[0].Kind != event.TurnStarted || terminal != 1 {
			t.Fatalf("iteration %d: events %v, want turn_started first and one terminal event", i, kinds)
		}
	}
}

// quickRunner answers every message at once.
var quickRunner = runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
	return runner.Result{Text: "answer to " + turn.Message}, nil
})

// kindsSeen records, for a bus subscriber, each session's events as
// "run:kind" in the order the subscriber saw them.
type kindsSeen struct {
	mu   sync.Mutex
	seen map[string][]string
}

func (k *kindsSeen) add(ev event.Event) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.seen == nil {
		k.seen = map[string][]string{}
	}
	k.seen[ev.SessionKey] = append(k.seen[ev.SessionKey], ev.RunID+":"+ev.Kind.String())
}

func (k *kindsSeen) of(key string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.seen[key]...)
}

// wantTurnOrder fails unless every terminal event of a session precedes the
// next run's turn_started in got.
func wantTurnOrder(t *testing.T, i int, got []string, want string) {
	t.Helper()
	if fmt.Sprint(got) != want {
		t.Fatalf("iteration %d: a subscriber saw %v, want %s", i, got, want)
	}
}

// TestNextTurnStartsAfterPreviousEndingOnTheBus: while a turn's Finished is
// still being handed to subscribers, another goroutine's Send for the same
// session is accepted — but every subscriber (the store writing history, a
// live WebSocket) must see the previous Finished before the next turn's
// TurnStarted. The subscriber here holds the Finished until the next Send
// has been accepted, so the window is always open.
func TestNextTurnStartsAfterPreviousEndingOnTheBus(t *testing.T) {
	e := newRawEngine(t, quickRunner, nil)
	defer e.Shutdown(context.Background())
	ctx := context.Background()
	for i := range 50 {
		key := fmt.Sprintf("s%d", i)
		var k kindsSeen
		accepted := make(chan struct{})
		unsub := e.Bus().Subscribe(key, func(ev event.Event) {
			if ev.Kind == event.Finished && ev.RunID == key+"-1" {
				select {
				case <-accepted:
				case <-time.After(10 * time.Second): // real time: a guard only; the next Send is accepted at once
					t.Errorf("iteration %d: the next Send was not accepted while the Finished was published", i)
				}
			}
			k.add(ev)
		})
		if _, err := e.Send(ctx, SendRequest{SessionKey: key, Channel: "ws", RunID: key + "-1", Text: "one"}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			defer close(accepted)
			if err := sendWhenFree(ctx, e, SendRequest{SessionKey: key, Channel: "ws", RunID: key + "-2", Text: "two"}); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		if out, ok := e.Wait(ctx, key+"-2"); !ok || out.Status != StatusOK {
			t.Fatalf("second turn: %+v", out)
		}
		unsub()
		wantTurnOrder(t, i, k.of(key), fmt.Sprintf("[%[1]s-1:turn_started %[1]s-1:finished %[1]s-2:turn_started %[1]s-2:finished]", key))
	}
}

// TestNextTurnStartsAfterPreviousEndingUnderRace: the same without holding
// the subscriber: Send spins on the busy session while its turn ends, many
// times under -race. A subscriber always sees the first turn's Finished
// before the second turn's TurnStarted.
func TestNextTurnStartsAfterPreviousEndingUnderRace(t *testing.T) {
	e := newRawEngine(t, quickRunner, nil)
	defer e.Shutdown(context.Background())
	var k kindsSeen
	defer e.Bus().Subscribe("", k.add)()
	ctx := context.Background()
	for i := range 3000 {
		key := fmt.Sprintf("s%d", i)
		if _, err := e.Send(ctx, SendRequest{SessionKey: key, Channel: "ws", RunID: key + "-1", Text: "one"}); err != nil {
			t.Fatal(err)
		}
		if err := sendWhenFree(ctx, e, SendRequest{SessionKey: key, Channel: "ws", RunID: key + "-2", Text: "two"}); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{key + "-1", key + "-2"} {
			if _, ok := e.Wait(ctx, id); !ok {
				t.Fatalf("iteration %d: no outcome for %s", i, id)
			}
		}
		wantTurnOrder(t, i, k.of(key), fmt.Sprintf("[%[1]s-1:turn_started %[1]s-1:finished %[1]s-2:turn_started %[1]s-2:finished]", key))
	}
}

// TestSendRightAfterWaitIsNeverBusy: a client that waits for a run's outcome
// (agent.wait) and sends its next message at once must never be told the
// session is busy — least of all "still stopping" for a run that finished
// normally (3,000 tries, -race).
func TestSendRightAfterWaitIsNeverBusy(t *testing.T) {
	e := newRawEngine(t, quickRunner, nil)
	defer e.Shutdown(context.Background())
	ctx := context.Background()
	for i := range 3000 {
		id := fmt.Sprint("r", i)
		if _, err := e.Send(ctx, SendRequest{SessionKey: "main", Channel: "ws", RunID: id, Text: "hi"}); err != nil {
			var be *BusyError
			if errors.As(err, &be) {
				t.Fatalf("iteration %d: right after Wait answered ok: %v (user reads %q)", i, err, be.UserText())
			}
			t.Fatal(err)
		}
		if out, ok := e.Wait(ctx, id); !ok || out.Status != StatusOK {
			t.Fatalf("iteration %d: wait %+v", i, out)
		}
	}
}
