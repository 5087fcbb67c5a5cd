package acp_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
)

// TestTerminals: the Node agent on the ACP SDK runs commands through the
// client's terminal methods. A command runs in the workdir with the
// agent's env entries, its exit status and output come back, its output is
// cut to the agent's outputByteLimit and to the runner's own bound (the
// tail kept, truncated said) and is activity, terminal/kill kills it, and a turn has at
// most 4 terminals at once (a released one frees its slot).
func TestTerminals(t *testing.T) {
	r, _, dir := newRunner(t, grace, nil)
	big := 2 << 20
	tests := []struct {
		msg, reply string
		events     []string // the tool step of the terminal, when checked
		activity   bool     // its output was reported as activity
	}{
		{msg: "terminal run echo $ACP_TEST_VAR; pwd",
			reply:    fmt.Sprintf("exit 0 truncated false output %q", "from-agent\n"+dir+"\n"),
			events:   []string{"start tool sh -c echo $ACP_TEST_VAR; pwd", "done tool sh -c echo $ACP_TEST_VAR; pwd"},
			activity: true},
		{msg: "terminal run echo out; echo err >&2; exit 3", reply: `exit 3 truncated false output "out\nerr\n"`},
		{msg: "terminal run limit 10 printf 0123456789abcdef", reply: `exit 0 truncated true output "6789abcdef"`},
		// A cut never splits a character: "é" is two bytes.
		{msg: "terminal run limit 2 printf abéc", reply: `exit 0 truncated true output "c"`},
		{msg: fmt.Sprintf("terminal run limit %d head -c %d /dev/zero | tr '\\0' x", big, big),
			reply: fmt.Sprintf("exit 0 truncated true output %q", strings.Repeat("x", 1<<20))},
		{msg: "terminal kill", reply: "killed: exit null signal SIGKILL"},
		{msg: "terminal many 6", reply: "made 4, error: too many terminals: at most 4 at once; release one first"},
	}
	c := &conv{key: "k", id: "c"}
	for _, tc := range tests {
		t.Run(cutName(tc.msg), func(t *testing.T) {
			rec := newRecorder()
			o := await(t, start(context.Background(), r, c.turn(tc.msg), rec))
			if o.err != nil {
				t.Fatal(o.err)
			}
			if o.res.Text != tc.reply {
				t.Errorf("reply %q, want %q", cutLog(o.res.Text), cutLog(tc.reply))
			}
			var steps []string
			for _, ev := range rec.Events() {
				if strings.HasPrefix(ev, "start tool") || strings.HasPrefix(ev, "done tool") {
					steps = append(steps, ev)
				}
			}
			if tc.activity && !slices.Contains(rec.Events(), "activity") {
				t.Errorf("the output was no activity: %q", rec.Events())
			}
			if tc.events != nil && !slices.Equal(steps, tc.events) {
				t.Errorf("tool steps %q, want %q", steps, tc.events)
			}
		})
	}
}

func cutName(s string) string {
	if len(s) > 30 {
		return s[:30]
	}
	return s
}

// deltas is a recorder that also hands each Delta to a channel.
type deltas struct {
	*recorder
	ch chan string
}

func (d deltas) Delta(s string) {
	d.recorder.Delta(s)
	select {
	case d.ch <- s:
	default:
	}
}

// TestTerminalKilledWithTheTurn: a turn aborted while its terminal's
// command runs leaves no process behind — the command is killed with its
// process group when the turn ends — and the next turn works.
func TestTerminalKilledWithTheTurn(t *testing.T) {
	r, logs, _ := newRunner(t, grace, nil)
	c := &conv{key: "k", id: "c"}
	ctx, cancel := context.WithCancel(context.Background())
	cb := deltas{newRecorder(), make(chan string, 4)}
	ch := start(ctx, r, c.turn("terminal hang"), cb)
	var pid int
	select {
	case d := <-cb.ch:
		var err error
		if pid, err = strconv.Atoi(strings.TrimPrefix(d, "pid ")); err != nil {
			t.Fatalf("reply %q", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no pid")
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the command %d is not running: %v", pid, err)
	}
	cancel()
	if o := await(t, ch); !errors.Is(o.err, context.Canceled) {
		t.Fatalf("aborted turn: %v", o.err)
	}
	gone := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(gone) {
			t.Fatalf("the terminal's command %d still runs after its turn ended\n%s", pid, cutLog(logs.String()))
		}
		time.Sleep(10 * time.Millisecond) // real time: polling a real process's exit
	}
	if got := mustSay(t, r, c.turn("hello")); got != "echo: hello" {
		t.Errorf("next turn: %q", got)
	}
	if !strings.Contains(logs.String(), "acp: terminal released") {
		t.Errorf("log lacks the release:\n%s", cutLog(logs.String()))
	}
}

// TestEngineTerminalStepTimeout: the real engine with the acp runner. A
// terminal whose command prints nothing is a tool step named after the
// command: stepTimeoutSeconds stops the turn, the user reads the
// command's name, and the conversation goes on.
func TestEngineTerminalStepTimeout(t *testing.T) {
	turn := engineTurns(t)
	ev := turn("r1", "terminal hang")
	if ev.Kind != event.Aborted || ev.StopReason != event.ReasonStepTimeout {
		t.Fatalf("terminal hang ended %s %s %q, want aborted step_timeout", ev.Kind, ev.StopReason, ev.Message)
	}
	if !strings.Contains(ev.Message, "sh -c echo $$; exec sleep 600") {
		t.Errorf("the user reads %q, which does not name the command", ev.Message)
	}
	if ev := turn("r2", "hello"); ev.Kind != event.Finished || ev.FullText != "echo: hello" {
		t.Errorf("after the step timeout: %s %q %q", ev.Kind, ev.FullText, ev.Message)
	}
}
