// The runner's callbacks (runner.Callbacks): steps, deltas, heartbeats and
// pauses of a live run, published through the engine's single exit.

package gateway

import (
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway/abort"
)

// callbacks connect a runner to its run: each call updates the abort
// controller (liveness, steps) and publishes the matching event. After the
// run has stopped, calls still update the controller (so a force-finalized
// run shows where it hung) but publish nothing.
type callbacks struct {
	e        *Engine
	run      *abort.Run
	clock    *livenessClock // the run's liveness clock, shared with its questions
	maxReply int            // agents.defaults.maxReplyChars when the turn started
	cut      string         // what a reply cut at maxReply ends with (messages.ReplyTruncated)
}

func (c *callbacks) live() bool { return c.run.State() == abort.StateRunning }

func (c *callbacks) StepStarted(kind, name string) {
	c.recovered()
	c.run.StepStarted(kind, name) // re-arms the scheduler (abort.Registry.OnSooner)
	if c.live() {
		cur, last := c.run.CurrentStep()
		c.run.Publish(c.e.publish, event.Event{Kind: event.StepStarted, Step: cur, LastStep: last})
	}
}

func (c *callbacks) StepCompleted(kind, name string) {
	c.run.StepCompleted(kind, name)
	if c.live() {
		_, last := c.run.CurrentStep()
		c.run.Publish(c.e.publish, event.Event{Kind: event.StepCompleted, Step: last, LastStep: last})
	}
	c.recovered()
}

// recovered closes an open progress notice: the step it was about ended.
func (c *callbacks) recovered() {
	if c.run.ClearNotice() && c.live() {
		cur, last := c.run.CurrentStep()
		if cur.IsZero() {
			cur = last
		}
		c.run.Publish(c.e.publish, event.Event{Kind: event.Recovered, Step: cur, LastStep: last})
	}
}

func (c *callbacks) Delta(text string) {
	if text == "" {
		return
	}
	c.run.Activity()
	if !c.live() {
		return
	}
	full, added := c.run.AppendText(text, c.maxReply, c.cut)
	if added == "" {
		return // past the reply cap: nothing more reaches anyone
	}
	c.run.Publish(c.e.publish, event.Event{Kind: event.Delta, Text: added, FullText: full})
}

func (c *callbacks) Heartbeat() { c.run.Heartbeat() }

// Activity implements runner.ActivityReporter: a sign of life with no
// words (an agent's thought or plan).
func (c *callbacks) Activity() { c.run.Activity() }

// Fallback implements runner.FallbackReporter: the runner moved the turn
// to the model to after from failed; recorded for the trace and the journal.
func (c *callbacks) Fallback(from, to string) {
	if c.live() {
		cur, last := c.run.CurrentStep()
		if cur.IsZero() || cur.Name != from {
			cur = event.Step{Kind: event.StepLLM, Name: from}
		}
		c.run.Publish(c.e.publish, event.Event{Kind: event.Fallback, Step: cur, LastStep: last, Text: to})
	}
}

func (c *callbacks) Pause(reason string) {
	c.clock.pause(pauseRunner)
	if c.live() {
		cur, _ := c.run.CurrentStep()
		c.run.Publish(c.e.publish, event.Event{Kind: event.Paused, Step: cur, Text: reason})
	}
}

func (c *callbacks) Resume() {
	c.clock.resume(pauseRunner) // unless a question is open: then the clock stays stopped
	if c.live() {
		cur, _ := c.run.CurrentStep()
		c.run.Publish(c.e.publish, event.Event{Kind: event.Resumed, Step: cur})
	}
}
