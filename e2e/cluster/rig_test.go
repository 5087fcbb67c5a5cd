package cluster_test

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
)

// TestRig checks the rig itself on one replica (which needs nothing of the
// cluster mode): a turn over WebSocket with its events and history, a turn
// from the fake Telegram chat, the admin API, and each signal the fault
// tests use — SIGSTOP/SIGCONT, SIGKILL and restart, SIGTERM's clean exit.
func TestRig(t *testing.T) {
	c := start(t, clusterrig.Options{Replicas: 1, Telegram: true})
	g := c.Gateway(0)
	cl := c.Dial(t, 0)
	cl.MustStart(session("rig"), "/steps web_search:50ms say:Rig_reply", "run-rig")
	cl.WaitEvent(10*time.Second, "the web_search step", toolStarted("run-rig", "web_search"))
	cl.WaitEvent(10*time.Second, "the final", chatState("run-rig", "final"))
	if !hasReply(cl.History(session("rig")), "Rig reply") {
		t.Errorf("the reply is not in the history")
	}

	c.Bot().Say("/steps say:Telegram_reply")
	c.Bot().WaitSent(15*time.Second, "with the reply", func(s string) bool { return strings.Contains(s, "Telegram reply") })
	if polls := c.Bot().Polls(); len(polls) == 0 || polls[len(polls)-1].Via != g.ID {
		t.Errorf("polls %+v: want the update polled through %s's own URL", polls, g.ID)
	}
	if m := c.Bot().Messages(); len(m) == 0 || m[len(m)-1].Via != g.ID {
		t.Errorf("messages %+v: want the reply sent through %s's own URL", m, g.ID)
	}

	if code, body := g.AdminAbort("no-such-run"); code != http.StatusNotFound {
		t.Errorf("admin abort of an unknown run: %d %s, want 404", code, body)
	}

	g.Stop()
	if g.Running() != true {
		t.Errorf("a stopped gateway is not running")
	}
	g.Cont()
	cl.MustStart(session("rig"), "/steps say:after_SIGCONT", "run-rig-cont")
	cl.WaitEvent(10*time.Second, "the final after SIGCONT", chatState("run-rig-cont", "final"))

	pid := g.PID()
	g.Kill()
	if g.Running() || syscall.Kill(pid, 0) == nil && !processGone(pid) {
		t.Fatalf("the gateway %d still runs after Kill", pid)
	}
	if code := cl.WaitClosed(5 * time.Second); code != 1006 {
		t.Errorf("close code %d after SIGKILL, want 1006 (no close frame)", code)
	}
	g.Restart()
	cl2 := c.Dial(t, 0)
	cl2.MustStart(session("rig"), "/steps say:after_restart", "run-rig-restart")
	cl2.WaitEvent(10*time.Second, "the final after the restart", chatState("run-rig-restart", "final"))
	if code := g.Term(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	if code := cl2.WaitClosed(5 * time.Second); code != 1012 {
		t.Errorf("close code %d after SIGTERM, want 1012", code)
	}
}
