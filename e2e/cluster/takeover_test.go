package cluster_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/testwait"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// hangingAgent writes an exec agent (jsonl protocol, docs/runners.md) that
// opens a shell step, appends its process id to pids and then waits
// forever (exec keeps the pid).
func hangingAgent(t *testing.T, dir, pids string) string {
	t.Helper()
	path := filepath.Join(dir, "hang-agent.sh")
	script := "#!/bin/sh\ncat >/dev/null\n" +
		`echo '{"type":"step_start","kind":"tool","name":"shell"}'` + "\n" +
		"echo $$ >> " + pids + "\n" +
		"exec sleep 600\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// lastPID is the last process id the agent recorded.
func lastPID(pids string) int {
	b, _ := os.ReadFile(pids)
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	pid, _ := strconv.Atoi(f[len(f)-1])
	return pid
}

// waitFree sends new messages to sess through cl (busy mode reject) until
// one starts, and returns when that happened; it fails after within.
func waitFree(t *testing.T, cl *wsclient.Client, sess, text string, within time.Duration) (string, time.Time) {
	t.Helper()
	var runID string
	var at time.Time
	n := 0
	testwait.NoError(t, within, func() error {
		n++
		runID = fmt.Sprintf("free-%d", n)
		a, err := cl.SendErr(sess, text, runID)
		if err != nil {
			return err
		}
		if started(a, runID) {
			at = time.Now()
			return nil
		}
		time.Sleep(40 * time.Millisecond) // real time: at most 25 sends a second, under the per-connection rate
		return fmt.Errorf("the session does not take a new message: ok=%v status=%q err=%v", a.OK, a.Status, a.Err)
	})
	return runID, at
}

// watchEverywhere opens a connection to every replica that watches sess
// (chat.history makes it a watcher), in replica order.
func watchEverywhere(t *testing.T, c *clusterrig.Cluster, sess string) []*wsclient.Client {
	t.Helper()
	var clients []*wsclient.Client
	for i := range c.Gateways() {
		cl := c.Dial(t, i)
		cl.History(sess)
		clients = append(clients, cl)
	}
	return clients
}

// waitOneInterrupted reads the session's history through cl until it holds
// an interrupted notice, then checks that it holds exactly one. A watching
// connection may be told to reload (closed with 1012) while a takeover
// renumbers the session's events, as the web chat is; with redial set, the
// reader then does what the page does: it connects again and reads anew.
func waitOneInterrupted(t *testing.T, cl *wsclient.Client, redial func() *wsclient.Client, sess string, within time.Duration) {
	t.Helper()
	var notices []string
	testwait.Until(t, within, "an interrupted notice in the history of "+sess, func() bool {
		if redial != nil {
			f, err := cl.CallErr("chat.history", map[string]any{"sessionKey": sess, "limit": 200})
			if err != nil {
				t.Logf("the reader's connection ended (%v): connecting again, as the web chat reloads", err)
				cl = redial()
				return false
			}
			var h wsclient.History
			if !f.OK || json.Unmarshal(f.Payload, &h) != nil {
				t.Fatalf("chat.history %s: %v %s", sess, f.Error, f.Payload)
			}
			notices = interruptedNotices(h)
			return len(notices) > 0
		}
		notices = interruptedNotices(cl.History(sess))
		return len(notices) > 0
	})
	if len(notices) != 1 {
		t.Fatalf("history of %s has %d interrupted notices, want exactly 1: %q", sess, len(notices), notices)
	}
}

// TestKillOwnerMidTurn: the replica running a turn (exec runner) is
// SIGKILLed. Through another replica the user finds exactly one interrupted
// notice in the history, the session takes a new message within
// leaseSeconds + 1 s of the kill, a client watching on a third replica sees
// the run end (or is told to reload with 1012) — never silence — and the
// agent process is gone. When the killed replica comes back on the same
// host, the agent of the turn a survivor runs by then keeps running.
func TestKillOwnerMidTurn(t *testing.T) {
	need(t)
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	agent := hangingAgent(t, dir, pids)
	c := start(t, clusterrig.Options{Lease: 3 * time.Second, Config: func(_ int, cfg map[string]any) {
		clusterrig.Set(cfg, "agents.defaults.runner", "exec")
		clusterrig.Set(cfg, "agents.exec.command", agent)
		clusterrig.Set(cfg, "channels.ws.busy.mode", "reject")
	}})
	sess := session("kill-owner")
	clients := watchEverywhere(t, c, sess)
	clients[0].MustStart(sess, "work until stopped", "run-killed")
	own := owner(t, c, "run-killed")
	rest := others(c, own)
	watcher, reader := clients[rest[0]], clients[rest[1]]
	watcher.WaitEvent(10*time.Second, "the shell step, on a non-owner", toolStarted("run-killed", "shell"))
	testwait.Until(t, 10*time.Second, "the agent recorded its pid", func() bool { return lastPID(pids) != 0 })
	pid := lastPID(pids)

	killed := c.Gateway(own).Kill()
	bound := c.Lease() + time.Second
	next, freeAt := waitFree(t, reader, sess, "next message", bound+10*time.Second)
	if took := freeAt.Sub(killed); took > bound {
		t.Errorf("the session took a new message %v after the kill; want within leaseSeconds + 1 s = %v", took, bound)
	}
	waitOneInterrupted(t, reader, func() *wsclient.Client { return c.Dial(t, rest[1]) }, sess, 10*time.Second)
	e, code, ok := watcher.WaitEnd(bound+10*time.Second, "run-killed")
	if err := endSeen(e, code, ok); err != nil {
		t.Error(err)
	}
	testwait.Until(t, 5*time.Second, fmt.Sprintf("the agent process %d is gone", pid), func() bool { return processGone(pid) })

	// The killed replica comes back on the same host: the agent of the turn
	// a survivor runs now is not its to kill (exec kills leftover agents of
	// its own instance at start-up).
	testwait.Until(t, 10*time.Second, "the next turn's agent recorded its pid", func() bool { return lastPID(pids) != pid })
	pid2, runsOn := lastPID(pids), owner(t, c, next)
	c.Gateway(own).Restart()
	if processGone(pid2) {
		t.Errorf("restarting %s killed the agent (pid %d) of turn %s, which %s runs", c.Gateway(own).ID, pid2, next, c.Gateway(runsOn).ID)
	}
	if again := owner(t, c, next); again != runsOn {
		t.Errorf("turn %s runs on %s after the restart, want %s", next, c.Gateway(again).ID, c.Gateway(runsOn).ID)
	}
}

// TestStoppedOwnerTakenOver: the owner is frozen (SIGSTOP) for two leases
// while its turn runs, then continued. A survivor took the turn over (one
// interrupted notice), and the stale owner's late answer — due after it
// wakes up — reaches no client, on any replica, and not the history.
func TestStoppedOwnerTakenOver(t *testing.T) {
	const lateReply = "Late_reply_of_a_stale_owner"
	c := start(t, clusterrig.Options{Lease: 3 * time.Second, Config: func(_ int, cfg map[string]any) {
		clusterrig.Set(cfg, "channels.ws.busy.mode", "reject")
	}})
	sess := session("stopped-owner")
	clients := watchEverywhere(t, c, sess)
	// The turn would answer 3 leases after it starts: after the owner woke.
	turn := fmt.Sprintf("/steps web_search:50ms shell:%s say:%s", 3*c.Lease(), lateReply)
	clients[0].MustStart(sess, turn, "run-stale")
	own := owner(t, c, "run-stale")
	for _, cl := range clients {
		cl.WaitEvent(10*time.Second, "the shell step", toolStarted("run-stale", "shell"))
	}
	began := time.Now()
	c.Gateway(own).Stop()
	time.Sleep(2 * c.Lease()) // real time: the owner stays frozen for two leases
	c.Gateway(own).Cont()

	reader := clients[others(c, own)[0]]
	waitOneInterrupted(t, reader, nil, sess, 10*time.Second)
	for _, i := range others(c, own) {
		e, code, ok := clients[i].WaitEnd(10*time.Second, "run-stale")
		if err := endSeen(e, code, ok); err != nil {
			t.Errorf("r%d: %v", i+1, err)
		}
	}
	// Past the moment the stale owner's runner answers, plus a margin.
	time.Sleep(time.Until(began.Add(3*c.Lease() + 2*time.Second))) // real time: the late final must have had its chance
	for i, cl := range clients {
		for _, e := range cl.RunEvents("run-stale") {
			if e.State == "final" {
				t.Errorf("r%d: a client got the stale owner's final: %s %s", i+1, e, e.Raw)
			}
		}
	}
	for _, m := range reader.History(sess).Messages {
		if strings.Contains(m.Text(), strings.ReplaceAll(lateReply, "_", " ")) {
			t.Errorf("the stale owner's late reply is in the history: %q", m.Text())
		}
	}
	waitOneInterrupted(t, reader, nil, sess, time.Second)
	waitFree(t, reader, sess, "/steps say:after_the_takeover", 10*time.Second)
}

// TestQueuedMessageSurvivesItsReplica: a message queued behind a running
// turn (busy mode queue, the default) waits in the memory of the replica
// that runs the session — sent through another replica, it was forwarded
// there. SIGKILL that replica: the survivor that takes its turn over runs
// the queued message, once; the history read through a third replica has
// the interrupted notice, then the queued message's reply.
func TestQueuedMessageSurvivesItsReplica(t *testing.T) {
	c := start(t, clusterrig.Options{Lease: 3 * time.Second})
	sess := session("queued-survives")
	owner := c.Dial(t, 0)
	owner.MustStart(sess, hangTurn, "run-hang")
	owner.WaitEvent(10*time.Second, "the shell step", toolStarted("run-hang", "shell"))
	if a := c.Dial(t, 1).Send(sess, "/steps say:Queued_message_survived", "run-queued"); !a.OK || a.Status != "queued" {
		t.Fatalf("a message for the busy session through r2: ok=%v status=%q err=%v; want queued", a.OK, a.Status, a.Err)
	}
	c.Gateway(0).Kill()
	reader := c.Dial(t, 2)
	testwait.Until(t, c.Lease()+20*time.Second, "the queued message's reply in the history", func() bool {
		return hasReply(reader.History(sess), "Queued message survived")
	})
	time.Sleep(c.Lease() + time.Second) // real time: showing that it does not run twice
	h := reader.History(sess)
	if got, want := terminalEntries(h), []string{"interrupted", "reply"}; !slices.Equal(got, want) {
		t.Errorf("the history's endings are %q, want %q (the killed turn's notice, then the queued message's reply once)", got, want)
	}
}
