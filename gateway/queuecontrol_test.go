package gateway

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
)

// TestDebounceStartsWhenTheBurstEnds: with busy.debounceMs a message that
// would start a turn waits (stored like a queued one); each message within
// the window joins it and starts the window again; the one turn starts
// exactly debounceMs after the last message, with the texts joined, under
// the first message's run id.
func TestDebounceStartsWhenTheBurstEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil, func(c *config.Config) {
			ms := 500
			c.Agents.Defaults.Busy.DebounceMs = &ms
		})
		start := time.Now()
		for i, tc := range []struct{ id, text string }{{"r1", "/steps say:one"}, {"r2", "two"}, {"r3", "three"}} {
			if i > 0 {
				time.Sleep(400 * time.Millisecond) // real time: no — inside the synctest bubble: 400 ms of fake time, inside the window
			}
			if ack := v.send(t, tc.id, tc.text); ack.Status != StatusStarted || ack.RunID != "r1" {
				t.Fatalf("ack of %s = %+v, want started as r1", tc.id, ack)
			}
		}
		// A repeated key (a client's retry) is answered the same, not joined twice.
		if ack := v.send(t, "r2", "two"); ack.Status != StatusStarted || ack.RunID != "r1" {
			t.Fatalf("repeated r2 = %+v, want started as r1", ack)
		}
		synctest.Wait()
		if got := v.q.stored(); !slices.Equal(got, []string{"r1", "r2", "r3"}) {
			t.Fatalf("stored while the burst lasts: %v", got)
		}
		time.Sleep(499 * time.Millisecond) // real time: no — inside the synctest bubble: 1 ms before the window ends
		v.wantEnds(t)
		time.Sleep(time.Millisecond) // real time: no — inside the synctest bubble: the window ends
		synctest.Wait()
		started := v.sink.find(event.TurnStarted)
		if started == nil || started.RunID != "r1" || started.Text != "/steps say:one\n\ntwo\n\nthree" {
			t.Fatalf("TurnStarted %+v, want r1 with the three texts", started)
		}
		if d := started.Time.Sub(start); d != 1300*time.Millisecond {
			t.Fatalf("the turn started %v after the first message, want 1.3 s (500 ms after the last)", d)
		}
		if out := v.wait(t, "r3"); out.RunID != "r1" {
			t.Fatalf("r3's outcome is %+v, want r1's", out)
		}
		if got := v.q.stored(); len(got) != 0 {
			t.Fatalf("still stored after the turn started: %v", got)
		}
	})
}

// TestAbortCancelsAQueuedMessage: Abort with a queued message's run id
// (chat.abort, the Cancel buttons) removes it from the queue and from the
// QueueStore before it returns; it never runs and the next one still does.
// Another person's message is refused (ErrNotOwner), another session's run
// id is ErrWrongSession.
func TestAbortCancelsAQueuedMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil)
		v.send(t, "r1", "/steps shell:1s say:one")
		v.send(t, "r2", "/steps say:two")
		v.send(t, "r3", "/steps say:three")
		ctx := context.Background()
		if _, err := v.e.Abort(ctx, "main", "r2", event.ReasonUser, "someone-else", false); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("another person's cancel: %v, want ErrNotOwner", err)
		}
		if _, err := v.e.Abort(ctx, "other", "r2", event.ReasonUser, "conn1", false); !errors.Is(err, ErrWrongSession) {
			t.Fatalf("cancel from another session: %v, want ErrWrongSession", err)
		}
		res, err := v.e.Abort(ctx, "main", "r2", event.ReasonUser, "conn1", false)
		if err != nil || !res.Aborted || !res.Dequeued || !slices.Equal(res.RunIDs, []string{"r2"}) || res.Text != "/steps say:two" {
			t.Fatalf("cancel r2 = %+v, %v", res, err)
		}
		if got := v.q.stored(); !slices.Equal(got, []string{"r3"}) {
			t.Fatalf("stored after the cancel: %v, want r3 only", got)
		}
		if res, err := v.e.Abort(ctx, "main", "r2", event.ReasonUser, "conn1", false); err != nil || res.Aborted {
			t.Fatalf("cancel r2 again = %+v, %v; want nothing aborted", res, err)
		}
		if _, ok := v.e.Wait(ctx, "r2"); ok {
			t.Fatal("Wait(r2) has an outcome: a cancelled message ran")
		}
		v.wait(t, "r3")
		v.wantEnds(t, "r1 started", "r1 finished stop", "r3 started", "r3 finished stop")
	})
}

// TestOverflowDropOldForgetsTheDroppedMessage: busy.overflow drop-old
// drops the oldest waiting message from the queue and the QueueStore, and
// the answer names it; drop-new keeps the queue and drops the new one.
func TestOverflowDropOldForgetsTheDroppedMessage(t *testing.T) {
	for _, tc := range []struct {
		policy     string
		ack        Ack
		stored     []string
		ran, never string
	}{
		{config.OverflowDropOld, Ack{RunID: "r3", Status: StatusQueued, Busy: BusyQueue, Dropped: []string{"/steps say:two"}, Limit: 1},
			[]string{"r3"}, "r3", "r2"},
		{config.OverflowDropNew, Ack{RunID: "r3", Status: StatusDropped, Busy: BusyQueue, Dropped: []string{"/steps say:three"}, Limit: 1},
			[]string{"r2"}, "r2", "r3"},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				v := newBusyEnv(t, nil, nil, func(c *config.Config) {
					one := 1
					c.Agents.Defaults.Busy.MaxQueued, c.Agents.Defaults.Busy.Overflow = &one, tc.policy
				})
				v.send(t, "r1", "/steps shell:1s say:one")
				v.send(t, "r2", "/steps say:two")
				if ack := v.send(t, "r3", "/steps say:three"); !ackEqual(ack, tc.ack) {
					t.Fatalf("ack %+v, want %+v", ack, tc.ack)
				}
				if got := v.q.stored(); !slices.Equal(got, tc.stored) {
					t.Fatalf("stored %v, want %v", got, tc.stored)
				}
				v.wait(t, tc.ran)
				v.wantEnds(t, "r1 started", "r1 finished stop", tc.ran+" started", tc.ran+" finished stop")
				if _, ok := v.e.Wait(context.Background(), tc.never); ok {
					t.Fatalf("%s has an outcome: a dropped message ran", tc.never)
				}
			})
		})
	}
}

