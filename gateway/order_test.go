package gateway

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"

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
		for {
			_, err := e.Send(ctx, SendRequest{SessionKey: key, Channel: "ws", RunID: key + "-2", Text: "next"})
			if err == nil {
				break
			}
			if !errors.Is(err, ErrBusy) {
				t.Fatal(err)
			}
			runtime.Gosched()
		}
		wg.Wait()
		if out, ok := e.Wait(ctx, key+"-2"); !ok || out.Status != StatusOK {
			t.Fatalf("second turn: %+v", out)
		}
		_, h := e.History(ctx, key, 0)
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
