package gateway

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/internal/faketime"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
)

// a client retry racing its first send (same idempotency key) runs the message twice.
func TestSendConcurrentSameRunIDRunsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		n := 0
		both := make(chan struct{})
		admit := func() error { // holds both Sends between the idempotency check and the session lock
			mu.Lock()
			n++
			if n == 2 {
				close(both)
			}
			mu.Unlock()
			<-both
			return nil
		}
		d := demo.New(demo.WithScenarioStep(100 * time.Millisecond))
		t.Cleanup(d.Release)
		c := testConfig(t, nil)
		e, s := startEngineWith(t, Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": d}, Queue: &memQueue{}, Admit: admit})
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: "r1", Text: "hi", Owner: "c"})
			}()
		}
		wg.Wait()
		faketime.Advance(time.Minute)
		synctest.Wait()
		v := &busyEnv{e: e, sink: s}
		v.wantEnds(t, "r1 started", "r1 finished stop")
	})
}

// /stop discards the queue, but a message steered into the turn and not
// yet taken by its runner runs afterwards as a new turn.
func TestStopDropsSteeredMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rn := lazySteerer{func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
			if turn.Message == "slow" {
				<-ctx.Done()
				return runner.Result{}, ctx.Err()
			}
			return runner.Result{Text: "ok " + turn.Message}, nil
		}}
		v := newBusyEnv(t, nil, rn, busyMode(config.BusySteer))
		v.send(t, "r1", "slow")
		if ack := v.send(t, "r2", "also do X"); ack.Status != StatusSteered {
			t.Fatalf("ack %+v", ack)
		}
		res, err := v.e.Stop(context.Background(), "main", "conn1", false)
		if err != nil {
			t.Fatal(err)
		}
		faketime.Advance(time.Minute)
		synctest.Wait()
		t.Logf("stop: %+v", res)
		v.wantEnds(t, "r1 started", "r1 aborted user")
	})
}

// a steered message whose runner ignored cancellation (force-finalized)
// is put back on the queue after the session was freed and pumped: nothing
// pumps it again, so it never starts (until the session's next message).
func TestSteeredAfterForceFinalizeStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rn := lazySteerer{func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
			if turn.Message == "slow" {
				faketime.Advance(10 * time.Minute) // ignores cancellation
				return runner.Result{}, ctx.Err()
			}
			return runner.Result{Text: "ok " + turn.Message}, nil
		}}
		v := newBusyEnv(t, nil, rn, busyMode(config.BusySteer), func(c *config.Config) {
			c.Agents.Defaults.TimeoutSeconds = secs(60)
			c.Agents.Defaults.AbortGraceSeconds = secs(2)
		})
		v.send(t, "r1", "slow")
		if ack := v.send(t, "r2", "also do X"); ack.Status != StatusSteered {
			t.Fatalf("ack %+v", ack)
		}
		faketime.Advance(30 * time.Minute)
		synctest.Wait()
		ends := v.ends()
		t.Logf("turns: %q status %+v", ends, v.e.Status("main").Queue)
		if len(ends) < 5 {
			t.Fatalf("the steered message never ran: %q; still queued: %d", ends, len(v.e.Status("main").Queue))
		}
	})
}

// slowRemove is a QueueStore whose RemoveQueued takes as long as the real
// store's Flush behind a backlog (or a stalled disk: up to queueStoreTimeout).
type slowRemove struct{ *memQueue }

func (s slowRemove) RemoveQueued(ctx context.Context, ids ...string) error {
	select {
	case <-time.After(8 * time.Second):
	case <-ctx.Done():
	}
	return s.memQueue.RemoveQueued(ctx, ids...)
}

// /stop waits for the store to forget the queue before it aborts the turn.
func TestStopIsNotDelayedByTheStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := testConfig(t, nil)
		d := demo.New(demo.WithScenarioStep(100 * time.Millisecond))
		t.Cleanup(d.Release)
		e, s := startEngineWith(t, Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": d}, Queue: slowRemove{&memQueue{}}})
		v := &busyEnv{e: e, sink: s}
		v.send(t, "r1", "/steps shell:hang")
		v.send(t, "r2", "next")
		t0 := time.Now()
		if _, err := e.Stop(context.Background(), "main", "conn1", false); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(t0); d > time.Second {
			t.Fatalf("/stop took %v before the turn was aborted", d)
		}
		faketime.Advance(time.Minute) // the store forgets the dropped message meanwhile
		synctest.Wait()
		if got := v.e.Status("main"); got.Running || len(got.Queue) != 0 {
			t.Fatalf("after /stop: %+v", got)
		}
	})
}

