package conv_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/timeout"
)

func TestAckText(t *testing.T) {
	for _, tc := range []struct {
		name string
		ack  gateway.Ack
		want string
	}{
		{"started", gateway.Ack{Status: gateway.StatusStarted}, ""},
		{"repeat in flight", gateway.Ack{Status: gateway.StatusInFlight}, ""},
		{"repeat ended", gateway.Ack{Status: gateway.StatusOK}, ""},
		{"queued next", gateway.Ack{Status: gateway.StatusQueued, Busy: gateway.BusyQueue},
			"📥 Queued — I'll get to it right after the current request."},
		{"queued third: the number is ahead's", gateway.Ack{Status: gateway.StatusQueued, Busy: gateway.BusyQueue, Ahead: 2},
			"📥 Queued — I'll get to it after the current request and 2 queued before it."},
		{"collect", gateway.Ack{Status: gateway.StatusQueued, Busy: gateway.BusyCollect},
			"📥 Noted — I'll answer this together with your other new messages after the current request."},
		{"steered", gateway.Ack{Status: gateway.StatusSteered, Busy: gateway.BusySteer}, conv.TextSteered},
		{"steer fell back", gateway.Ack{Status: gateway.StatusQueued, Busy: gateway.BusySteer, FellBack: true},
			"📥 The assistant can't take messages mid-request, so I queued it — I'll get to it right after the current request."},
		{"interrupt: the superseded notice answers", gateway.Ack{Status: gateway.StatusQueued, Busy: gateway.BusyInterrupt}, ""},
	} {
		if got := conv.AckText(tc.ack); got != tc.want {
			t.Errorf("%s: AckText = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestStopText(t *testing.T) {
	stopped := gateway.AbortResult{Aborted: true, RunIDs: []string{"r1"}}
	for _, tc := range []struct {
		name string
		res  gateway.StopResult
		err  error
		want string
	}{
		{"idle", gateway.StopResult{}, nil, conv.TextNothingToStop},
		{"stopped: the stop notice answers", gateway.StopResult{AbortResult: stopped}, nil, ""},
		{"stopped with a queue", gateway.StopResult{AbortResult: stopped, Dropped: 2}, nil, "🗑️ 2 queued messages were dropped."},
		{"stopped with one queued", gateway.StopResult{AbortResult: stopped, Dropped: 1}, nil, "🗑️ 1 queued message was dropped."},
		{"idle with a queue", gateway.StopResult{Dropped: 3}, nil, "⏹️ Stopped. 3 queued messages were dropped."},
		{"already stopping", gateway.StopResult{Stopping: true}, nil, conv.TextStillStopping},
		{"already stopping, queue dropped", gateway.StopResult{Stopping: true, Dropped: 2}, nil,
			conv.TextStillStopping + " 2 queued messages were dropped."},
		{"not the owner", gateway.StopResult{}, fmt.Errorf("x: %w", gateway.ErrNotOwner), conv.TextNotOwner},
		{"failure", gateway.StopResult{}, errors.New("disk on fire"), conv.TextCannotStop},
	} {
		if got := conv.StopText(tc.res, tc.err); got != tc.want {
			t.Errorf("%s: StopText = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestErrorTextNeverNamesTheCause(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&gateway.QueueFullError{SessionKey: "k", Limit: 5}, (&gateway.QueueFullError{Limit: 5}).UserText()},
		{&gateway.BusyError{SessionKey: "k", RunID: "r"}, (&gateway.BusyError{}).UserText()},
		{&gateway.UnavailableError{Cause: errors.New("sqlite: disk I/O error /var/lib/x.db")}, (&gateway.UnavailableError{}).UserText()},
		{fmt.Errorf("x: %w", gateway.ErrEmpty), conv.TextEmpty},
		{fmt.Errorf("x: %w", gateway.ErrTooLong), conv.TooLongText(12, 10)},
		{fmt.Errorf("x: %w", gateway.ErrShutdown), conv.TextRestarting},
		{errors.New("runner exploded: /home/secret/path"), conv.TextCannotStart},
	} {
		got := conv.ErrorText(tc.err, 12, 10)
		if got != tc.want {
			t.Errorf("ErrorText(%v) = %q, want %q", tc.err, got, tc.want)
		}
		if strings.Contains(got, "sqlite") || strings.Contains(got, "/home/") {
			t.Errorf("ErrorText(%v) names the cause: %q", tc.err, got)
		}
	}
}

func TestStatusText(t *testing.T) {
	limits := timeout.Settings{Timeout: 10 * time.Minute, StepTimeout: 2 * time.Minute}
	working := abort.Snapshot{State: "running", Elapsed: 75 * time.Second,
		CurrentStep: event.Step{Seq: 2, Kind: event.StepTool, Name: "shell"}, StepElapsed: 30 * time.Second,
		UntilStep: 90 * time.Second, UntilWall: 525 * time.Second}
	q := func(texts ...string) []gateway.QueuedMessage {
		var out []gateway.QueuedMessage
		for _, s := range texts {
			out = append(out, gateway.QueuedMessage{Text: s})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		st   gateway.TurnStatus
		want string
	}{
		{"idle", gateway.TurnStatus{}, conv.TextIdle},
		{"working", gateway.TurnStatus{Running: true, Turn: working, Limits: limits},
			"⏳ Working — step 2: shell, running for 30 s.\nThe request has run for 1 min 15 s.\nTime left:\n" +
				"• 1 min 30 s before the no-progress limit (2 min)\n• 8 min 45 s before the time limit (10 min)\nSend /stop to stop it."},
		{"working with a queue", gateway.TurnStatus{Running: true, Turn: working, Limits: limits, Queue: q("second", "a  third\nmessage")},
			"⏳ Working — step 2: shell, running for 30 s.\nThe request has run for 1 min 15 s.\nTime left:\n" +
				"• 1 min 30 s before the no-progress limit (2 min)\n• 8 min 45 s before the time limit (10 min)\n" +
				"📥 2 messages waiting:\n1. second\n2. a third message\nSend /stop to stop it."},
		{"a long queue", gateway.TurnStatus{Queue: q("a", "b", "c", "d", strings.Repeat("x", 100))},
			"💤 Nothing is running.\n📥 5 messages waiting:\n1. a\n2. b\n3. c\n… and 2 more"},
		{"stopping", gateway.TurnStatus{Running: true, Limits: limits,
			Turn: abort.Snapshot{State: "aborted", StopReason: "superseded", Elapsed: 3 * time.Second}},
			"⏹️ Stopping (replaced by a newer message) — waiting for the work to end; the request has run for 3 s."},
		{"working, classed", gateway.TurnStatus{Running: true, Turn: classed(working, "working"), Limits: limits},
			"⏳ Working — step 2: shell, running for 30 s.\nThe request has run for 1 min 15 s.\n🟢 Making progress.\nTime left:\n" +
				"• 1 min 30 s before the no-progress limit (2 min)\n• 8 min 45 s before the time limit (10 min)\nSend /stop to stop it."},
		{"long-running", gateway.TurnStatus{Running: true, Turn: classed(working, "long_running"), Limits: limits},
			"⏳ Working — step 2: shell, running for 30 s.\nThe request has run for 1 min 15 s.\n🟡 One step is taking long, but it still shows signs of life.\nTime left:\n" +
				"• 1 min 30 s before the no-progress limit (2 min)\n• 8 min 45 s before the time limit (10 min)\nSend /stop to stop it."},
		{"stalled", gateway.TurnStatus{Running: true, Turn: classed(working, "stalled"), Limits: limits},
			"⏳ Working — step 2: shell, running for 30 s.\nThe request has run for 1 min 15 s.\n🟠 No sign of progress lately; it will be stopped if none comes before the no-progress limit.\nTime left:\n" +
				"• 1 min 30 s before the no-progress limit (2 min)\n• 8 min 45 s before the time limit (10 min)\nSend /stop to stop it."},
		{"paused: no class line", gateway.TurnStatus{Running: true, Turn: classed(func() abort.Snapshot { p := working; p.Paused = true; return p }(), "working"), Limits: limits},
			"⏳ Working — step 2: shell, running for 30 s.\nThe request has run for 1 min 15 s.\n⏸️ Paused — waiting for a person; the no-progress clock is stopped.\nTime left:\n" +
				"• 8 min 45 s before the time limit (10 min)\nSend /stop to stop it."},
		{"stuck", gateway.TurnStatus{Running: true, Limits: limits,
			Turn: abort.Snapshot{State: "aborted", StopReason: "step_timeout", Elapsed: 3 * time.Minute, Class: "stuck"}},
			"⏹️ Stopping (no progress) — waiting for the work to end; the request has run for 3 min.\n🔴 Stuck: it is past its limit and the work has not stopped yet."},
	} {
		if got := conv.StatusText(tc.st); got != tc.want {
			t.Errorf("%s: StatusText =\n%s\nwant\n%s", tc.name, got, tc.want)
		}
	}
}

// classed is s with class.
func classed(s abort.Snapshot, class string) abort.Snapshot {
	s.Class = class
	return s
}
