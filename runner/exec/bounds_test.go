package exec_test

// Output bounds: what an agent writes cannot grow the gateway's memory or
// its log without limit.

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner"
)

// TestLongLineFailsTheTurnInWords: a stdout line over 4 MiB (10 MiB, with no
// end) is neither buffered nor waited for; the turn fails with a message the
// user can read and the agent is stopped at once.
func TestLongLineFailsTheTurnInWords(t *testing.T) {
	r, logs := newRunnerGrace(t, config.Exec{Command: script("long_line.sh")}, 10*grace)
	o := await(t, start(t.Context(), r, "", runner.Nop{}))
	const want = "The agent wrote an output line longer than 4 MiB, more than turnguard accepts, so it was stopped."
	if u, ok := runner.AsUserError(o.err); !ok || u.Message != want {
		t.Fatalf("err = %v, want the user error %q", o.err, want)
	}
	if len(o.res.Text) > 0 {
		t.Errorf("reply holds %d bytes of the long line", len(o.res.Text))
	}
	if o.dur >= 10*grace {
		t.Errorf("Run took %v: the agent was not stopped at once", o.dur)
	}
	if !strings.Contains(logs.String(), "output line too long; stopping the agent") {
		t.Errorf("log:\n%s", logs)
	}
}

// TestLogLinesPerTurnBounded: 10,000 junk stdout lines and 10,000 stderr
// lines give a bounded number of log records plus one summary each.
func TestLogLinesPerTurnBounded(t *testing.T) {
	r, logs := newRunner(t, config.Exec{Command: script("flood.sh")})
	o := await(t, start(t.Context(), r, "", runner.Nop{}))
	if o.err != nil || o.res.Text != "done" {
		t.Fatalf("Run = %q, %v", o.res.Text, o.err)
	}
	if got := r.Malformed(); got != 10000 {
		t.Errorf("Malformed() = %d, want 10000", got)
	}
	log := logs.String()
	for _, tt := range []struct {
		record string
		n      int
	}{
		{`msg="exec: malformed output line"`, 20},
		{`msg="exec: agent stderr"`, 100},
		{`msg="exec: malformed output lines" run_id=run-1 count=10000 not_logged=9980`, 1},
		{`msg="exec: agent stderr lines not logged (per-turn limit)" run_id=run-1 count=9900 logged=100`, 1},
	} {
		if got := strings.Count(log, tt.record); got != tt.n {
			t.Errorf("%d records %s, want %d", got, tt.record, tt.n)
		}
	}
	if n := strings.Count(log, "\n"); n > 200 {
		t.Errorf("%d log records for one turn", n)
	}
}

// deltaBytes counts the streamed text.
type deltaBytes struct {
	runner.Nop
	n atomic.Int64
}

func (d *deltaBytes) Delta(text string) { d.n.Add(int64(len(text))) }

// TestStreamedTextBounded: the runner keeps and streams at most 4 MiB of a
// reply (the engine then caps it at agents.defaults.maxReplyChars).
func TestStreamedTextBounded(t *testing.T) {
	r, logs := newRunner(t, config.Exec{Command: script("big_reply.sh")})
	cb := &deltaBytes{}
	o := await(t, start(t.Context(), r, "", cb))
	if o.err != nil {
		t.Fatal(o.err)
	}
	const limit = 4 << 20
	if len(o.res.Text) != limit || cb.n.Load() != limit {
		t.Errorf("kept %d bytes, streamed %d; want %d each", len(o.res.Text), cb.n.Load(), limit)
	}
	if !strings.Contains(logs.String(), `msg="exec: streamed text over the limit dropped" run_id=run-1 bytes=2097152 limit=4194304`) {
		t.Errorf("log:\n%s", logs)
	}
}

// TestStderrSecretsRedactedInLog: an agent that prints its configured API
// key (agents.exec.env) on stderr: the log line and the operator detail name
// it [redacted], never the key.
func TestStderrSecretsRedactedInLog(t *testing.T) {
	const key = "sk-test-0123456789abcdefSECRET"
	r, logs := newRunner(t, config.Exec{Command: script("leak_key.sh"), Env: map[string]string{"OPENAI_API_KEY": key}})
	o := await(t, start(t.Context(), r, "", runner.Nop{}))
	if o.err == nil {
		t.Fatal("the agent exited 1 without a final answer: want an error")
	}
	log := logs.String()
	if strings.Contains(log, key) || !strings.Contains(log, "Incorrect API key provided: [redacted]") {
		t.Fatalf("log:\n%s", log)
	}
}

// TestLoggedAgentValuesCut: values the agent chose (an unknown type, an
// error message, an event type after the answer) are cut in the log: no
// record carries the agent's 100,000 bytes.
func TestLoggedAgentValuesCut(t *testing.T) {
	r, logs := newRunner(t, config.Exec{Command: script("huge_fields.sh")})
	o := await(t, start(t.Context(), r, "", runner.Nop{}))
	if _, ok := runner.AsUserError(o.err); !ok {
		t.Fatalf("err = %v, want the agent's error", o.err)
	}
	log := logs.String()
	for _, msg := range []string{`msg="exec: malformed output line"`, `msg="exec: agent reported an error"`, `msg="exec: event after the final answer ignored"`} {
		if !strings.Contains(log, msg) {
			t.Errorf("log lacks %s", msg)
		}
	}
	for rec := range strings.Lines(log) {
		if len(rec) > 1000 {
			t.Errorf("a log record of %d bytes: %.300s…", len(rec), rec)
		}
	}
}
