package conv

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner/demo"
)

// The answers of the commands and the refusals, in plain text: the same
// words in every channel.
const (
	TextNothingToStop = "Nothing is running — there is nothing to stop."
	TextStillStopping = "⏳ Already stopping — waiting for the work to end."
	TextNotOwner      = "Only the person who sent that request can stop it."
	TextCannotStop    = "⚠️ Sorry — I couldn't stop the request. Please try again."
	TextNew           = "🆕 New conversation — earlier messages are forgotten."
	TextIdle          = "💤 Nothing is running. Send a message to start."

	TextEmpty       = "Send me some text and I'll pass it on. /help lists the commands."
	TextRestarting  = "⚠️ The gateway is restarting — please send that again in a minute."
	TextCannotStart = "⚠️ Sorry — I couldn't start on that request. Please try again later."

	TextSteered = "📨 Passed on to the request that is running — it will take your message into account."
)

// stateRunning is abort.StateRunning's name in a snapshot (pinned by a
// test: conv does not import the registry).
const stateRunning = "running"

// TooLongText refuses a message of n characters over limit.
func TooLongText(n, limit int) string {
	return fmt.Sprintf("✂️ That message is too long (%d characters; the limit is %d). Please shorten it or split it.", n, limit)
}

// AckText is what a person reads when Send accepted a message: "" when its
// turn started (its events are the answer), the message was a repeat, or it
// interrupted the running turn (that turn's superseded notice, published
// before Send returns, says so); otherwise what happened to it while the
// session was busy. The number it names is ack.Ahead, the queued turns
// before it (the running request not counted) — the same number as the
// WebSocket answer's ahead.
func AckText(ack gateway.Ack) string {
	switch ack.Status {
	case gateway.StatusSteered:
		return TextSteered
	case gateway.StatusDropped:
		return messages.QueueDroppedNew(ack.Limit, strings.Join(ack.Dropped, " "))
	case gateway.StatusQueued:
	default:
		return ""
	}
	if len(ack.Dropped) > 0 {
		return strings.TrimSpace(queuedText(ack) + " " + messages.QueueDroppedOldest(ack.Dropped))
	}
	return queuedText(ack)
}

// queuedText is AckText of a queued message.
func queuedText(ack gateway.Ack) string {
	when := "right after the current request"
	if ack.Ahead > 0 {
		when = fmt.Sprintf("after the current request and %d queued before it", ack.Ahead)
	}
	switch {
	case ack.FellBack:
		return "📥 The assistant can't take messages mid-request, so I queued it — I'll get to it " + when + "."
	case ack.Busy == gateway.BusyInterrupt:
		return ""
	case ack.Busy == gateway.BusyCollect:
		return "📥 Noted — I'll answer this together with your other new messages after the current request."
	}
	return "📥 Queued — I'll get to it " + when + "."
}

// StopText is the answer to /stop: "" when a turn was stopped and nothing
// queued was dropped (the stop notice the abort publishes is the answer);
// when queued messages were dropped, how many (after a stopped turn's
// notice, only that).
func StopText(res gateway.StopResult, err error) string {
	switch {
	case errors.Is(err, gateway.ErrNotOwner):
		return TextNotOwner
	case err != nil:
		return TextCannotStop
	}
	dropped := DroppedText(res.Dropped)
	switch {
	case res.Stopping:
		return strings.TrimSpace(TextStillStopping + " " + dropped)
	case res.Aborted && dropped == "":
		return ""
	case res.Aborted:
		return "🗑️ " + dropped // after the stop notice, which says "⏹️ Stopped…"
	case dropped != "":
		return "⏹️ Stopped. " + dropped
	}
	return TextNothingToStop
}

// DroppedText says that n queued messages were dropped ("" for none).
func DroppedText(n int) string {
	switch n {
	case 0:
		return ""
	case 1:
		return "1 queued message was dropped."
	}
	return fmt.Sprintf("%d queued messages were dropped.", n)
}

// NewText is the answer to /new, saying how many queued messages it
// dropped.
func NewText(dropped int) string {
	return strings.TrimSpace(TextNew + " " + DroppedText(dropped))
}

// ErrorText is what a person reads when Send refused or failed a message
// of n characters (limit: server.maxMessageChars). It never names the
// cause of an internal failure.
func ErrorText(err error, n, limit int) string {
	var busy *gateway.BusyError
	var full *gateway.QueueFullError
	var stuck *gateway.RunnerStuckError
	var unavail *gateway.UnavailableError
	switch {
	case errors.As(err, &full):
		return full.UserText()
	case errors.As(err, &busy):
		return busy.UserText()
	case errors.As(err, &stuck):
		return stuck.UserText()
	case errors.As(err, &unavail):
		return unavail.UserText()
	case errors.Is(err, gateway.ErrEmpty):
		return TextEmpty
	case errors.Is(err, gateway.ErrTooLong):
		return TooLongText(n, limit)
	case errors.Is(err, gateway.ErrShutdown):
		return TextRestarting
	}
	return TextCannotStart
}

