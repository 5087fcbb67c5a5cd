package node

import (
	"fmt"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnguard/turnguard/cluster/clustertest"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/internal/natstest"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/testwait"
)

// threeStepTurn is what the engine exports for a three-step demo turn: its
// start, each step's start and end, a progress notice, two deltas and its
// end.
func threeStepTurn(run, key string) []event.Event {
	evs := []event.Event{{Kind: event.TurnStarted, Text: "hi"}}
	for i, name := range []string{"a", "b", "c"} {
		st := event.Step{Kind: event.StepTool, Name: name}
		evs = append(evs, event.Event{Kind: event.StepStarted, Step: st}, event.Event{Kind: event.StepCompleted, Step: st})
		if i == 1 {
			evs = append(evs, event.Event{Kind: event.Progress}, event.Event{Kind: event.Delta, Text: "do", FullText: "do"})
		}
	}
	evs = append(evs, event.Event{Kind: event.Delta, Text: "ne", FullText: "done"},
		event.Event{Kind: event.Finished, StopReason: event.ReasonStop, FullText: "done"})
	for i := range evs {
		evs[i].RunID, evs[i].SessionKey, evs[i].Channel, evs[i].Seq, evs[i].Time = run, key, "ws", uint64(i+1), time.Now()
	}
	return evs
}

// kept is what a watcher imports of evs: all but the deltas, as
// clustertest.Imported records them.
func kept(evs []event.Event) []string {
	var out []string
	for _, ev := range evs {
		if ev.Kind != event.Delta {
			out = append(out, fmt.Sprintf("%s %s %d", ev.Kind, ev.RunID, ev.Seq))
		}
	}
	return out
}

