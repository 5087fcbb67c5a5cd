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

// locEvents builds the events of one run as the engine publishes them:
// carrying the run's event.Locals.
func locEvents(run, key string, at time.Time) func(k event.Kind, st event.Step, seq uint64) event.Event {
	loc := new(event.Locals)
	return func(k event.Kind, st event.Step, seq uint64) event.Event {
		return event.Event{Kind: k, RunID: run, SessionKey: key, Channel: config.ChannelWS, Seq: seq, Time: at, Step: st, Locals: loc}
	}
}

// TestRunStateTravelsOnTheEvents checks that a run's state is reached
// through the run's Locals, not by its id: it is kept in s.runs only from
// the first event to the terminal one (for Shutdown), and an event of the
// run after its end creates nothing (before, it made a new state with a
// keepalive timer that lived until shutdown).
func TestRunStateTravelsOnTheEvents(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	ev := locEvents("run-loc", "agent:main:loc", time.Now())
	first := ev(event.TurnStarted, event.Step{}, 1)
	e.srv.onEvent(first)
	rs := runSlot.Get(first)
	if rs == nil {
		t.Fatal("the run's state is not in its Locals after its first event")
	}
	if v, ok := e.srv.runs.Load("run-loc"); !ok || v.(*runState) != rs {
		t.Fatal("the run's state is not registered for Shutdown")
	}
	tool := event.Step{Kind: event.StepTool, Name: "web_search", Seq: 1, StartedAt: time.Now()}
	e.srv.onEvent(ev(event.StepStarted, tool, 2))
	if runSlot.Get(first) != rs || rs.tool.Seq != 1 {
		t.Fatal("the step did not reach the run's state through its Locals")
	}
	e.srv.onEvent(ev(event.Finished, event.Step{}, 3))
	if _, ok := e.srv.runs.Load("run-loc"); ok {
		t.Error("the run's state is still registered after its terminal event")
	}
	e.srv.onEvent(ev(event.StepStarted, tool, 4)) // late
	if _, ok := e.srv.runs.Load("run-loc"); ok {
		t.Error("an event after the run's end created a new state")
	}
}

// TestWatcherCacheFollowsWatchers checks the per-run cache of "does anyone
// watch this session": a client that starts watching mid-run gets the
// run's next frames at once, and one that watches another session does
// not make the run build frames.
func TestWatcherCacheFollowsWatchers(t *testing.T) {
	e := newTCPEnv(t, envOpts{})
	const key = "agent:main:later"
	ev := locEvents("run-later", key, time.Now())
	first := ev(event.TurnStarted, event.Step{}, 1)
	e.srv.onEvent(first)
	rs := runSlot.Get(first)
	tool := event.Step{Kind: event.StepTool, Name: "web_search", Seq: 1, StartedAt: time.Now()}
	e.srv.onEvent(ev(event.StepStarted, tool, 2))

	other, _ := e.connect("tui", "")
	other.call("chat.history", map[string]any{"sessionKey": "agent:main:elsewhere"})
	e.srv.onEvent(ev(event.StepCompleted, tool, 3))
	if rs.watched {
		t.Fatal("a watcher of another session made the run build frames")
	}

	c, _ := e.connect("tui", "")
	c.call("chat.history", map[string]any{"sessionKey": key})
	tool2 := event.Step{Kind: event.StepTool, Name: "fetch_page", Seq: 2, StartedAt: time.Now()}
	e.srv.onEvent(ev(event.StepStarted, tool2, 4))
	f := c.until("the tool start of fetch_page", func(f frame) bool {
		return f.Event == "agent" && f.str("runId") == "run-later" && f.str("data.name") == "fetch_page"
	})
	if got := f.str("data.phase"); got != "start" {
		t.Errorf("first frame of the watched run: phase %q, want start (%s)", got, f.raw)
	}
	e.srv.onEvent(ev(event.Finished, event.Step{}, 5))
	c.chat("run-later", "final")
}