// HelpText describes the commands and the turn limits in force for
// channel. progress is the channel's sentence about what a user sees while
// a turn works ("" for none).
func HelpText(c *config.Config, channel, progress string) string {
	s := c.TurnSettings(channel, 0)
	var b strings.Builder
	b.WriteString("I pass your messages to an assistant and answer when it is done.")
	if progress != "" {
		b.WriteString(" " + progress)
	}
	b.WriteString("\n\n")
	b.WriteString("Commands:\n")
	b.WriteString("/stop — stop the request that is running (and drop the messages waiting behind it)\n")
	b.WriteString("/status — what is running, the time left before each limit, and what is waiting\n")
	b.WriteString("/new — start a new conversation (earlier messages are forgotten)\n")
	b.WriteString("/queue — what happens to messages sent while I work, and what waits (/queue <mode> changes it)\n")
	b.WriteString("/help — this help\n\n")
	fmt.Fprintf(&b, "A request is stopped after %s", messages.Duration(s.Timeout))
	if s.StepTimeout > 0 {
		fmt.Fprintf(&b, ", or after %s without progress", messages.Duration(s.StepTimeout))
	}
	b.WriteString(".")
	if c.RunnerFor(channel) == config.RunnerDemo {
		b.WriteString("\n\n")
		b.WriteString(demo.HelpText)
	}
	return b.String()
}

// maxQueueShown bounds the waiting messages /status lists one by one.
const maxQueueShown = 3

// StatusText describes a session (Engine.Status): its running turn's
// current step and how long it has run, what it is doing (its stall class:
// working, long-running, stalled, stuck), the time left before each
// deadline, and the messages waiting behind it; TextIdle when nothing runs
// or waits.
func StatusText(st gateway.TurnStatus) string {
	var b strings.Builder
	switch {
	case st.Running:
		turnText(&b, st)
	case len(st.Queue) == 0:
		return TextIdle
	default:
		b.WriteString("💤 Nothing is running.")
	}
	if n := len(st.Queue); n > 0 {
		if n == 1 {
			b.WriteString("\n📥 1 message waiting:")
		} else {
			fmt.Fprintf(&b, "\n📥 %d messages waiting:", n)
		}
		for i, m := range st.Queue[:min(n, maxQueueShown)] {
			fmt.Fprintf(&b, "\n%d. %s", i+1, clip(m.Text, 60))
		}
		if n > maxQueueShown {
			fmt.Fprintf(&b, "\n… and %d more", n-maxQueueShown)
		}
	}
	if st.Running && st.Turn.State == stateRunning {
		b.WriteString("\nSend /stop to stop it.")
	}
	return b.String()
}

// turnText writes the running turn's part of StatusText.
func turnText(b *strings.Builder, st gateway.TurnStatus) {
	s := st.Turn
	d := func(x int64) messages.Duration { return messages.Duration(max(x, 0)) }
	class := func() {
		if w := messages.TurnClass(s.Class); w != "" {
			b.WriteString("\n" + w)
		}
	}
	if s.State != stateRunning {
		fmt.Fprintf(b, "⏹️ Stopping (%s) — waiting for the work to end; the request has run for %s.", ReasonText(s.StopReason), d(int64(s.Elapsed)))
		class()
		return
	}
	switch {
	case !s.CurrentStep.IsZero():
		fmt.Fprintf(b, "⏳ Working — step %d: %s, running for %s.", s.CurrentStep.Seq, s.CurrentStep.Label(), d(int64(s.StepElapsed)))
	case !s.LastStep.IsZero():
		fmt.Fprintf(b, "⏳ Working — last finished step: %s.", s.LastStep.Label())
	default:
		b.WriteString("⏳ Working — no step has started yet.")
	}
	fmt.Fprintf(b, "\nThe request has run for %s.", d(int64(s.Elapsed)))
	if !s.Paused { // a paused turn waits for a person: the next line says so
		class()
	}
	if s.Paused {
		b.WriteString("\n⏸️ Paused — waiting for a person; the no-progress clock is stopped.")
	}
	b.WriteString("\nTime left:")
	if st.Limits.StepTimeout > 0 && !s.Paused {
		fmt.Fprintf(b, "\n• %s before the no-progress limit (%s)", d(int64(s.UntilStep)), messages.Duration(st.Limits.StepTimeout))
	}
	fmt.Fprintf(b, "\n• %s before the time limit (%s)", d(int64(s.UntilWall)), messages.Duration(st.Limits.Timeout))
	if st.Limits.MaxTurnTime > 0 {
		fmt.Fprintf(b, "\n• %s before the hard maximum (%s)", d(int64(s.UntilCeiling)), messages.Duration(st.Limits.MaxTurnTime))
	}
}

// clip shortens s to at most n characters on one line.
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// ReasonText names a stop reason in words.
func ReasonText(r event.StopReason) string {
	switch r {
	case event.ReasonTimeout:
		return "time limit reached"
	case event.ReasonStepTimeout:
		return "no progress"
	case event.ReasonMaxTurnTime:
		return "hard maximum reached"
	case event.ReasonUser:
		return "stopped by /stop"
	case event.ReasonShutdown:
		return "gateway shutting down"
	case event.ReasonSuperseded:
		return "replaced by a newer message"
	}
	return string(r)
}
