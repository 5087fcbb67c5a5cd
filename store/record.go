package store

import (
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
)

// What a turn event records, whatever the backend: the backends share these
// so that only their SQL differs.

// Ending is what an Aborted or Finished event records of its turn.
type Ending struct {
	State TurnState // TurnAborted or TurnFinished
	// Text is the assistant message appended to the history ("" adds
	// none): the reply of a turn that finished normally, otherwise the
	// partial reply, a blank line and the notice.
	Text string
	// Current is the step still running (an aborted turn's; zero for a
	// finished one).
	Current event.Step
	// StartedAt is when the turn started, for a turn whose TurnStarted was
	// never recorded: the end minus the elapsed time the event reports.
	StartedAt time.Time
}

// EndingOf is what ev, an Aborted or Finished event recorded at at, ends its
// turn with.
func EndingOf(ev *event.Event, at time.Time) Ending {
	e := Ending{State: TurnFinished, Text: ev.FullText, StartedAt: at}
	if ev.Kind == event.Aborted {
		e.State, e.Text, e.Current = TurnAborted, joinEnding(ev.FullText, ev.Message), ev.Step
		if ev.Elapsed > 0 {
			e.StartedAt = at.Add(-ev.Elapsed) // only used if TurnStarted was lost
		}
	} else if ev.StopReason != event.ReasonStop {
		e.Text = joinEnding(ev.FullText, ev.Message)
	}
	return e
}

// joinEnding is the history text of a turn that did not end normally: the
// partial reply, a blank line, the notice.
func joinEnding(partial, notice string) string {
	switch {
	case partial == "":
		return notice
	case notice == "":
		return partial
	}
	return partial + "\n\n" + notice
}

// JournalOf is the journal entry of ev recorded at at (ID not set). It keeps
// the journal compact: no user text, no reply text; an approval's message
// (the question or its settlement in words) is kept as its detail is,
// credentials redacted (approval.go).
func JournalOf(ev *event.Event, at time.Time) JournalEntry {
	msg := ev.Message
	elapsed := ev.Elapsed
	switch ev.Kind {
	case event.Paused, event.Fallback:
		msg = ev.Text
	case event.Finished:
		if ev.StopReason == event.ReasonStop {
			msg = ""
		}
	case event.StepCompleted:
		if elapsed == 0 && !ev.Step.StartedAt.IsZero() {
			elapsed = at.Sub(ev.Step.StartedAt)
		}
	case event.ApprovalRequested, event.ApprovalResolved:
		msg = approvalText(msg) // the question in words may repeat its detail
	}
	return JournalEntry{RunID: ev.RunID, SessionKey: ev.SessionKey, Seq: ev.Seq, Kind: ev.Kind, KindName: ev.Kind.String(),
		StopReason: ev.StopReason, Step: event.Step{Kind: ev.Step.Kind, Name: ev.Step.Name, Seq: ev.Step.Seq},
		LastStep: ev.LastStep.Label(), Elapsed: elapsed, Message: msg, Time: at}
}

// StepColumns are the nullable column values of a step: all nil for the
// zero step.
func StepColumns(st event.Step) (kind, name, seq any) {
	if st.IsZero() {
		return nil, nil, nil
	}
	return st.Kind, st.Name, int64(st.Seq)
}

// EventTime is when ev is recorded: its time, or now if it has none.
func EventTime(ev *event.Event) time.Time {
	if ev.Time.IsZero() {
		return time.Now()
	}
	return ev.Time
}

// EndingOutbox is the outbox rows an ending of a turn of an outbox channel
// writes with the end (RecorderControl.ToOutbox): the reply ("final") and,
// for a turn that did not end normally, the notice ("notice"), with the
// texts messages.Ending decides; an empty text gets no row.
func EndingOutbox(ev *event.Event) []OutboxMessage {
	final, notice := messages.Ending(string(ev.StopReason), ev.FullText, ev.Message)
	out := make([]OutboxMessage, 0, 2)
	for _, m := range []struct {
		kind OutboxKind
		text string
	}{{OutboxFinal, final}, {OutboxNotice, notice}} {
		if m.text != "" {
			out = append(out, OutboxMessage{Channel: ev.Channel, ChatRef: ev.ChatRef, RunID: ev.RunID, Kind: m.kind, Text: m.text})
		}
	}
	return out
}
