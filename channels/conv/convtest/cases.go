package convtest

import (
	"strings"
	"time"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
)

// A case is a conversation: what the person sends and must see.
type tcase struct {
	name   string
	adjust func(*config.Config)
	run    func(p *person)
}

// Scripts of the demo runner (see runner/demo).
const (
	hang     = "/steps shell:hang"               // a turn that only a stop or a deadline ends
	slowDone = "/steps work:30s say:First_reply" // a turn that answers after 30 s
)

// busy sets agents.defaults.busy (every channel inherits it).
func busy(mode string, maxQueued int) func(*config.Config) {
	return func(c *config.Config) {
		c.Agents.Defaults.Busy.Mode = mode
		c.Agents.Defaults.Busy.MaxQueued = &maxQueued
	}
}

// both applies each adjustment in order.
func both(fs ...func(*config.Config)) func(*config.Config) {
	return func(c *config.Config) {
		for _, f := range fs {
			f(c)
		}
	}
}

func seconds(v float64) *float64 { return &v }

// overflow sets agents.defaults.busy.overflow.
func overflow(policy string) func(*config.Config) {
	return func(c *config.Config) { c.Agents.Defaults.Busy.Overflow = policy }
}

// queuedAck is the answer to a message queued behind the running turn
// with ahead queued messages before it.
func queuedAck(ahead int) string {
	return conv.AckText(gateway.Ack{Status: gateway.StatusQueued, Busy: gateway.BusyQueue, Ahead: ahead})
}

