package event_test

import (
	"slices"
	"testing"

	"github.com/turnguard/turnguard/event"
)

// TestBusDeliversBySession checks who receives what: all-sessions
// subscribers every event, a session's subscribers only its own, in
// subscription order; an unsubscribed handler nothing, including after the
// last per-session subscription is gone (Publish then skips the lookup).
func TestBusDeliversBySession(t *testing.T) {
	b := event.NewBus()
	var got []string
	rec := func(who string) event.Handler {
		return func(ev event.Event) { got = append(got, who+":"+ev.SessionKey) }
	}
	unAll := b.Subscribe("", rec("all"))
	unA := b.Subscribe("a", rec("a"))
	unA2 := b.Subscribe("a", rec("a2"))

	b.Publish(event.Event{Kind: event.StepStarted, SessionKey: "a"})
	b.Publish(event.Event{Kind: event.StepStarted, SessionKey: "b"})
	if want := []string{"all:a", "a:a", "a2:a", "all:b"}; !slices.Equal(got, want) {
		t.Fatalf("delivered %q, want %q", got, want)
	}
	if n := b.Subscribers(); n != 3 {
		t.Errorf("Subscribers() = %d, want 3", n)
	}

	got = nil
	unA()
	unA() // a second call is harmless
	unA2()
	b.Publish(event.Event{Kind: event.StepStarted, SessionKey: "a"})
	if want := []string{"all:a"}; !slices.Equal(got, want) {
		t.Fatalf("after the session's unsubscribes: delivered %q, want %q", got, want)
	}

	got = nil
	unB := b.Subscribe("b", rec("b"))
	b.Publish(event.Event{Kind: event.StepStarted, SessionKey: "b"})
	if want := []string{"all:b", "b:b"}; !slices.Equal(got, want) {
		t.Fatalf("a session subscribed again: delivered %q, want %q", got, want)
	}
	unB()
	unAll()
	if n := b.Subscribers(); n != 0 {
		t.Errorf("Subscribers() = %d after every unsubscribe, want 0", n)
	}
}

// TestPublishWithoutSessionSubscribersAllocatesNothing checks the bus's
// share of the hot path.
func TestPublishWithoutSessionSubscribersAllocatesNothing(t *testing.T) {
	b := event.NewBus()
	n := 0
	b.Subscribe("", func(event.Event) { n++ })
	ev := event.Event{Kind: event.StepCompleted, RunID: "r", SessionKey: "agent:main:x"}
	if a := testing.AllocsPerRun(100, func() { b.Publish(ev) }); a != 0 {
		t.Errorf("Publish allocates %.1f times, want 0", a)
	}
	if n == 0 {
		t.Error("the handler was not called")
	}
}

// TestLocals checks a run's subscriber slots: each Local has its own slot,
// typed; an event without Locals has none and Set stores nothing; nil
// clears.
func TestLocals(t *testing.T) {
	type stateA struct{ n int }
	type stateB struct{ s string }
	la, lb := event.NewLocal[stateA](), event.NewLocal[stateB]()
	ev := event.Event{Locals: new(event.Locals)}
	if la.Get(ev) != nil || lb.Get(ev) != nil {
		t.Fatal("a new run has state in its slots")
	}
	a, bb := &stateA{n: 1}, &stateB{s: "x"}
	if !la.Set(ev, a) || !lb.Set(ev, bb) {
		t.Fatal("Set on an event with Locals reported false")
	}
	copied := ev // events are copied: the slots are the run's, shared by its events
	if la.Get(copied) != a || lb.Get(copied) != bb {
		t.Fatal("a copy of the event does not reach the run's slots")
	}
	la.Set(ev, nil)
	if la.Get(ev) != nil || lb.Get(ev) != bb {
		t.Fatal("clearing one slot changed the wrong one")
	}
	var bare event.Event
	if la.Set(bare, a) || la.Get(bare) != nil {
		t.Error("an event without Locals stored or returned state")
	}
}