// interrupt: a second message sent while the first interrupt is still
// stopping the turn replaces the first one too (before the fix r2 ran to
// its step timeout while the newest message waited).
func TestInterruptTwiceWhileStopping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil, busyMode(config.BusyInterrupt))
		v.send(t, "r1", "/steps shell:hang")
		faketime.Advance(time.Second)
		v.send(t, "r2", "/steps shell:hang")
		v.send(t, "r3", "/steps say:newest")
		faketime.Advance(time.Hour)
		synctest.Wait()
		// r2 was replaced by r3 before it could run: it is stopped as
		// superseded at once (not left to hang to its step timeout) and the
		// newest message runs.
		v.wantEnds(t, "r1 started", "r1 aborted superseded", "r2 started", "r2 aborted superseded", "r3 started", "r3 finished stop")
	})
}

// the run id of a steered message is not remembered: the client's
// retry (same idempotency key) is steered again, or after the turn ended
// starts a new turn with the same text.
func TestSteeredRetryIsIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil, busyMode(config.BusySteer))
		v.send(t, "r1", "/steps shell:5s")
		faketime.Advance(time.Second)
		a1 := v.send(t, "r2", "also X")
		a2 := v.send(t, "r2", "also X") // the client's retry
		t.Logf("first %+v retry %+v", a1, a2)
		v.wait(t, "r1")
		a3 := v.send(t, "r2", "also X") // a retry after the turn ended
		faketime.Advance(time.Hour)
		synctest.Wait()
		t.Logf("late retry %+v turns %q", a3, v.ends())
		if a3.Status == StatusStarted || a2.Status == StatusSteered {
			t.Fatalf("a retried steered message was handled again: retry %+v, late retry %+v", a2, a3)
		}
	})
}

// in a shared session (a Telegram group) A's /stop drops B's queued message.
func TestStopKeepsOthersQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil)
		ctx := context.Background()
		v.e.Send(ctx, SendRequest{SessionKey: "main", Channel: "ws", RunID: "a1", Text: "/steps shell:hang", Owner: "A"})
		v.e.Send(ctx, SendRequest{SessionKey: "main", Channel: "ws", RunID: "b1", Text: "B's question", Owner: "B"})
		res, err := v.e.Stop(ctx, "main", "A", false)
		if err != nil || res.Dropped != 0 {
			t.Fatalf("A's /stop dropped %d messages of B (err %v)", res.Dropped, err)
		}
	})
}

// a message acked "steered" that the runner had not taken when the
// gateway shut down is neither run nor stored: after the restart it is gone.
func TestShutdownStoresSteered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rn := lazySteerer{func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
			<-ctx.Done()
			return runner.Result{}, ctx.Err()
		}}
		v := newBusyEnv(t, nil, rn, busyMode(config.BusySteer))
		v.send(t, "r1", "slow")
		if ack := v.send(t, "r2", "also do X"); ack.Status != StatusSteered {
			t.Fatalf("ack %+v", ack)
		}
		v.e.Shutdown(context.Background())
		synctest.Wait()
		if got := v.q.stored(); len(got) == 0 {
			t.Fatalf("the steered message is not in the QueueStore after shutdown (in memory: %d)", len(v.e.Status("main").Queue))
		}
	})
}

// A restored queued message that can never start (its channel's runner is
// not configured) is dropped and the one behind it starts.
func TestQueuedHeadThatCannotStartDoesNotBlockTheRest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &memQueue{msgs: []QueuedMessage{
			{RunID: "t1", SessionKey: "main", Channel: "telegram", Text: "hi", QueuedAt: time.Now()},
			{RunID: "w1", SessionKey: "main", Channel: "ws", Text: "/steps say:ok", QueuedAt: time.Now()},
		}}
		v := newBusyEnv(t, q, nil, func(c *config.Config) { c.Channels.Telegram.Runner = "openai" })
		if err := v.e.RestoreQueued(context.Background()); err != nil {
			t.Fatal(err)
		}
		faketime.Advance(time.Minute)
		synctest.Wait()
		v.wantEnds(t, "w1 started", "w1 finished stop")
		if got := q.stored(); len(got) != 0 {
			t.Fatalf("still stored: %+v", got)
		}
	})
}