var cases = []tcase{
	// Commands: carried out at once, never a turn, never refused as busy.
	{name: "stop/running", run: func(p *person) {
		p.send(hang)
		p.send("/stop")
		p.see("⏹️ Stopped", conv.TextNothingToStop)
		p.quiet(time.Second) // the stopped turn's runner returns
		p.send("/steps say:After_the_stop")
		p.see("After the stop", "⏳ I'm still working")
	}},
	{name: "stop/idle", run: func(p *person) {
		p.send("/stop")
		p.seeExactly(conv.TextNothingToStop)
		p.quiet(time.Minute, "Done.", "demo runner")
	}},
	{name: "status/idle", run: func(p *person) {
		p.send("/status")
		p.seeExactly(conv.TextIdle)
	}},
	{name: "status/running", run: func(p *person) {
		p.send(hang)
		p.send("/status")
		s := p.see("⏳ Working")
		if !strings.Contains(s, "before the time limit") || !strings.HasSuffix(s, "Send /stop to stop it.") {
			p.t.Errorf("/status while a turn runs said %q; want the time left and how to stop it", s)
		}
		p.send("/stop")
		p.see("⏹️ Stopped")
	}},
	{name: "new", run: func(p *person) {
		p.send(hang)
		p.send("/new")
		p.see(conv.TextNew)
		p.quiet(time.Second) // the stopped turn's runner returns
		p.send("/status")
		p.seeExactly(conv.TextIdle)
	}},
	{name: "new/drops-queue", adjust: busy(config.BusyQueue, 5), run: func(p *person) {
		p.send(hang)
		p.send("/steps say:Never_run")
		p.seeExactly(queuedAck(0))
		p.send("/new")
		p.see(conv.TextNew+" 1 queued message was dropped.", "Never run")
		p.quiet(time.Minute, "Never run")
	}},
	{name: "help", run: func(p *person) {
		p.send("/help")
		s := p.see("Commands:")
		for _, w := range []string{"/stop — stop the request", "/status —", "/new —", "/help —"} {
			if !strings.Contains(s, w) {
				p.t.Errorf("/help does not mention %q:\n%s", w, s)
			}
		}
	}},

	// Delivery: the answer arrives; a deadline tells the person.
	{name: "delivery/answer", run: func(p *person) {
		p.send("/steps web_search:2s say:Here_it_is")
		p.see("Here it is")
	}},
	{name: "delivery/timeout", adjust: func(c *config.Config) { c.Agents.Defaults.TimeoutSeconds = seconds(30) }, run: func(p *person) {
		p.send(hang)
		p.see("⚠️ This request was stopped at its time limit of 30 s")
		p.send("/steps say:Afterwards")
		p.see("Afterwards")
	}},
	{name: "delivery/timeout-then-queued", adjust: both(busy(config.BusyQueue, 5), func(c *config.Config) {
		c.Agents.Defaults.TimeoutSeconds = seconds(30)
	}), run: func(p *person) {
		p.send(hang)
		p.send("/steps say:Second_answer")
		p.seeExactly(queuedAck(0))
		p.see("was stopped at its time limit of 30 s", "Second answer")
		p.see("Second answer")
	}},

	{name: "delivery/step-timeout-then-queued", adjust: both(busy(config.BusyQueue, 5), func(c *config.Config) {
		c.Agents.Defaults.StepTimeoutSeconds = seconds(20)
	}), run: func(p *person) {
		p.send(hang)
		p.send("/steps say:Second_answer")
		p.seeExactly(queuedAck(0))
		p.see("No progress for 20 s", "Second answer")
		p.see("Second answer")
	}},
	{name: "delivery/max-turn-time-then-queued", adjust: both(busy(config.BusyQueue, 5), func(c *config.Config) {
		c.Agents.Defaults.MaxTurnTimeSeconds = seconds(40)
	}), run: func(p *person) {
		p.send("/steps shell:hang:hb=5s")
		p.send("/steps say:Second_answer")
		p.seeExactly(queuedAck(0))
		p.see("reached the maximum time of 40 s", "Second answer")
		p.see("Second answer")
	}},
	{name: "delivery/stuck-runner-then-queued", adjust: both(busy(config.BusyQueue, 5), func(c *config.Config) {
		c.Agents.Defaults.StepTimeoutSeconds = seconds(10)
		c.Agents.Defaults.AbortGraceSeconds = seconds(5)
	}), run: func(p *person) {
		p.send("/steps shell:stuck")
		p.send("/steps say:Second_answer")
		p.seeExactly(queuedAck(0))
		p.see("No progress for 10 s", "Second answer")
		p.see("Second answer") // once the stuck turn is force-finalized
	}},

	// Busy modes.
	{name: "busy/queue", adjust: busy(config.BusyQueue, 5), run: func(p *person) {
		p.send(slowDone)
		p.send("/steps say:Second_reply")
		p.seeExactly(queuedAck(0))
		p.send("/steps say:Third_reply")
		p.seeExactly(queuedAck(1))
		p.see("First reply", "Second reply", "Third reply")
		p.see("Second reply", "Third reply")
		p.see("Third reply")
	}},
	{name: "busy/status-shows-queue", adjust: busy(config.BusyQueue, 5), run: func(p *person) {
		p.send(hang)
		p.send("/steps say:Waiting_one")
		p.seeExactly(queuedAck(0))
		p.send("/help") // a command is carried out at once, never queued
		p.see("Commands:")
		p.send("/status")
		s := p.see("⏳ Working")
		if !strings.Contains(s, "📥 1 message waiting:\n1. /steps say:Waiting_one") {
			p.t.Errorf("/status does not show the queue:\n%s", s)
		}
		p.send("/stop")
		p.see("1 queued message was dropped.")
	}},
	{name: "busy/max-queued-overflow", adjust: busy(config.BusyQueue, 1), run: func(p *person) {
		p.send(hang)
		p.send("/steps say:Kept")
		p.seeExactly(queuedAck(0))
		p.send("/steps say:One_too_many")
		p.seeExactly((&gateway.QueueFullError{Limit: 1}).UserText())
		p.send("/stop")
		p.see("1 queued message was dropped.")
		p.quiet(time.Minute, "Kept", "One too many")
	}},
	{name: "busy/stop-drops-queue", adjust: busy(config.BusyQueue, 5), run: func(p *person) {
		p.send(hang)
		p.send("/steps say:Dropped_A")
		p.send("/steps say:Dropped_B")
		p.send("/stop")
		p.see("⏹️ Stopped", "Dropped A", "Dropped B")
		p.see("2 queued messages were dropped.", "Dropped A", "Dropped B")
		p.quiet(time.Minute, "Dropped A", "Dropped B")
		p.send("/steps say:Fresh")
		p.see("Fresh")
	}},
	{name: "busy/interrupt", adjust: busy(config.BusyInterrupt, 5), run: func(p *person) {
		p.send(hang)
		p.send("/steps say:The_newer_one")
		p.see("your newer message replaced it", "The newer one")
		p.expect(`"The newer one", nothing else`, func(s string) bool { return s == "The newer one" }, "")
	}},
	{name: "busy/collect", adjust: busy(config.BusyCollect, 5), run: func(p *person) {
		p.send(slowDone)
		p.send("alpha")
		p.see("📥 Noted")
		p.send("beta")
		p.see("📥 Noted")
		p.see("First reply", "alpha")
		p.see(`"alpha beta"`)
	}},
	{name: "busy/steer", adjust: busy(config.BusySteer, 5), run: func(p *person) {
		p.send(slowDone)
		p.send("turn left")
		p.seeExactly(conv.TextSteered)
		s := p.see("First reply")
		if !strings.Contains(s, "turn left") {
			p.t.Errorf("the reply of the steered turn does not mention the message: %q", s)
		}
	}},
	{name: "busy/reject", adjust: busy(config.BusyReject, 5), run: func(p *person) {
		p.send(hang)
		p.send("/steps say:Refused")
		p.seeExactly((&gateway.BusyError{}).UserText())
		p.send("/stop")
		p.see("⏹️ Stopped")
		p.quiet(time.Minute, "Refused")
	}},

	// Queue controls (issue 23): busy.overflow, busy.debounceMs, /queue.
	{name: "overflow/drop-old", adjust: both(busy(config.BusyQueue, 1), overflow(config.OverflowDropOld)), run: func(p *person) {
		p.send(slowDone)
		p.send("/steps say:Dropped_one")
		p.seeExactly(queuedAck(0))
		p.send("/steps say:Kept_one")
		p.seeExactly(queuedAck(0) + " " + messages.QueueDroppedOldest([]string{"/steps say:Dropped_one"}))
		p.see("First reply", "Dropped one")
		p.see("Kept one", "Dropped one")
		p.quiet(time.Minute, "Dropped one")
	}},
	{name: "overflow/drop-new", adjust: both(busy(config.BusyQueue, 1), overflow(config.OverflowDropNew)), run: func(p *person) {
		p.send(slowDone)
		p.send("/steps say:Kept_one")
		p.seeExactly(queuedAck(0))
		p.send("/steps say:Dropped_one")
		p.seeExactly(messages.QueueDroppedNew(1, "/steps say:Dropped_one"))
		p.see("First reply", "Dropped one")
		p.see("Kept one", "Dropped one")
		p.quiet(time.Minute, "Dropped one")
	}},
	{name: "overflow/reject", adjust: busy(config.BusyQueue, 1), run: func(p *person) {
		p.send(slowDone)
		p.send("/steps say:Kept_one")
		p.seeExactly(queuedAck(0))
		p.send("/steps say:Refused_one")
		p.seeExactly(messages.QueueFull(1))
		p.see("First reply")
		p.see("Kept one", "Refused one")
	}},
	{name: "debounce/merges-a-burst", adjust: func(c *config.Config) {
		ms := 2000
		c.Agents.Defaults.Busy.DebounceMs = &ms
	}, run: func(p *person) {
		p.send("alpha")
		p.send("beta")
		p.send("gamma")
		p.see(`"alpha beta gamma"`, "📥", `"alpha"`)
		p.quiet(time.Minute, `"beta"`, `"gamma"`)
	}},
	{name: "queue/show-and-set", adjust: busy(config.BusyQueue, 5), run: func(p *person) {
		p.send(hang)
		p.send("/steps say:Waiting_one")
		p.seeExactly(queuedAck(0))
		p.send("/queue")
		s := p.see("📥 Busy mode: queue — ")
		for _, w := range []string{"When 5 wait, one more is refused.", "1 message waiting:\n1. “/steps say:Waiting_one”", "/queue <mode>"} {
			if !strings.Contains(s, w) {
				p.t.Errorf("/queue does not say %q:\n%s", w, s)
			}
		}
		p.send("/queue collect")
		p.seeExactly(messages.QueueModeSet(config.BusyCollect))
		p.send("/steps say:Collected")
		p.see("📥 Noted")
		p.send("/queue")
		p.see("📥 Busy mode: collect (set for this chat) — ")
		p.send("/queue sideways")
		p.seeExactly(messages.QueueModeUnknown("sideways"))
		p.send("/queue default")
		p.seeExactly(messages.QueueModeDefault(config.BusyQueue))
		p.send("/stop")
		p.see("⏹️ Stopped")
	}},
}
