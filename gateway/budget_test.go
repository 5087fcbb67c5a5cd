package gateway

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner/demo"

	"github.com/turnguard/turnguard/internal/faketime"
)

// budget sets a 10 s wall clock with no liveness window and no progress
// notices, and the budget warning ratio (nil: the default 0.8).
func budget(ratio *float64) func(*config.Config) {
	return func(c *config.Config) {
		c.Agents.Defaults.TimeoutSeconds = secs(10)
		c.Agents.Defaults.StepTimeoutSeconds = secs(0)
		c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(0)
		c.Agents.Defaults.AbortGraceSeconds = secs(2)
		c.Agents.Defaults.BudgetWarningRatio = ratio
	}
}

// TestBudgetWarningReachesTheRunnerAndThePerson: at exactly 80 % of the
// wall clock one BudgetWarning is published, in words for the person and
// with the note the runner took; the demo runner takes the note before its
// next step, wraps up and finishes before the stop.
func TestBudgetWarningReachesTheRunnerAndThePerson(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, budget(nil))
		v.send(t, "r1", "/steps build:9s deploy:hang say:Built")
		out, _ := v.e.Wait(context.Background(), "r1")
		synctest.Wait()
		note := demo.WrapUpPrefix + "Note from the gateway: 2 s left before this turn is stopped. " +
			"Wrap up now: start no new long task and give your best answer with what you have."
		if out.Status != StatusOK || out.Text != note+" Built" {
			t.Fatalf("outcome %+v, want the demo's wrap-up", out)
		}
		want := `0s turn_started
0s step_started build
8s budget_warning
9s step_completed build
9s finished stop "` + note + ` Built"`
		if got := v.sink.transcript(); got != want {
			t.Fatalf("transcript:\n%s\nwant:\n%s", got, want)
		}
		var warnings []event.Event
		for _, ev := range v.sink.events {
			if ev.Kind == event.BudgetWarning {
				warnings = append(warnings, ev)
			}
		}
		if len(warnings) != 1 {
			t.Fatalf("%d warnings, want 1", len(warnings))
		}
		w := warnings[0]
		if w.Message != "⏳ This will be stopped in 2 s unless it finishes." || w.Limit != 2*time.Second ||
			!strings.HasPrefix(w.Text, "Note from the gateway: 2 s left") {
			t.Errorf("warning: message %q, left %v, runner's note %q", w.Message, w.Limit, w.Text)
		}
	})
}

// TestNoBudgetWarningWhenOffOrDoneFirst: ratio 0 warns of nothing (the turn
// is stopped at its wall clock without a word before), and a turn that
// finishes before 80 % is never warned.
func TestNoBudgetWarningWhenOffOrDoneFirst(t *testing.T) {
	for _, tt := range []struct {
		name   string
		ratio  *float64
		script string
		want   string
	}{
		{"ratio 0", secs(0), "/steps build:hang", "0s turn_started\n0s step_started build\n10s aborted timeout " +
			`"⚠️ This request was stopped at its time limit of 10 s while build was running. Try again, or ask for something smaller."`},
		{"done first", nil, "/steps build:7s say:Built", "0s turn_started\n0s step_started build\n7s step_completed build\n" +
			`7s finished stop "Built"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				v := newEnv(t, budget(tt.ratio))
				v.send(t, "r1", tt.script)
				v.e.Wait(context.Background(), "r1")
				faketime.Advance(time.Minute) // past where a warning could be due
				synctest.Wait()
				if got := v.sink.transcript(); got != tt.want {
					t.Fatalf("transcript:\n%s\nwant:\n%s", got, tt.want)
				}
			})
		})
	}
}
