package gateway

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"

	"github.com/turnguard/turnguard/internal/faketime"
)

// TestNoticesRenderedAtPublishWithConfiguredTexts: the progress notice and
// the stop notice a subscriber receives are the operator's configured
// texts, rendered from the facts the events carry (step, elapsed, limits);
// the outcome and the history hold the same words.
func TestNoticesRenderedAtPublishWithConfiguredTexts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	yaml := `agents:
  defaults:
    progressNotifyAfterSeconds: 10
messages:
  progress: "still on {{.CurrentStep}} ({{.Elapsed}} of {{.Limit}}, idle limit {{.StepTimeout}})"
  user: "halted {{.CurrentStep}} after {{.Elapsed}}, last {{.LastStep}}"
`
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		d := demo.New()
		e, s := startEngine(t, c, map[string]runner.Runner{"demo": d})
		t.Cleanup(d.Release)
		v := &env{e: e, sink: s, demo: d}
		v.send(t, "r1", "/steps web_search:1s shell:hang")
		faketime.Advance(12 * time.Second)
		synctest.Wait()
		if _, err := v.e.Abort(context.Background(), "main", "", event.ReasonUser, "conn1", false); err != nil {
			t.Fatal(err)
		}
		out, _ := v.e.Wait(context.Background(), "r1")
		synctest.Wait()
		const stopped = "halted shell after 12 s, last web_search"
		for _, want := range []string{
			`progress  "still on shell (10 s of 30 min, idle limit 5 min)"`,
			`aborted user "` + stopped + `"`,
		} {
			if !strings.Contains(v.sink.transcript(), want) {
				t.Errorf("the subscriber's transcript lacks %s:\n%s", want, v.sink.transcript())
			}
		}
		if out.Message != stopped {
			t.Errorf("outcome message %q, want %q", out.Message, stopped)
		}
		_, h, _ := v.e.History(context.Background(), "main", 0)
		if last := h[len(h)-1]; last.Text != stopped {
			t.Errorf("history ends with %q, want %q", last.Text, stopped)
		}
	})
}
