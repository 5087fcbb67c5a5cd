package acp

import (
	"testing"
	"testing/synctest"
	"time"
)

func newTestAgent() *agent { return &agent{dead: make(chan struct{})} }

// TestTableRules: which turns reuse a conversation's ACP session and which
// get a new one, on the bubble's clock.
func TestTableRules(t *testing.T) {
	const idle = 30 * time.Minute
	type step struct {
		key, conv string
		after     time.Duration // since the previous step
		ag        int           // which agent serves the turn (0 or 1)
		fresh     bool          // a new ACP session is wanted
	}
	tests := []struct {
		name  string
		die   bool // agent 0 dies after the first turn
		steps []step
	}{{
		name:  "a conversation keeps its session within idle",
		steps: []step{{"k", "c1", 0, 0, true}, {"k", "c1", idle - time.Second, 0, false}, {"k", "c1", idle - time.Second, 0, false}},
	}, {
		name:  "idle expiry starts a new session",
		steps: []step{{"k", "c1", 0, 0, true}, {"k", "c1", idle, 0, true}},
	}, {
		name:  "/new (a new conversation of the key) starts a new session",
		steps: []step{{"k", "c1", 0, 0, true}, {"k", "c2", time.Second, 0, true}, {"k", "c2", time.Second, 0, false}},
	}, {
		name:  "conversations are apart",
		steps: []step{{"a", "c1", 0, 0, true}, {"b", "c2", 0, 0, true}, {"a", "c1", 0, 0, false}, {"b", "c2", 0, 0, false}},
	}, {
		name:  "a new agent process means new sessions",
		steps: []step{{"k", "c1", 0, 0, true}, {"k", "c1", time.Second, 1, true}},
	}, {
		name:  "a dead agent's session is not reused",
		die:   true,
		steps: []step{{"k", "c1", 0, 0, true}, {"k", "c1", time.Second, 0, true}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tab := newTable(idle)
				ags := []*agent{newTestAgent(), newTestAgent()}
				now := time.Now()
				for i, st := range tc.steps {
					now = now.Add(st.after)
					s, fresh, _ := tab.take(st.key, st.conv, ags[st.ag], now)
					if fresh != st.fresh {
						t.Fatalf("step %d (%s): fresh %v, want %v", i, st.conv, fresh, st.fresh)
					}
					if fresh {
						s.id = "acp-" + st.conv
					}
					tab.release(s, now)
					if i == 0 && tc.die {
						close(ags[0].dead)
					}
				}
			})
		})
	}
}

// TestTableExpire: expire forgets the sessions unused for idle, keeps a
// busy one, and says when the next one expires; /new drops the old
// conversation at once and returns it (to be closed).
func TestTableExpire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const idle = time.Hour
		tab := newTable(idle)
		ag := newTestAgent()
		t0 := time.Now()
		a, _, _ := tab.take("a", "ca", ag, t0)
		a.id = "1"
		tab.release(a, t0)
		b, _, _ := tab.take("b", "cb", ag, t0.Add(10*time.Minute))
		b.id = "2"
		tab.release(b, t0.Add(10*time.Minute))
		busy, _, _ := tab.take("c", "cc", ag, t0)
		busy.id = "3"

		if next := tab.expire(t0.Add(idle - time.Minute)); !next.Equal(t0.Add(idle)) || tab.uses(ag) != 3 {
			t.Fatalf("before idle: next %v, uses %d", next.Sub(t0), tab.uses(ag))
		}
		if next := tab.expire(t0.Add(idle)); !next.Equal(t0.Add(idle+10*time.Minute)) || tab.uses(ag) != 2 {
			t.Fatalf("at idle: next %v, uses %d (want b and the busy c)", next.Sub(t0), tab.uses(ag))
		}
		if _, ok := tab.convs["cc"]; !ok {
			t.Fatal("a busy session expired")
		}
		// /new for b: the old conversation goes at once, and take hands
		// it over to be closed.
		s, fresh, gone := tab.take("b", "cb2", ag, t0.Add(idle))
		if !fresh || tab.convs["cb"] != nil {
			t.Fatalf("after /new: fresh %v, old session kept %v", fresh, tab.convs["cb"] != nil)
		}
		if gone == nil || gone.id != "2" {
			t.Errorf("after /new: dropped session %+v, want b's (id 2) to close", gone)
		}
		tab.release(s, t0.Add(idle)) // never opened: forgotten
		if tab.convs["cb2"] != nil {
			t.Error("a session that never opened is kept")
		}
	})
}
