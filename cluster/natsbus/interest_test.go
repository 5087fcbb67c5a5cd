package natsbus

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/natstest"
	"github.com/turnguard/turnguard/internal/testwait"
)

// wantedLog records OnWanted calls.
type wantedLog struct {
	mu   sync.Mutex
	keys []string
}

func (l *wantedLog) add(k string) { l.mu.Lock(); l.keys = append(l.keys, k); l.mu.Unlock() }
func (l *wantedLog) has(k string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.keys, k)
}

// The registry of watched sessions across replicas: a change reaches the
// others at once and OnWanted names a session nobody wanted before; a
// replica that starts later learns the others' sets (it asks); watching
// everything, or more sessions than one announcement names, wants every
// session; a replica gone silent is forgotten after three refreshes; a
// Touch wants a session at once and lapses.
func TestInterestFollowsTheReplicas(t *testing.T) {
	c := natstest.Start(t, 1)
	const refresh = 100 * time.Millisecond
	start := func(id string, l *wantedLog) *Interest {
		t.Helper()
		o := InterestOptions{Replica: id, Refresh: refresh, OnError: func(err error) { t.Error(err) }}
		if l != nil {
			o.OnWanted = l.add
		}
		i, err := NewInterest(c.Connect(t, 0), o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(i.Close)
		return i
	}
	var seenByA wantedLog
	a, b := start("a", &seenByA), start("b", nil)
	wait := func(what string, cond func() bool) {
		t.Helper()
		testwait.Until(t, 5*time.Second, what, cond)
	}
	if a.Wanted("s1") || b.Wanted("s1") {
		t.Fatal("wanted before anyone watched")
	}
	b.Watch("s1", true)
	wait("a learns that b watches s1", func() bool { return a.Wanted("s1") && seenByA.has("s1") })
	if a.Wanted("s2") || b.Wanted("s1") {
		t.Error("a wants what nobody watches, or b wants its own session")
	}
	b.Watch("s1", false)
	wait("a learns that b stopped", func() bool { return !a.Wanted("s1") })

	b.Watch("s3", true)
	late := start("late", nil)
	wait("a replica that starts later learns b's set", func() bool { return late.Wanted("s3") })

	b.WatchAll(true)
	wait("watching everything wants every session", func() bool { return a.Wanted("any") && seenByA.has("") })
	b.WatchAll(false)
	wait("and no longer", func() bool { return !a.Wanted("any") && a.Wanted("s3") })
	for k := range maxAnnounced + 1 {
		b.Watch(fmt.Sprint("many-", k), true)
	}
	wait("more sessions than an announcement names: every session", func() bool { return a.Wanted("any") })
	for k := range maxAnnounced + 1 {
		b.Watch(fmt.Sprint("many-", k), false)
	}
	wait("named again", func() bool { return !a.Wanted("any") && a.Wanted("s3") })

	b.Close() // silent from now on, as a replica that died
	wait("a replica gone silent is forgotten", func() bool { return !a.Wanted("s3") })

	a.Touch("late", "s4")
	if !a.Wanted("s4") {
		t.Error("a Touch does not want the session at once")
	}
	a.Touch("a", "s5")
	if a.Wanted("s5") {
		t.Error("a replica's Touch of itself wants the session")
	}
	wait("a Touch lapses", func() bool { return !a.Wanted("s4") })
}