// Issue 21: a turn no other replica watches publishes at most two frames
// to JetStream (here one: its end); one another replica watches publishes
// every kept event; a watcher that comes mid-turn gets the turn's events
// held so far, in order, with no gap; and a replica asking about a session
// (a re-attach's status) is wanted at once, before any announcement.
func TestUnwatchedTurnPublishesAtMostTwo(t *testing.T) {
	c := natstest.Start(t, 1)
	dbURL := pgtest.New(t)
	ctx := testContext(t, 60*time.Second)
	a, b := start(t, dbURL, c, "a"), start(t, dbURL, c, "b")
	// Every JetStream publish of an event is a message on the stream's
	// subjects (tg.ev.…): count them.
	var published atomic.Int64
	sub, err := c.Connect(t, 0).Subscribe("tg.ev.>", func(*nats.Msg) { published.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	fromB := clustertest.Import(t, b)
	const key = "ws:watched-or-not"
	turn := func(n int, between func(i int)) []event.Event {
		t.Helper()
		run := fmt.Sprint("run-", n)
		if err := a.Claim(ctx, gateway.ClaimRequest{RunID: run, SessionKey: key, Channel: "ws", Text: "hi"}); err != nil {
			t.Fatal(err)
		}
		evs := threeStepTurn(run, key)
		for i, ev := range evs {
			if ev.Kind == event.Finished {
				if err := a.Finish(ctx, ev); err != nil {
					t.Fatal(err)
				}
			}
			a.Export(ev)
			if between != nil {
				between(i)
			}
		}
		return evs
	}
	imported := func(run string) []string { // kept events: deltas may drop, by design
		var out []string
		for _, s := range fromB.Snapshot() {
			if k, r, ok := cut2(s); ok && r == run && k != event.Delta.String() {
				out = append(out, s)
			}
		}
		return out
	}
	waitEnd := func(evs []event.Event) {
		t.Helper()
		end := kept(evs)[len(kept(evs))-1]
		testwait.Until(t, 15*time.Second, "b imports "+end, func() bool {
			got := imported(evs[0].RunID)
			return len(got) > 0 && got[len(got)-1] == end
		})
	}

	// Nobody on b watches: the end alone goes out.
	before := published.Load()
	evs := turn(1, nil)
	waitEnd(evs)
	if n := published.Load() - before; n > 2 {
		t.Errorf("a turn nobody else watches published %d frames to JetStream; want at most 2", n)
	}
	if got, want := imported("run-1"), kept(evs)[len(kept(evs))-1:]; !reflect.DeepEqual(got, want) {
		t.Errorf("b (not watching) imported %q; want the end only %q", got, want)
	}

	// b watches the session: every kept event, in order.
	b.Watching(key, true)
	testwait.Until(t, 15*time.Second, "a knows b watches", func() bool { return a.WatchedElsewhere(key) })
	before = published.Load()
	evs = turn(2, nil)
	waitEnd(evs)
	if n, want := published.Load()-before, int64(len(kept(evs))); n < want {
		t.Errorf("a watched turn published %d frames; want its %d kept events", n, want)
	}
	if got, want := imported("run-2"), kept(evs); !reflect.DeepEqual(got, want) {
		t.Errorf("b (watching) imported %q; want %q", got, want)
	}

	// b stops watching, and starts again in the middle of a turn: what the
	// turn held comes first, then the rest, with no gap.
	b.Watching(key, false)
	testwait.Until(t, 15*time.Second, "a knows b stopped", func() bool { return !a.WatchedElsewhere(key) })
	evs = turn(3, func(i int) {
		if i == 3 {
			b.Watching(key, true)
			testwait.Until(t, 15*time.Second, "a knows b watches again", func() bool { return a.WatchedElsewhere(key) })
		}
	})
	waitEnd(evs)
	if got, want := imported("run-3"), kept(evs); !reflect.DeepEqual(got, want) {
		t.Errorf("b, watching from the middle of the turn, imported %q; want %q", got, want)
	}
	for _, s := range fromB.Snapshot() {
		if s == "gap "+key {
			t.Fatalf("b saw a gap: %q", fromB.Snapshot())
		}
	}

	// A replica that asks for the session's status (a re-attach) is
	// wanted before the answer; what the turn held is in that status, so
	// only what follows it goes out, still with no gap.
	b.Watching(key, false)
	testwait.Until(t, 15*time.Second, "a knows b stopped", func() bool { return !a.WatchedElsewhere(key) })
	a.Serve(&echo{})
	evs = turn(4, func(i int) {
		if i != 3 {
			return
		}
		if _, err := b.ForwardStatus(ctx, "a", key); err != nil {
			t.Fatal(err)
		}
		if !a.WatchedElsewhere(key) {
			t.Error("a replica asked for a session's status does not publish its events to the asker")
		}
	})
	waitEnd(evs)
	if got, want := imported("run-4"), kept(evs[4:]); !reflect.DeepEqual(got, want) {
		t.Errorf("b, re-attached by a status in the middle of the turn, imported %q; want what followed %q", got, want)
	}
	for _, s := range fromB.Snapshot() {
		if s == "gap "+key {
			t.Fatalf("b saw a gap: %q", fromB.Snapshot())
		}
	}

	// More than a turn holds: a watcher that comes later sees a gap where
	// they were (and reloads), never a silent one.
	b.Watching(key, false)
	testwait.Until(t, 15*time.Second, "a knows b stopped", func() bool { return !a.WatchedElsewhere(key) })
	if err := a.Claim(ctx, gateway.ClaimRequest{RunID: "run-5", SessionKey: key, Channel: "ws", Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	for i := range maxHeld + 10 {
		a.Export(event.Event{Kind: event.StepCompleted, RunID: "run-5", SessionKey: key, Seq: uint64(i + 1)})
	}
	b.Watching(key, true)
	testwait.Until(t, 15*time.Second, "b sees a gap where the events that did not fit were", func() bool {
		return slices.Contains(fromB.Snapshot(), "gap "+key)
	})
}

// cut2 splits an Imported line "<kind> <run> <seq>" into kind and run.
func cut2(s string) (kind, run string, ok bool) {
	var seq int
	_, err := fmt.Sscanf(s, "%s %s %d", &kind, &run, &seq)
	return kind, run, err == nil
}

// Issue 21, three replicas: a replica imports in sequence only the
// sessions it shows. a runs a turn that b watches, so a publishes all its
// kept events; w shows nobody the session, so its Import delivers the
// turn's end alone (it used to deliver, and decode, every frame of every
// session); once w shows the session too, it gets the next turn whole, in
// order, with no gap.
func TestImportFollowsOnlyTheSessionsItShows(t *testing.T) {
	c := natstest.Start(t, 1)
	dbURL := pgtest.New(t)
	ctx := testContext(t, 60*time.Second)
	a, b, w := start(t, dbURL, c, "a"), start(t, dbURL, c, "b"), start(t, dbURL, c, "w")
	fromB, fromW := clustertest.Import(t, b), clustertest.Import(t, w)
	const key = "ws:shown-by-b"
	turn := func(run string) []event.Event {
		t.Helper()
		if err := a.Claim(ctx, gateway.ClaimRequest{RunID: run, SessionKey: key, Channel: "ws", Text: "hi"}); err != nil {
			t.Fatal(err)
		}
		evs := threeStepTurn(run, key)
		for _, ev := range evs {
			if ev.Kind == event.Finished {
				if err := a.Finish(ctx, ev); err != nil {
					t.Fatal(err)
				}
			}
			a.Export(ev)
		}
		return evs
	}
	of := func(l *clustertest.Imported, run string) []string {
		var out []string
		for _, s := range l.Snapshot() {
			if k, r, ok := cut2(s); ok && r == run && k != event.Delta.String() {
				out = append(out, s)
			}
		}
		return out
	}
	b.Watching(key, true)
	testwait.Until(t, 15*time.Second, "a knows b watches", func() bool { return a.WatchedElsewhere(key) })
	evs := turn("run-1")
	end := kept(evs)[len(kept(evs))-1]
	testwait.Until(t, 15*time.Second, "b and w import run-1's end", func() bool {
		gb, gw := of(fromB, "run-1"), of(fromW, "run-1")
		return len(gb) > 0 && gb[len(gb)-1] == end && len(gw) > 0 && gw[len(gw)-1] == end
	})
	if got, want := of(fromB, "run-1"), kept(evs); !reflect.DeepEqual(got, want) {
		t.Errorf("b (showing the session) imported %q; want %q", got, want)
	}
	if got := of(fromW, "run-1"); !reflect.DeepEqual(got, []string{end}) {
		t.Errorf("w (showing nobody the session) imported %q; want its end only %q", got, end)
	}

	w.Watching(key, true)
	evs = turn("run-2")
	end = kept(evs)[len(kept(evs))-1]
	testwait.Until(t, 15*time.Second, "w imports run-2's end", func() bool {
		gw := of(fromW, "run-2")
		return len(gw) > 0 && gw[len(gw)-1] == end
	})
	if got, want := of(fromW, "run-2"), kept(evs); !reflect.DeepEqual(got, want) {
		t.Errorf("w, showing the session now, imported %q; want %q", got, want)
	}
	for _, s := range fromW.Snapshot() {
		if s == "gap "+key {
			t.Fatalf("w saw a gap: %q", fromW.Snapshot())
		}
	}
}
