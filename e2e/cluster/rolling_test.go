package cluster_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/testwait"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// TestRollingRestart: the three replicas are restarted one after the other
// (SIGTERM, wait for the exit, start again) while a light load of short
// turns runs, each in its own session, sent to whichever replicas are up.
// Every turn that was started ends, in its session's history, with exactly
// one terminal message — its reply, or the shutdown notice — none lost.
func TestRollingRestart(t *testing.T) {
	c := start(t, clusterrig.Options{})
	var (
		mu       sync.Mutex
		down     = -1 // the replica being restarted
		startedR = map[string]string{}
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	// The load ends before the cluster does, also when the test fails.
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopLoad)
	wg.Add(1)
	go func() { // the load: one turn every 150 ms, at most 300
		defer wg.Done()
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		for n := range 300 {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			mu.Lock()
			r := len(c.Gateways())
			i := n % r
			if i == down {
				i = (i + 1) % r
			}
			mu.Unlock()
			cl, err := wsclient.DialErr(t, c.Gateway(i).URL(), wsclient.Options{Token: clusterrig.OperatorToken, Name: c.Gateway(i).ID})
			if err != nil {
				continue // refused while it stops: the user retries elsewhere
			}
			runID := fmt.Sprintf("roll-%03d", n)
			reply := fmt.Sprintf("Reply_%03d", n)
			a, err := cl.SendErr(session(runID), "/steps web_search:700ms say:"+reply, runID)
			if err == nil && started(a, runID) {
				mu.Lock()
				startedR[runID] = reply
				mu.Unlock()
			}
			cl.Close() // as the CLI's chat.send does: the turn runs on
		}
	}()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(startedR)
	}
	for i, g := range c.Gateways() {
		// Under load: a few turns started since the last restart, some of
		// them still running when this replica gets SIGTERM.
		want := count() + 8
		testwait.Until(t, 30*time.Second, fmt.Sprintf("%d turns started", want), func() bool { return count() >= want })
		mu.Lock()
		down = i
		mu.Unlock()
		if code := g.Term(); code != 0 {
			t.Errorf("%s exited with %d after SIGTERM, want 0", g.ID, code)
		}
		g.Restart()
	}
	stopLoad()

	mu.Lock()
	defer mu.Unlock()
	if len(startedR) < 8*len(c.Gateways()) {
		t.Fatalf("only %d turns started during the rolling restart; the load did not run", len(startedR))
	}
	reader := c.Dial(t, 0)
	tally := map[string]int{}
	defer func() { t.Logf("%d turns started; how they ended: %v", len(startedR), tally) }()
	for runID, reply := range startedR {
		sess := session(runID)
		var ends []string
		testwait.Until(t, 20*time.Second, "the end of "+runID+" in its history", func() bool {
			ends = terminalEntries(reader.History(sess))
			return len(ends) > 0
		})
		tally[strings.Join(ends, "+")]++
		if len(ends) != 1 {
			t.Errorf("%s: %d terminal messages in the history, want exactly 1: %q", runID, len(ends), ends)
			continue
		}
		if ends[0] != "reply" && ends[0] != "shutdown" {
			t.Errorf("%s ended %q; want its reply (%s) or the shutdown notice", runID, ends[0], reply)
		}
	}
}
