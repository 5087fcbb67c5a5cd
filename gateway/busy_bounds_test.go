package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner"
)

// holdingSteerer says it steers but never takes its inbox; a turn whose
// message is "slow" runs until release is closed or the turn is stopped.
func holdingSteerer(release <-chan struct{}) runner.Runner {
	return lazySteerer{func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		if turn.Message == "slow" {
			select {
			case <-release:
			case <-ctx.Done():
				return runner.Result{}, ctx.Err()
			}
		}
		return runner.Result{Text: "ok " + turn.Message}, nil
	}}
}

// busyBounds sets busy.maxQueued and busy.maxQueuedBytes.
func busyBounds(maxQueued, maxBytes int) func(*config.Config) {
	return func(c *config.Config) {
		c.Agents.Defaults.Busy.MaxQueued = &maxQueued
		c.Agents.Defaults.Busy.MaxQueuedBytes = &maxBytes
	}
}

// refusedWith sends text as runID and wants it refused as a full queue
// whose words the person reads are want.
func (v *busyEnv) refusedWith(t *testing.T, runID, text, want string) {
	t.Helper()
	ack, err := v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: runID, Text: text, Owner: "conn1"})
	var full *QueueFullError
	if !errors.As(err, &full) || !errors.Is(err, ErrBusy) {
		t.Fatalf("Send(%s, %d bytes) = %+v, %v; want refused as a full queue", runID, len(text), ack, err)
	}
	if got := full.UserText(); got != want {
		t.Fatalf("Send(%s) refused with\n %q\nwant\n %q", runID, got, want)
	}
}

const (
	wordsThreeWaiting = "📥 3 messages are already waiting — wait for an answer, or send /stop to stop the request and drop them."
	wordsTenBytes     = "📥 That message would bring the text waiting for the assistant over its limit of 10 bytes — wait for an answer and send it then, or send /stop to stop the request and drop what waits."
)

// TestBusyBoundsInEveryMode: busy.maxQueued and busy.maxQueuedBytes hold
// in every busy mode — in steer mode the messages handed to the running
// turn and not yet taken count — and what is refused is said in words.
func TestBusyBoundsInEveryMode(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		status Status // of the messages that may wait
	}{
		{config.BusyQueue, StatusQueued},
		{config.BusyCollect, StatusQueued},
		{config.BusySteer, StatusSteered},
		{config.BusyInterrupt, ""}, // each replaces the running turn: only the budget of one message is checked
	} {
		t.Run(tc.mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				defer close(release)
				v := newBusyEnv(t, nil, holdingSteerer(release), busyMode(tc.mode), busyBounds(3, 10))
				v.send(t, "r1", "slow")
				// One message over the budget on its own: refused, and the
				// running turn goes on (not even interrupt stops it).
				v.refusedWith(t, "big", "12345678901", wordsTenBytes)
				if st := v.e.Status("main"); !st.Running || st.Turn.RunID != "r1" || len(st.Queue) != 0 {
					t.Fatalf("status after the refusal: %+v", st)
				}
				if tc.status == "" {
					return
				}
				for _, m := range []struct{ id, text string }{{"r2", "1234"}, {"r3", "12345"}} {
					if ack := v.send(t, m.id, m.text); ack.Status != tc.status {
						t.Fatalf("%s: ack %+v, want %s", m.id, ack, tc.status)
					}
				}
				v.refusedWith(t, "r4", "12", wordsTenBytes) // 9 bytes wait: 11 would
				if ack := v.send(t, "r5", "1"); ack.Status != tc.status {
					t.Fatalf("r5: ack %+v, want %s", ack, tc.status)
				}
				v.refusedWith(t, "r6", "1", wordsThreeWaiting)
			})
		})
	}
}

// TestSteerFloodBounded: 3,200 messages of 99 KB steered into a turn whose
// runner takes none (before: all 3,200 "steered", 31 MB → 772 MB): the
// first busy.maxQueued (5) wait, every other one is refused in words, and
// when the turn ends the five untaken run in one follow-up turn — the
// queue never holds more than five.
func TestSteerFloodBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		v := newBusyEnv(t, nil, holdingSteerer(release), busyMode(config.BusySteer))
		v.send(t, "r1", "slow")
		text := strings.Repeat("x", 99_000)
		steered, refused := 0, 0
		for i := range 3200 {
			ack, err := v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws",
				RunID: fmt.Sprintf("s%04d", i), Text: text, Owner: "conn1"})
			var full *QueueFullError
			switch {
			case err == nil && ack.Status == StatusSteered:
				steered++
			case errors.As(err, &full) && full.UserText() == "📥 5 messages are already waiting — wait for an answer, or send /stop to stop the request and drop them.":
				refused++
			default:
				t.Fatalf("message %d: %+v, %v", i, ack, err)
			}
		}
		if steered != 5 || refused != 3195 {
			t.Fatalf("%d steered, %d refused; want 5 and 3195", steered, refused)
		}
		close(release)
		v.wait(t, "r1")
		synctest.Wait()
		ends := v.ends()
		if len(ends) != 4 || ends[1] != "r1 finished stop" || ends[2] != "s0000 started" {
			t.Fatalf("turns: %q", ends)
		}
		if st := v.e.Status("main"); len(st.Queue) != 0 {
			t.Fatalf("still waiting: %d", len(st.Queue))
		}
	})
}
