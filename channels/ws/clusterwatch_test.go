package ws

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/cluster/inproc"
	"github.com/turnguard/turnguard/internal/testwait"
)

// watchLog is an in-process replica that records what the engine tells
// it of this replica's watchers (gateway.Watches).
type watchLog struct {
	*inproc.Member
	mu    sync.Mutex
	calls []string
}

func (w *watchLog) Watching(key string, on bool) { w.add(fmt.Sprintf("%s %v", key, on)) }
func (w *watchLog) WatchingAll(on bool)          { w.add(fmt.Sprintf("* %v", on)) }

func (w *watchLog) add(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, s)
}

func (w *watchLog) snapshot() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.calls)
}

// In cluster mode the server tells the engine (and so the other replicas,
// which publish a turn's live events only while some replica shows the
// session: issue 21) of the first connection watching a session and the
// last one leaving it, and of the first and last connection following
// every session — once each, not per connection.
func TestClusterIsToldWhichSessionsAreWatched(t *testing.T) {
	w := &watchLog{Member: inproc.NewHub().Join("a")}
	e := newTCPEnv(t, envOpts{cluster: w})
	const key = "agent:main:watched"
	c1, _ := e.connect("tui", "")
	c2, _ := e.connect("tui", "")
	for _, c := range []*client{c1, c2} {
		if r := c.call("chat.history", map[string]any{"sessionKey": key}); !r.OK {
			t.Fatalf("chat.history: %s", r.raw)
		}
	}
	all1, _ := e.connect("tui", "")
	all2, _ := e.connect("tui", "")
	for _, c := range []*client{all1, all2} {
		if r := c.call("sessions.subscribe", map[string]any{}); !r.OK {
			t.Fatalf("sessions.subscribe: %s", r.raw)
		}
	}
	if got, want := w.snapshot(), []string{key + " true", "* true"}; !slices.Equal(got, want) {
		t.Fatalf("told %q; want %q", got, want)
	}
	c1.ws.Close()
	all1.ws.Close()
	c2.ws.Close()
	testwait.Until(t, 5*time.Second, "told of the session's last watcher", func() bool { return len(w.snapshot()) >= 3 })
	all2.ws.Close()
	testwait.Until(t, 5*time.Second, "told of the last connection following everything", func() bool { return len(w.snapshot()) >= 4 })
	if got, want := w.snapshot(), []string{key + " true", "* true", key + " false", "* false"}; !slices.Equal(got, want) {
		t.Fatalf("told %q; want %q", got, want)
	}
}
