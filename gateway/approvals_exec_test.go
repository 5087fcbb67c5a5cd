package gateway

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/exec"
)

// TestExecAgentAsksThePerson: a real process speaking jsonl asks for
// permission; the engine shows the question (ApprovalRequested, with the
// agent's title and options), the person's answer through Resolve reaches
// the agent's stdin, and the agent's reply says it was allowed. A real
// process cannot run in a synctest bubble, so this waits in real time,
// bounded; the timing rules are checked under synctest in approvals_test.go.
func TestExecAgentAsksThePerson(t *testing.T) {
	for _, tc := range []struct {
		option, reply string
	}{{"y", "allowed"}, {"n", "denied"}} {
		t.Run(tc.option, func(t *testing.T) {
			script, err := filepath.Abs("../runner/exec/testdata/permission.sh")
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "out")
			c := testConfig(t, func(c *config.Config) {
				c.Agents.Defaults.Runner = config.RunnerExec
				c.Agents.Defaults.StepTimeoutSeconds = secs(1) // shorter than the wait below: the question pauses it
				c.Agents.Exec = config.Exec{Command: script, Format: exec.FormatJSONL, Permissions: true, Env: map[string]string{
					"OUT": out,
					"PERM_REQUESTS": `{"type":"permission","id":"p1","title":"Delete build/","tool":"shell",` +
						`"options":[{"id":"y","label":"Yes","kind":"allow_once"},{"id":"n","label":"No","kind":"reject_once"}]}`,
				}}
			})
			rn, err := exec.New(c.Agents.Exec, time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			e, s := startEngine(t, c, map[string]runner.Runner{config.RunnerExec: rn})
			asked := make(chan event.Approval, 1)
			unsub := e.Bus().Subscribe("chat1", func(ev event.Event) {
				if ev.Kind == event.ApprovalRequested {
					asked <- *ev.Approval
				}
			})
			defer unsub()
			if _, err := e.Send(context.Background(), SendRequest{SessionKey: "chat1", Channel: "ws", RunID: "r1", Text: "clean up"}); err != nil {
				t.Fatal(err)
			}
			var q event.Approval
			select {
			case q = <-asked:
			case <-time.After(10 * time.Second): // real time: a real process asks
				t.Fatalf("no question within 10s; transcript:\n%s", s.transcript())
			}
			if q.Title != "Delete build/" || len(q.Options) != 2 || q.Options[0].Label != "Yes" {
				t.Fatalf("question %+v", q)
			}
			// Past the 1s liveness window: the question holds the clock.
			<-time.After(1500 * time.Millisecond) // real time: outlast the step timeout while paused
			if _, err := e.Resolve(context.Background(), ResolveRequest{ApprovalID: q.ID, OptionID: tc.option, SessionKey: "chat1", By: "@alice"}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // real time: a real process replies
			defer cancel()
			o, ok := e.Wait(ctx, "r1")
			if !ok || o.StopReason != event.ReasonStop || o.Text != tc.reply {
				t.Fatalf("outcome %+v %v, want %q; transcript:\n%s", o, ok, tc.reply, s.transcript())
			}
			got, _ := os.ReadFile(out)
			if !strings.Contains(string(got), `"id":"p1"`) || !strings.Contains(string(got), `"optionId":"`+tc.option+`"`) {
				t.Fatalf("the agent read:\n%s", got)
			}
		})
	}
}