func ackEqual(a, b Ack) bool {
	return a.RunID == b.RunID && a.Status == b.Status && a.Busy == b.Busy && slices.Equal(a.Dropped, b.Dropped) && a.Limit == b.Limit
}

// memSettings is a SessionSettings in memory, shared by the engines of a
// test as a store outlives a restart.
type memSettings struct {
	mu    sync.Mutex
	modes map[string]string
}

func (m *memSettings) BusyModeOf(_ context.Context, key string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.modes[key], nil
}

func (m *memSettings) SetBusyMode(_ context.Context, key, mode string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.modes[key] = mode
	return nil
}

// TestSessionBusyModeOutlivesARestart: /queue <mode> (SetBusyMode) applies
// to that session only, at once, and a new engine on the same settings (a
// restart) reads it back; "" goes back to the configured mode.
func TestSessionBusyModeOutlivesARestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		settings := &memSettings{modes: map[string]string{}}
		newEngine := func() *Engine {
			d := demo.New()
			t.Cleanup(d.Release)
			e, _ := startEngineWith(t, Options{Config: config.NewSource(testConfig(t, nil)),
				Runners: map[string]runner.Runner{"demo": d}, Settings: settings})
			return e
		}
		ctx := context.Background()
		send := func(e *Engine, key, id string) (Ack, error) {
			return e.Send(ctx, SendRequest{SessionKey: key, Channel: "ws", RunID: id, Text: "/steps shell:hang"})
		}
		e := newEngine()
		if err := e.SetBusyMode(ctx, "main", "sideways"); !errors.Is(err, ErrInvalidBusyMode) {
			t.Fatalf("SetBusyMode(sideways) = %v", err)
		}
		if err := e.SetBusyMode(ctx, "main", BusyReject); err != nil {
			t.Fatal(err)
		}
		e.Shutdown(ctx)
		e = newEngine()
		info, err := e.QueueInfo(ctx, "main", "ws")
		if err != nil || info.Mode != BusyReject || !info.Own || info.Overflow != config.OverflowReject || info.MaxQueued != 5 {
			t.Fatalf("QueueInfo after a restart = %+v, %v; want reject, own", info, err)
		}
		for _, key := range []string{"main", "other"} {
			if _, err := send(e, key, key+"-1"); err != nil {
				t.Fatal(err)
			}
		}
		var busy *BusyError
		if _, err := send(e, "main", "main-2"); !errors.As(err, &busy) {
			t.Fatalf("main while busy: %v, want refused (its own mode reject)", err)
		}
		if ack, err := send(e, "other", "other-2"); err != nil || ack.Status != StatusQueued {
			t.Fatalf("other while busy: %+v, %v; want queued (the configured mode)", ack, err)
		}
		if err := e.SetBusyMode(ctx, "main", ""); err != nil {
			t.Fatal(err)
		}
		if ack, err := send(e, "main", "main-3"); err != nil || ack.Status != StatusQueued {
			t.Fatalf("main after /queue default: %+v, %v; want queued", ack, err)
		}
	})
}

// find returns the first recorded event of kind, nil when there is none.
func (s *sink) find(kind event.Kind) *event.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.events {
		if s.events[i].Kind == kind {
			ev := s.events[i]
			return &ev
		}
	}
	return nil
}

// TestOverflowDropOldInCollectMode: in busy mode collect the oldest
// collected message is dropped from its follow-up turn, which then runs
// under the next message's run id with the others' texts.
func TestOverflowDropOldInCollectMode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil, busyMode(config.BusyCollect), func(c *config.Config) {
			two := 2
			c.Agents.Defaults.Busy.MaxQueued, c.Agents.Defaults.Busy.Overflow = &two, config.OverflowDropOld
		})
		v.send(t, "r1", "/steps shell:1s say:one")
		v.send(t, "r2", "two")
		v.send(t, "r3", "three")
		ack := v.send(t, "r4", "four")
		if ack.Status != StatusQueued || ack.RunID != "r3" || !slices.Equal(ack.Dropped, []string{"two"}) {
			t.Fatalf("ack of r4 = %+v, want queued in r3's turn, two dropped", ack)
		}
		if got := v.q.stored(); !slices.Equal(got, []string{"r3", "r4"}) {
			t.Fatalf("stored %v, want r3 r4", got)
		}
		if out := v.wait(t, "r4"); out.RunID != "r3" {
			t.Fatalf("r4's outcome %+v, want r3's", out)
		}
		v.wantEnds(t, "r1 started", "r1 finished stop", "r3 started", "r3 finished stop")
		v.sink.mu.Lock()
		for _, ev := range v.sink.events {
			if ev.Kind == event.TurnStarted && ev.RunID == "r3" && ev.Text != "three\n\nfour" {
				t.Errorf("r3 started with %q, want the two texts left", ev.Text)
			}
		}
		v.sink.mu.Unlock()
		if _, ok := v.e.Wait(context.Background(), "r2"); ok {
			t.Fatal("the dropped r2 has an outcome")
		}
	})
}
