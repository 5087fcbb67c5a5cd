package cluster_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/testwait"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// TestPostgresDown: PostgreSQL is stopped for two leases while two turns
// run (on two replicas). Meanwhile a new message on every replica is refused
// at once with a retryable error — not left hanging. Once the database is
// back, each running turn has ended exactly once (one terminal entry in
// its history, at most one terminal event for its watcher), and every
// session takes messages again.
func TestPostgresDown(t *testing.T) {
	c := start(t, clusterrig.Options{Lease: 3 * time.Second, Config: func(_ int, cfg map[string]any) {
		clusterrig.Set(cfg, "channels.ws.busy.mode", "reject")
	}})
	type turn struct {
		sess, runID string
		watcher     *wsclient.Client
	}
	var turns []turn
	for i := range 2 {
		tr := turn{sess: session(fmt.Sprintf("pg-down-%d", i)), runID: fmt.Sprintf("run-pg-%d", i)}
		tr.watcher = c.Dial(t, i)
		tr.watcher.MustStart(tr.sess, hangTurn, tr.runID)
		tr.watcher.WaitEvent(10*time.Second, "the shell step", toolStarted(tr.runID, "shell"))
		turns = append(turns, tr)
	}
	var clients []*wsclient.Client
	for i := range c.Gateways() {
		clients = append(clients, c.Dial(t, i))
	}

	pgtest.Restart(t, func() {
		down := time.Now()
		for i, cl := range clients {
			sent := time.Now()
			a, err := cl.SendErr(session(fmt.Sprintf("pg-new-%d", i)), "/steps say:hi", fmt.Sprintf("run-pg-new-%d", i))
			took := time.Since(sent)
			switch {
			case err != nil:
				t.Errorf("r%d: a send while PostgreSQL is down: %v (after %v)", i+1, err, took)
			case !retryableRefusal(a):
				t.Errorf("r%d: a send while PostgreSQL is down: ok=%v status=%q err=%+v; want a retryable refusal", i+1, a.OK, a.Status, a.Err)
			case took > refusalWithin:
				t.Errorf("r%d: the refusal took %v; want it at once, not a hang", i+1, took)
			}
		}
		time.Sleep(time.Until(down.Add(2 * c.Lease()))) // real time: the database stays down for two leases
	})

	for _, tr := range turns {
		var ends []string
		testwait.Until(t, 3*c.Lease()+10*time.Second, "the end of "+tr.runID+" in its history", func() bool {
			ends = terminalEntries(clients[2].History(tr.sess))
			return len(ends) > 0
		})
		// Any further ending (a second survivor, a replayed outbox row)
		// has its chance within another lease.
		time.Sleep(c.Lease() + time.Second) // real time: showing that no second ending comes
		if ends = terminalEntries(clients[2].History(tr.sess)); len(ends) != 1 {
			t.Errorf("%s: %d terminal entries in the history, want exactly 1: %q", tr.runID, len(ends), ends)
		}
		n := 0
		for _, e := range tr.watcher.RunEvents(tr.runID) {
			if e.Terminal() {
				n++
			}
		}
		if n > 1 {
			t.Errorf("%s: the watcher saw %d terminal events, want at most 1", tr.runID, n)
		}
		waitFree(t, clients[2], tr.sess, "/steps say:back", 10*time.Second)
	}
}