// The per-request timeout of a queued message survives: restored after a
// restart, and steered but untaken (requeued).
func TestQueuedTimeoutSurvives(t *testing.T) {
	t.Run("restored", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			q := &memQueue{msgs: []QueuedMessage{{RunID: "w1", SessionKey: "main", Channel: "ws",
				Text: "/steps shell:hang", QueuedAt: time.Now(), Timeout: 7 * time.Second}}}
			v := newBusyEnv(t, q, nil)
			if err := v.e.RestoreQueued(context.Background()); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if got := v.e.Status("main").Limits.Timeout; got != 7*time.Second {
				t.Fatalf("restored turn's timeout %v, want 7s", got)
			}
		})
	})
	t.Run("steered", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rn := lazySteerer{func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
				if turn.Message == "slow" {
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Second):
					}
					return runner.Result{Text: "done"}, nil
				}
				<-ctx.Done()
				return runner.Result{}, ctx.Err()
			}}
			v := newBusyEnv(t, nil, rn, busyMode(config.BusySteer))
			v.send(t, "r1", "slow")
			ack, err := v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: "r2",
				Text: "also", Owner: "conn1", Timeout: 9 * time.Second})
			if err != nil || ack.Status != StatusSteered {
				t.Fatalf("ack %+v err %v", ack, err)
			}
			faketime.Advance(11 * time.Second)
			synctest.Wait()
			st := v.e.Status("main")
			if !st.Running || st.Turn.RunID != "r2" || st.Limits.Timeout != 9*time.Second {
				t.Fatalf("requeued steered turn: running %v run %q timeout %v", st.Running, st.Turn.RunID, st.Limits.Timeout)
			}
		})
	})
}

// /new (Reset) drops the messages steered into the running turn that its
// runner has not taken: they belonged to the old conversation.
func TestResetDropsSteeredMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rn := lazySteerer{func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
			select {
			case <-ctx.Done():
				return runner.Result{}, ctx.Err()
			case <-time.After(5 * time.Second):
				return runner.Result{Text: "ok " + turn.Message}, nil
			}
		}}
		v := newBusyEnv(t, nil, rn, busyMode(config.BusySteer))
		v.send(t, "r1", "slow")
		if ack := v.send(t, "r2", "also do X"); ack.Status != StatusSteered {
			t.Fatalf("ack %+v", ack)
		}
		v.e.Reset("main")
		faketime.Advance(time.Minute)
		synctest.Wait()
		v.wantEnds(t, "r1 started", "r1 finished stop")
	})
}

// Without operator rights, /stop drops only the requester's queued
// messages (a restored queue: a shared session's messages of two people);
// another person's turn is not theirs to stop.
func TestStopDropsOnlyTheRequestersQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil)
		ctx := context.Background()
		v.q.msgs = []QueuedMessage{
			{RunID: "b1", SessionKey: "main", Channel: "ws", Owner: "B", Text: "/steps shell:hang", QueuedAt: time.Now()},
			{RunID: "a1", SessionKey: "main", Channel: "ws", Owner: "A", Text: "/steps say:A", QueuedAt: time.Now()},
			{RunID: "b2", SessionKey: "main", Channel: "ws", Owner: "B", Text: "/steps say:B", QueuedAt: time.Now()},
		}
		if err := v.e.RestoreQueued(ctx); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // b1 runs; a1 and b2 wait behind it
		if _, err := v.e.Stop(ctx, "main", "A", false); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("A's /stop of B's turn: %v, want ErrNotOwner", err)
		}
		res, err := v.e.Stop(ctx, "main", "B", false)
		if err != nil || res.Dropped != 1 || !res.Aborted {
			t.Fatalf("B's /stop: %+v %v; want B's turn aborted and B's queued message dropped (1)", res, err)
		}
		faketime.Advance(time.Minute)
		synctest.Wait()
		v.wantEnds(t, "b1 started", "b1 aborted user", "a1 started", "a1 finished stop")
	})
}

// A stop meant for one turn (StopRequest.RunID: a Stop button under it)
// stops nothing and drops nothing once that turn has ended — the stop
// raced its reply — and stops it as /stop does while it runs.
func TestStopForOneTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newBusyEnv(t, nil, nil)
		ctx := context.Background()
		v.send(t, "a1", "/steps shell:1s say:A")
		v.send(t, "b1", "/steps shell:hang")
		v.send(t, "c1", "/steps say:C")
		faketime.Advance(2 * time.Second)
		synctest.Wait()
		res, err := v.e.StopWith(ctx, StopRequest{SessionKey: "main", Requester: "conn1", RunID: "a1"})
		if err != nil || res.Aborted || res.Stopping || res.Dropped != 0 {
			t.Fatalf("a stop for the ended turn a1: %+v, %v; want nothing done", res, err)
		}
		if q := v.e.Status("main").Queue; len(q) != 1 || q[0].RunID != "c1" {
			t.Fatalf("queue %+v after a stop for an ended turn, want c1 still waiting", q)
		}
		res, err = v.e.StopWith(ctx, StopRequest{SessionKey: "main", Requester: "conn1", RunID: "b1"})
		if err != nil || !res.Aborted || res.Dropped != 1 {
			t.Fatalf("a stop for the running turn b1: %+v, %v; want it aborted and c1 dropped", res, err)
		}
		v.wantEnds(t, "a1 started", "a1 finished stop", "b1 started", "b1 aborted user")
	})
}
