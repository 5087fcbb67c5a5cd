package main

import (
	"strings"
	"testing"
	"time"
)

// TestHotReloadKeepsARunningTurnsTexts: the user texts are rendered at one
// point, when an event leaves the engine, from the templates in force when
// its turn started. An operator who edits messages.user while a turn runs
// changes the words of the turns that start afterwards; the running turn's
// stop notice keeps the words it started with.
func TestHotReloadKeepsARunningTurnsTexts(t *testing.T) {
	dir := t.TempDir()
	withUser := func(words string) string {
		return testConfig(dir, 5) + "messages:\n  user: \"" + words + " after {{.Elapsed}}\"\n"
	}
	p := startGateway(t, dir, withUser("Halted (old words)"))
	cl := dialGateway(t, p.addr, testToken)
	stop := func(run string) string {
		t.Helper()
		if res := cl.call("chat.abort", map[string]any{"sessionKey": "main", "runId": run}); !res.OK {
			t.Fatalf("chat.abort %s: %+v", run, res.Error)
		}
		return aborted(t, cl.waitEvent("chat", 10*time.Second, chatState(run, "aborted"))).ErrorMessage
	}

	chatSend(cl, "main", "run-old", "/steps shell:hang")
	cl.waitEvent("agent", 10*time.Second, toolStarted("run-old", "shell"))
	p.rewriteConfig(withUser("Halted (new words)"))
	p.waitLog("config reloaded", 10*time.Second)
	if got := stop("run-old"); !strings.HasPrefix(got, "Halted (old words) after ") {
		t.Errorf("the turn running during the reload says %q; want its own (old) words", got)
	}

	chatSend(cl, "main", "run-new", "/steps shell:hang")
	cl.waitEvent("agent", 10*time.Second, toolStarted("run-new", "shell"))
	if got := stop("run-new"); !strings.HasPrefix(got, "Halted (new words) after ") {
		t.Errorf("a turn started after the reload says %q; want the new words", got)
	}
}
