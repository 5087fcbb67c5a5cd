package ws

import (
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
)

// TestUnwatchedStepsCostNoAllocation checks the WebSocket server's share of
// the event path for a session nobody watches: its tool steps build no
// frame (no payload, no tool-call id), so handling them allocates nothing.
// The run's state is still kept: its terminal event is handled as usual.
func TestUnwatchedStepsCostNoAllocation(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	const key = "agent:main:nobody-watches"
	at := time.Now()
	ev := func(k event.Kind, st event.Step, seq uint64) event.Event {
		return event.Event{Kind: k, RunID: "run-unwatched", SessionKey: key, Channel: config.ChannelWS, Seq: seq, Time: at, Step: st}
	}
	e.srv.onEvent(ev(event.TurnStarted, event.Step{}, 1))
	seq := uint64(1)
	step := event.Step{Kind: event.StepTool, Name: "web_search", StartedAt: at}
	allocs := testing.AllocsPerRun(100, func() {
		step.Seq++
		seq++
		e.srv.onEvent(ev(event.StepStarted, step, seq))
		seq++
		e.srv.onEvent(ev(event.StepCompleted, step, seq))
	})
	if allocs != 0 {
		t.Errorf("a tool step of an unwatched session allocates %.1f times in the WebSocket server, want 0", allocs)
	}
	e.srv.onEvent(ev(event.Finished, event.Step{}, seq+1))
	if _, ok := e.srv.runs.Load("run-unwatched"); ok {
		t.Error("the run's state is still kept after its terminal event")
	}
}
