package cluster_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// TestConcurrentSendsOneSession: 150 chat.send to one session at once,
// spread over the three replicas (busy mode reject): exactly one starts a
// turn, the 149 others are refused as busy and all name that turn's run id
// — the session is claimed cluster-wide, not per replica.
func TestConcurrentSendsOneSession(t *testing.T) {
	// One connection per send (a connection's requests are handled in
	// order): 50 per replica, under server.maxConnsPerIP (64).
	const sends = 150
	c := start(t, clusterrig.Options{Config: func(_ int, cfg map[string]any) {
		clusterrig.Set(cfg, "channels.ws.busy.mode", "reject")
	}})
	sess := session("busy-150")

	var conns []*wsclient.Client
	for k := range sends {
		conns = append(conns, c.Dial(t, k%len(c.Gateways())))
	}
	type result struct {
		runID string
		ack   wsclient.Ack
		err   error
	}
	results := make([]result, sends)
	go1 := make(chan struct{})
	var wg sync.WaitGroup
	for n := range sends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runID := fmt.Sprintf("busy-%03d", n)
			<-go1
			a, err := conns[n].SendErr(sess, hangTurn, runID)
			results[n] = result{runID, a, err}
		}()
	}
	close(go1)
	wg.Wait()

	var startedIDs []string
	busyNames := map[string]int{}
	for n, r := range results {
		switch id, busy := busyRunID(r.ack); {
		case r.err != nil:
			t.Errorf("send %d (replica r%d): %v", n, n%3+1, r.err)
		case started(r.ack, r.runID):
			startedIDs = append(startedIDs, r.runID)
		case busy:
			busyNames[id]++
		default:
			t.Errorf("send %s: neither started nor busy: ok=%v status=%q err=%v %s", r.runID, r.ack.OK, r.ack.Status, r.ack.Err, r.ack.Raw)
		}
	}
	if len(startedIDs) != 1 {
		t.Fatalf("%d sends started a turn (%v); want exactly 1", len(startedIDs), startedIDs)
	}
	if len(busyNames) != 1 || busyNames[startedIDs[0]] != sends-1 {
		t.Fatalf("busy answers named %v; want all %d to name the started run %s", busyNames, sends-1, startedIDs[0])
	}
}
