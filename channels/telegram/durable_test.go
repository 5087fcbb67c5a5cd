package telegram

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
	"github.com/turnguard/turnguard/store"
)

// outboxCounts reads the store's outbox counts.
func outboxCounts(t *testing.T, st *store.SQLite) store.OutboxCounts {
	t.Helper()
	c, err := st.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDurableEndings: with a real SQLite store writing the endings, the
// user reads each turn's reply, or its partial reply and notice, once, in
// order after the live view's closing edit, and every outbox row ends
// delivered; the shutdown notice written while the channel closes is
// delivered by Close.
func TestDurableEndings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))
		h := newHarness(t, setup{store: st, adjust: func(c *config.Config) {
			c.Channels.Telegram.Timeouts.StepTimeoutSeconds = secs(100)
		}})
		h.say(alice, "/steps say:Hello")
		h.advance(5 * time.Second)
		h.wantScreen(alice, "Hello")

		h.say(alice, "/steps say:Half shell:hang")
		h.advance(2 * time.Minute)
		h.wantScreen(alice, "Hello", "⏹️ shell stopped after 1 min 40 s.", "Half",
			"⚠️ No progress for 1 min 40 s — shell never finished. The task may be stuck. Retry or ask for a simpler approach.")
		if c := outboxCounts(t, st.st); c.Pending != 0 || c.Failed != 0 {
			t.Errorf("outbox %+v, want everything delivered", c)
		}

		h.say(bob, "/steps shell:hang")
		h.advance(5 * time.Second)
		h.stop()
		if got := h.last(bob); !strings.HasPrefix(got, "⚠️ The gateway is shutting down") {
			t.Errorf("bob's last message = %q, want the shutdown notice", got)
		}
		if c := outboxCounts(t, st.st); c.Pending != 0 || c.Failed != 0 {
			t.Errorf("outbox after Close %+v, want everything delivered", c)
		}
	})
}

// crashingOutbox is the store as a process sees it that is killed when it
// tries to record a delivery: MarkDelivered never commits, and nothing the
// process asks of the store afterwards happens.
type crashingOutbox struct {
	Outbox
	dead atomic.Bool
}

var errKilled = errors.New("the process was killed")

func (o *crashingOutbox) MarkDelivered(context.Context, int64) error {
	o.dead.Store(true)
	return errKilled
}

func (o *crashingOutbox) MarkAttempt(ctx context.Context, id int64, err error) error {
	if o.dead.Load() {
		return errKilled
	}
	return o.Outbox.MarkAttempt(ctx, id, err)
}

func (o *crashingOutbox) MarkFailed(ctx context.Context, id int64, reason string) error {
	if o.dead.Load() {
		return errKilled
	}
	return o.Outbox.MarkFailed(ctx, id, reason)
}

func (o *crashingOutbox) Pending(ctx context.Context, channel string, limit int) ([]store.OutboxMessage, error) {
	if o.dead.Load() {
		return nil, errKilled
	}
	return o.Outbox.Pending(ctx, channel, limit)
}

// TestDeliveredExactlyOnceAfterRestart: a gateway dies at some instant
// after a Telegram turn ended, and the next start (the same SQLite file)
// delivers what it left. The guarantee, from the store's transaction (see
// store.TestEndTurnWritesOutboxInSameTx for real kills around the commit):
//   - died after the commit, before the send: the reply is delivered
//     exactly once after the restart (the row is pending, nothing was
//     sent), and a further restart sends nothing;
//   - died after Telegram accepted the message, before MarkDelivered
//     committed: the reply is delivered again after the restart — at least
//     once, not exactly once: sendMessage has no idempotency key, so the
//     gateway cannot tell whether the lost call reached the chat. It is the
//     window of one HTTP answer and one small commit;
//   - died before the commit: the turn is still "running" in the file and
//     the restart reports it interrupted (cmd/gateway, its crash tests).
func TestDeliveredExactlyOnceAfterRestart(t *testing.T) {
	ctx := context.Background()
	t.Run("after commit before send", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "turnguard.db")
			// The first gateway: the turn ends, the store commits its end
			// and its reply, and the process dies before the channel
			// claimed it (no channel is running at all).
			st := openStore(t, path)
			src := config.NewSource(testConfig(nil))
			d := demo.New()
			eng, err := gateway.New(gateway.Options{Config: src, Runners: map[string]runner.Runner{"demo": d}})
			if err != nil {
				t.Fatal(err)
			}
			eng.Start(ctx)
			unsub := eng.Bus().Subscribe("", st.st.Handle)
			if _, err := eng.Send(ctx, gateway.SendRequest{SessionKey: SessionKey(alice), Channel: config.ChannelTelegram,
				ChatRef: "1001", RunID: "tg-1001-1", Text: "/steps say:Hello"}); err != nil {
				t.Fatal(err)
			}
			if _, ok := eng.Wait(ctx, "tg-1001-1"); !ok {
				t.Fatal("the turn did not end")
			}
			if err := st.st.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			unsub()
			eng.Shutdown(ctx)
			st.st.Close()

			// The restart delivers it once.
			st2 := openStore(t, path)
			h := newHarness(t, setup{store: st2})
			h.advance(5 * time.Second)
			h.wantScreen(alice, "Hello")
			h.stop()
			if c := outboxCounts(t, st2.st); c.Pending != 0 || c.Delivered != 1 {
				t.Errorf("outbox after the restart %+v, want the reply delivered", c)
			}
			st2.st.Close()

			// A further restart sends nothing.
			st3 := openStore(t, path)
			h3 := newHarness(t, setup{store: st3})
			h3.advance(5 * time.Second)
			h3.wantScreen(alice)
		})
	})
	t.Run("after send before MarkDelivered", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "turnguard.db")
			st := openStore(t, path)
			crash := &crashingOutbox{Outbox: st.st}
			h := newHarness(t, setup{store: st, storeOutbox: crash})
			h.say(alice, "/steps say:Hello")
			h.advance(5 * time.Second)
			h.wantScreen(alice, "Hello")
			if !crash.dead.Load() {
				t.Fatal("the delivery was not recorded")
			}
			h.stop()
			st.st.Close()

			st2 := openStore(t, path)
			h2 := newHarness(t, setup{store: st2})
			h2.advance(5 * time.Second)
			h2.wantScreen(alice, "Hello") // the second time the user reads it: at least once
			h2.stop()
			if c := outboxCounts(t, st2.st); c.Pending != 0 || c.Delivered != 1 {
				t.Errorf("outbox after the restart %+v, want the reply delivered", c)
			}
		})
	})
}

