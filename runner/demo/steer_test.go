package demo

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/internal/faketime"
	"github.com/turnguard/turnguard/runner"
)

// TestSteeredMessagesAreNoted: a message steered in during a step is shown
// when the step ends, before the next one; one steered in during the last
// step is shown before the turn returns; afterwards the inbox is closed, so
// a later message is refused (the engine queues it).
func TestSteeredMessagesAreNoted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inbox := &runner.Inbox{}
		rec := newRecorder()
		done := make(chan runner.Result)
		go func() {
			res, err := New().Run(context.Background(), runner.Turn{Message: "/steps a:1s b:1s say:done", Inbox: inbox}, rec)
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		faketime.Advance(500 * time.Millisecond)
		inbox.Put("use the  cache")
		faketime.Advance(time.Second) // in step b
		inbox.Put("and hurry")
		res := <-done
		checkCalls(t, rec.snapshot(), []call{
			{0, "start tool a"},
			{time.Second, "done tool a"},
			{time.Second, `delta "📨 Noted: use the cache"`},
			{time.Second, "start tool b"},
			{2 * time.Second, "done tool b"},
			{2 * time.Second, `delta " 📨 Noted: and hurry"`},
			{2 * time.Second, `delta " done"`},
		})
		if want := "📨 Noted: use the cache 📨 Noted: and hurry done"; res.Text != want {
			t.Errorf("reply %q, want %q", res.Text, want)
		}
		if inbox.Put("too late") {
			t.Error("the inbox still takes messages after the turn")
		}
	})
}
