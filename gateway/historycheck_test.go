package gateway_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/turnguard/turnguard/cluster/inproc"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/runner"
)

// sharedHistory is the database's messages as the replicas of a cluster
// share them: the claim writes a turn's user message, the finish its
// reply (storingMember), each with the next id. It is the replicas'
// HistoryChecker and counts the loads and checks each replica made.
type sharedHistory struct {
	mu         sync.Mutex
	ids        []int64
	msgs       []gateway.Message
	next       int64
	resetAfter int64
	busyMode   string
	loads      map[string]int // by replica
	checks     map[string]int
}

func (h *sharedHistory) add(m gateway.Message) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	h.ids, h.msgs = append(h.ids, h.next), append(h.msgs, m)
}

// reset is a /new elsewhere: the history starts after the last message.
func (h *sharedHistory) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.resetAfter = h.next
}

func (h *sharedHistory) counts(replica string) (loads, checks int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.loads[replica], h.checks[replica]
}

// checker is replica's view of h.
type checker struct {
	h       *sharedHistory
	replica string
}

func (c checker) LoadMarked(_ context.Context, _ string, limit int) ([]gateway.Message, gateway.HistoryMark, error) {
	h := c.h
	h.mu.Lock()
	defer h.mu.Unlock()
	h.loads[c.replica]++
	var out []gateway.Message
	for i, id := range h.ids {
		if id > h.resetAfter {
			out = append(out, h.msgs[i])
		}
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, gateway.HistoryMark{LastID: h.next, ResetAfter: h.resetAfter}, nil
}

func (c checker) Since(_ context.Context, _ string, mark gateway.HistoryMark, n int) (gateway.HistorySince, error) {
	h := c.h
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checks[c.replica]++
	out := gateway.HistorySince{Mark: gateway.HistoryMark{LastID: mark.LastID, ResetAfter: h.resetAfter}, BusyMode: h.busyMode}
	for i, id := range h.ids {
		if id > mark.LastID && len(out.Messages) < n {
			m := h.msgs[i]
			out.Messages = append(out.Messages, gateway.HistoryKey{RunID: m.RunID, Role: m.Role, StopReason: m.StopReason})
			out.Mark.LastID = id
		}
	}
	return out, nil
}

// storingMember writes what the claim and the finish write to the
// database's messages.
type storingMember struct {
	*inproc.Member
	h *sharedHistory
}

func (m storingMember) Claim(ctx context.Context, c gateway.ClaimRequest) error {
	if err := m.Member.Claim(ctx, c); err != nil {
		return err
	}
	m.h.add(gateway.Message{RunID: c.RunID, Role: "user", Text: c.Text})
	return nil
}

func (m storingMember) Finish(ctx context.Context, ev event.Event) error {
	if err := m.Member.Finish(ctx, ev); err != nil {
		return err
	}
	m.h.add(gateway.Message{RunID: ev.RunID, Role: "assistant", Text: ev.FullText, StopReason: ev.StopReason})
	return nil
}

// TestClusterKeepsAnUnchangedHistoryAndReloadsAChangedOne: in cluster mode
// an idle session's history is checked against the shared store before a
// turn, not reloaded whole (issue 21: the reload was two statements and
// most of a replica's store reads per turn). The cache is kept while the
// store shows only the replica's own messages since, and reloaded when
// another replica ran a turn of the session or a /new moved its reset
// mark; the check also brings a busy mode set elsewhere. Each turn's
// runner gets the whole conversation either way.
func TestClusterKeepsAnUnchangedHistoryAndReloadsAChangedOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &sharedHistory{loads: map[string]int{}, checks: map[string]int{}}
		var mu sync.Mutex
		seen := map[string][]string{} // run id → the history its runner got
		rn := runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
			var texts []string
			for _, m := range turn.History {
				texts = append(texts, m.Text)
			}
			mu.Lock()
			seen[turn.RunID] = texts
			mu.Unlock()
			return runner.Result{Text: "re " + turn.Message}, nil
		})
		c := config.Default()
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		hub := inproc.NewHub()
		engines := map[string]*gateway.Engine{}
		for _, id := range []string{"a", "b"} {
			m := storingMember{Member: hub.Join(id), h: h}
			e, err := gateway.New(gateway.Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": rn},
				Cluster: m, HistoryCheck: checker{h: h, replica: id}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			e.Start(ctx)
			m.Serve(e)
			t.Cleanup(func() { e.Shutdown(context.Background()); cancel() })
			engines[id] = e
		}
		turn := func(replica, runID string) []string {
			t.Helper()
			e := engines[replica]
			if _, err := send(t, e, runID, runID); err != nil {
				t.Fatalf("%s on %s: %v", runID, replica, err)
			}
			if _, ok := e.Wait(context.Background(), runID); !ok {
				t.Fatalf("%s on %s: no outcome", runID, replica)
			}
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			return seen[runID]
		}
		want := func(runID string, got []string, texts ...string) {
			t.Helper()
			if !slices.Equal(got, texts) {
				t.Errorf("%s's runner got the history %q, want %q", runID, got, texts)
			}
		}
		counts := func(step, replica string, loads, checks int) {
			t.Helper()
			if l, c := h.counts(replica); l != loads || c != checks {
				t.Errorf("after %s, replica %s loaded the history %d times and checked it %d times, want %d and %d",
					step, replica, l, c, loads, checks)
			}
		}

		want("r1", turn("a", "r1"))
		counts("a's first turn", "a", 1, 0)
		// Nothing changed: checked, kept.
		want("r2", turn("a", "r2"), "r1", "re r1")
		want("r3", turn("a", "r3"), "r1", "re r1", "r2", "re r2")
		counts("a's next turns", "a", 1, 2)

		// Another replica's turn: checked, found, reloaded.
		want("r4", turn("b", "r4"), "r1", "re r1", "r2", "re r2", "r3", "re r3")
		want("r5", turn("a", "r5"), "r1", "re r1", "r2", "re r2", "r3", "re r3", "r4", "re r4")
		counts("b's turn", "a", 2, 3)
		want("r6", turn("a", "r6"), "r1", "re r1", "r2", "re r2", "r3", "re r3", "r4", "re r4", "r5", "re r5")
		counts("a's turn after the reload", "a", 2, 4)

		// A /new elsewhere: the reset mark moved, reloaded.
		h.reset()
		want("r7", turn("a", "r7"))
		counts("a /new elsewhere", "a", 3, 5)

		// A busy mode set elsewhere comes with the check.
		h.mu.Lock()
		h.busyMode = string(gateway.BusyQueue)
		h.mu.Unlock()
		want("r8", turn("a", "r8"), "r7", "re r7")
		counts("a busy mode set elsewhere", "a", 3, 6)
		info, err := engines["a"].QueueInfo(context.Background(), "main", "ws")
		if err != nil || info.Mode != gateway.BusyQueue || !info.Own {
			t.Errorf("QueueInfo = %+v, %v; want the busy mode set elsewhere", info, err)
		}
		if t.Failed() {
			t.Logf("the store's messages: %+v", h.msgs)
		}
	})
}