// failingEnqueue is the store's outbox whose synchronous Enqueue fails, as
// it does while the disk is full.
type failingEnqueue struct{ Outbox }

func (failingEnqueue) Enqueue(context.Context, store.OutboxMessage) (int64, error) {
	return 0, errors.New("database or disk is full")
}

// TestDurableEndingKeepsOrder: while the store has not yet recorded a
// turn's end, the chat holds the ending's place: an answer to a command
// sent right after the turn ended comes after the reply, not before.
func TestDurableEndingKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))
		h := newHarness(t, setup{store: st})
		st.hold() // the store's writer is slow
		h.say(alice, "/steps say:Hello")
		h.say(alice, "/status")
		h.advance(3 * time.Second)
		h.wantScreen(alice) // nothing overtakes the reply
		st.release()
		synctest.Wait()
		h.advance(3 * time.Second)
		h.wantScreen(alice, "Hello", textIdle)
		if c := outboxCounts(t, st.st); c.Pending != 0 || c.Delivered != 1 {
			t.Errorf("outbox %+v, want the reply delivered", c)
		}
	})
}

// TestDurableEndingWhenStoreCannotWrite: a turn's ending the store cannot
// record in time (its disk is full) is sent from memory after claimWait —
// the user does not wait for the disk — and when the store writes it
// later, it is marked delivered, not sent a second time.
func TestDurableEndingWhenStoreCannotWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))
		h := newHarness(t, setup{store: st, storeOutbox: failingEnqueue{st.st}})
		st.hold()
		h.say(alice, "/steps say:Hello")
		h.advance(claimWait - time.Second)
		h.wantScreen(alice)
		h.advance(2 * time.Second)
		h.wantScreen(alice, "Hello")
		if !strings.Contains(h.logs.String(), "sending it from memory") {
			t.Errorf("the fallback was not logged:\n%s", h.logs.String())
		}
		st.release() // the disk has room again
		synctest.Wait()
		h.advance(5 * time.Second)
		h.wantScreen(alice, "Hello")
		if c := outboxCounts(t, st.st); c.Pending != 0 || c.Delivered != 1 {
			t.Errorf("outbox %+v, want the late row marked delivered", c)
		}
	})
}

// TestDurableFailedEndingWaitsForSweep: a reply whose delivery failed
// (Telegram answered 503 to every try) stays pending and is sent again by
// the periodic sweep — not each time another turn's ending is claimed.
func TestDurableFailedEndingWaitsForSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))
		h := newHarness(t, setup{store: st, prepare: func(f *fakeAPI, _ *memTransport) {
			f.fail(fault{Method: "sendMessage", Chat: alice, Times: maxAttempts, Status: 503, Desc: "503"})
		}})
		h.say(alice, "/steps say:First")
		h.advance(time.Minute)
		h.wantScreen(alice)
		h.say(bob, "/steps say:Other_chat")
		h.advance(time.Minute)
		h.wantScreen(bob, "Other chat")
		h.wantScreen(alice) // not resent by bob's ending
		if c := outboxCounts(t, st.st); c.Pending != 1 {
			t.Errorf("outbox %+v, want alice's reply pending", c)
		}
		h.advance(resendInterval)
		h.wantScreen(alice, "First")
	})
}
