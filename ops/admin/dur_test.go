package admin_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/messages"
)

// TestAdminPageDurationsMatchTheServer: the /admin page writes durations
// (run time, step time, time to each deadline) with its own dur(), which
// must read as the server's messages.FormatDuration does — "4 min 59 s",
// not Go's "4m59s" (issue 22). It runs dur() from static/admin.js in Node
// (TURNGUARD_NODE, else node in PATH; skipped without one) over a table and
// compares. Below a second the page shows tenths ("0.4 s"), the server
// milliseconds; the table starts at a second.
func TestAdminPageDurationsMatchTheServer(t *testing.T) {
	node := os.Getenv("TURNGUARD_NODE")
	if node == "" {
		var err error
		if node, err = exec.LookPath("node"); err != nil {
			t.Skip("no node (TURNGUARD_NODE) to run the page's script")
		}
	}
	src, err := os.ReadFile("static/admin.js")
	if err != nil {
		t.Fatal(err)
	}
	fn := regexp.MustCompile(`(?s)\n  function dur\(ms\) \{.*?\n  \}\n`).Find(src)
	if fn == nil {
		t.Fatal("no function dur(ms) in static/admin.js")
	}
	ds := []time.Duration{time.Second, 3900 * time.Millisecond, 9960 * time.Millisecond, 45*time.Second + 400*time.Millisecond,
		59*time.Second + 600*time.Millisecond, 90 * time.Second, 4*time.Minute + 59*time.Second, 5 * time.Minute,
		12*time.Minute + 20*time.Second, 30 * time.Minute, time.Hour, 90 * time.Minute, 2*time.Hour + 5*time.Minute + 10*time.Second}
	ms := make([]int64, len(ds))
	for i, d := range ds {
		ms[i] = d.Milliseconds()
	}
	in, _ := json.Marshal(ms)
	script := string(fn) + "\nconsole.log(JSON.stringify(" + string(in) + ".map(dur)));"
	out, err := exec.Command(node, "-e", script).CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	var got []string
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(out))), &got); err != nil || len(got) != len(ds) {
		t.Fatalf("node printed %q (%v)", out, err)
	}
	for i, d := range ds {
		if want := messages.FormatDuration(d); got[i] != want {
			t.Errorf("the page writes %v as %q, the server as %q", d, got[i], want)
		}
	}
}
