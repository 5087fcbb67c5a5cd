package acp_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/acp"
)

// These tests hold the runner to its bounds against a hostile agent: this
// test binary as the fake agent of scriptAgent.

// scriptRunner returns a runner whose agent is scriptAgent (mode script
// or dup), its log and its workdir.
func scriptRunner(t *testing.T, mode string) (*acp.Runner, *logBuffer, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return build(t, config.ACP{Command: exe, Workdir: t.TempDir(), Env: map[string]string{fakeEnv: mode},
		IdleSeconds: 60, StartTimeoutSeconds: 20}, grace)
}

// specialFiles makes in dir a FIFO "fifo" and a hard link "hard.txt" to
// a file outside it, holding "s3cret", whose path it returns.
func specialFiles(t *testing.T, dir string) (outside string) {
	t.Helper()
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	outside = filepath.Join(t.TempDir(), "secret.txt")
	if err := os.WriteFile(outside, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(outside, filepath.Join(dir, "hard.txt")); err != nil {
		t.Fatal(err)
	}
	return outside
}

// TestFSReadsAreBounded: fs/read_text_file returns at most 2 MB of text
// (line and limit read a part of a larger file), and refuses a binary
// file, a FIFO (at once, without waiting for a writer) and a hard link.
func TestFSReadsAreBounded(t *testing.T) {
	r, _, dir := scriptRunner(t, "script")
	write := func(name string, b []byte) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("zero.bin", make([]byte, 8<<20))
	line := strings.Repeat("x", 99) + "\n"
	write("big.txt", []byte(strings.Repeat(line, 3<<20/100)))
	write("small.txt", []byte("one\ntwo\nthree"))
	specialFiles(t, dir)
	tests := []struct{ msg, reply string }{
		{"read 1 small.txt", "1× content 13"},
		{"read 1 small.txt 2 1", "1× content 4"},
		{"read 1 small.txt 3 5", "1× content 5"},
		{"read 1 big.txt 1000 10", "1× content 1000"},
		{"read 1 big.txt", "1× error big.txt: the text asked for is larger than 2 MB; read it in parts with line and limit"},
		{"read 1 zero.bin", "1× error zero.bin is not a text file (it holds NUL bytes)"},
		{"read 1 fifo", "1× error fifo is not a regular file"},
		{"read 1 hard.txt", "1× error access denied: hard.txt has other hard links"},
	}
	c := &conv{key: "k", id: "c"}
	for _, tc := range tests {
		if got := mustSay(t, r, c.turn(tc.msg)); got != tc.reply {
			t.Errorf("%q: reply %q, want %q", tc.msg, got, tc.reply)
		}
	}
}

// TestFSWritesRefuseNonRegularFiles: fs/write_text_file neither waits for
// a FIFO's reader nor writes through a hard link to a file outside the
// workdir.
func TestFSWritesRefuseNonRegularFiles(t *testing.T) {
	r, _, dir := newRunner(t, grace, nil)
	outside := specialFiles(t, dir)
	c := &conv{key: "k", id: "c"}
	for _, tc := range []struct{ msg, reply string }{
		{"write file " + dir + "/fifo x", "refused: " + dir + "/fifo is not a regular file"},
		{"write file " + dir + "/hard.txt x", "refused: access denied: " + dir + "/hard.txt has other hard links"},
	} {
		if got := mustSay(t, r, c.turn(tc.msg)); !strings.HasPrefix(got, tc.reply) {
			t.Errorf("%q: reply %q, want it to start with %q", tc.msg, got, tc.reply)
		}
	}
	if b, _ := os.ReadFile(outside); string(b) != "s3cret" {
		t.Errorf("the file outside the workdir was written through its hard link: %q", b)
	}
}

// TestFIFOReadsHoldNoThreadOrFD: an agent reading a FIFO in the workdir
// over and over gets errors at once, and the gateway keeps no thread and
// no file descriptor for them (before, each read blocked an OS thread and
// an fd for good).
func TestFIFOReadsHoldNoThreadOrFD(t *testing.T) {
	r, _, dir := scriptRunner(t, "script")
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &conv{key: "k", id: "c"}
	mustSay(t, r, c.turn("read 1 fifo")) // the agent runs: its pipes and threads are counted before
	count := func(d string) int {
		es, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	threads, fds := count("/proc/self/task"), count("/proc/self/fd")
	for range 4 {
		t0 := time.Now()
		got := mustSay(t, r, c.turn("read 32 fifo"))
		if strings.Contains(got, "content") || !strings.Contains(got, "fifo is not a regular file") {
			t.Errorf("reply %q, want only errors", got)
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("32 reads of a FIFO took %s", d)
		}
	}
	if n := count("/proc/self/task"); n > threads+8 {
		t.Errorf("threads: %d before, %d after 128 reads of a FIFO", threads, n)
	}
	if n := count("/proc/self/fd"); n > fds+2 {
		t.Errorf("fds: %d before, %d after 128 reads of a FIFO", fds, n)
	}
}

// TestFSRequestsAtOnceAreBounded: of many fs requests sent at once, at
// most 4 are served together; the others are answered "busy" at once.
func TestFSRequestsAtOnceAreBounded(t *testing.T) {
	r, _, dir := scriptRunner(t, "script")
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), bytes.Repeat([]byte("abcdefg\n"), 1<<15), 0o644); err != nil {
		t.Fatal(err)
	}
	got := mustSay(t, r, (&conv{key: "k", id: "c"}).turn("read 200 a.txt"))
	var served, busy int
	for _, part := range strings.Split(got, "; ") {
		var n int
		var what string
		if _, err := fmt.Sscanf(part, "%d× %s", &n, &what); err != nil {
			t.Fatalf("reply part %q: %v", part, err)
		}
		switch {
		case part == fmt.Sprintf("%d× content %d", n, 8<<15):
			served += n
		case strings.HasSuffix(part, "error too many file requests at once: send the next one when one is answered"):
			busy += n
		default:
			t.Errorf("unexpected answer %q", part)
		}
	}
	if served+busy != 200 || busy == 0 || served == 0 {
		t.Errorf("%d served, %d busy of 200 sent at once; want both", served, busy)
	}
}

// TestRefusedRequestsAreNotLoggedOneByOne: 30,000 refused fs requests
// cost a bounded number of log lines and a count.
func TestRefusedRequestsAreNotLoggedOneByOne(t *testing.T) {
	r, logs, _ := scriptRunner(t, "script")
	got := mustSay(t, r, (&conv{key: "k", id: "c"}).turn("read 30000 /etc/"+strings.Repeat("p", 300)))
	if !strings.Contains(got, "is outside the workdir") {
		t.Fatalf("reply %q", got)
	}
	_ = r.Close() // the count is logged when the agent ends
	s := logs.String()
	if n := strings.Count(s, "\n"); n > 100 {
		t.Errorf("30,000 refused requests logged %d lines, want at most 100", n)
	}
	if !strings.Contains(s, "refused_requests=30000") {
		t.Errorf("log lacks the count of refused requests:\n%s", cutLog(s))
	}
	for l := range strings.SplitSeq(s, "\n") {
		if len(l) > 2000 {
			t.Errorf("a log line of %d bytes", len(l))
			break
		}
	}
}

// stepCounter counts the steps a turn starts.
type stepCounter struct {
	runner.Nop
	mu      sync.Mutex
	started map[string]int
}

func (c *stepCounter) StepStarted(kind, name string) {
	c.mu.Lock()
	c.started[kind]++
	c.mu.Unlock()
}

// TestToolCallsAreBounded: 40,000 tool calls that never complete cost
// linear time, and the turn follows at most 1,000 of them.
func TestToolCallsAreBounded(t *testing.T) {
	r, logs, _ := scriptRunner(t, "script")
	cb := &stepCounter{started: map[string]int{}}
	t0 := time.Now()
	o := await(t, start(t.Context(), r, (&conv{key: "k", id: "c"}).turn("tools 40000"), cb))
	if o.err != nil || o.res.Text != "sent 40000" {
		t.Fatalf("turn: %q, %v", o.res.Text, o.err)
	}
	t.Logf("40,000 tool calls in %s", time.Since(t0))
	if n := cb.started["tool"]; n != 1000 {
		t.Errorf("%d tool steps started, want the 1,000 followed", n)
	}
	if !strings.Contains(logs.String(), "count=39000 limit=1000") {
		t.Errorf("log lacks the count of tool calls not followed:\n%s", cutLog(logs.String()))
	}
}

// TestDuplicateSessionID: an agent that answers session/new of a second
// conversation with the first one's sessionId does not get the second
// conversation's message: that turn fails in words, the first goes on.
func TestDuplicateSessionID(t *testing.T) {
	r, logs, _ := scriptRunner(t, "dup")
	a, b := &conv{key: "a", id: "a"}, &conv{key: "b", id: "b"}
	if got := mustSay(t, r, a.turn("echo")); got != "echo same" {
		t.Fatalf("first conversation: %q", got)
	}
	text, err := say(t, r, b.turn("echo"))
	if want := "The agent answered with another conversation's session, so your message was not sent to it. Try again later."; err == nil || userError(t, err) != want {
		t.Errorf("second conversation: %q, %v; want %q", text, err, want)
	}
	if got := mustSay(t, r, a.turn("echo")); got != "echo same" {
		t.Errorf("first conversation after: %q", got)
	}
	if !strings.Contains(logs.String(), "sessionId of another live conversation") {
		t.Errorf("log lacks the duplicate:\n%s", cutLog(logs.String()))
	}
}

// TestPermissionOptionsAreBounded: a permission request whose option ids
// are not unique, empty or too long, or that has too many options, is
// answered with an error and nobody is asked.
func TestPermissionOptionsAreBounded(t *testing.T) {
	r, _, _ := scriptRunner(t, "script")
	opt := func(id string) string { return fmt.Sprintf(`{"optionId":%q,"name":"n","kind":"allow_once"}`, id) }
	many := make([]string, 11)
	for i := range many {
		many[i] = opt(fmt.Sprint(i))
	}
	tests := []struct {
		options, reply string
		asked          bool
	}{
		{"[" + opt("a") + "," + opt("b") + "]", `1× result {"outcome":{"outcome":"selected","optionId":"a"}}`, true},
		{"[" + opt("x") + "," + opt("x") + "]", `1× error invalid params: options[1].optionId "x" is not unique`, false},
		{"[" + opt("") + "]", `1× error invalid params: options[0].optionId is required`, false},
		{"[" + opt(strings.Repeat("i", 200_000)) + "]", `1× error invalid params: options[0].optionId is longer than 128 bytes`, false},
		{"[" + strings.Join(many, ",") + "]", `1× error invalid params: 11 options, at most 10`, false},
	}
	for i, tc := range tests {
		ap := &approver{answer: func(q runner.Question) (runner.Answer, error) {
			return runner.Answer{Outcome: runner.Selected, OptionID: q.Options[0].ID, Kind: q.Options[0].Kind}, nil
		}}
		turn := (&conv{key: "k", id: fmt.Sprint("c", i)}).turn("ask " + tc.options)
		turn.Approver = ap
		if got := mustSay(t, r, turn); got != tc.reply {
			t.Errorf("%.60s: reply %q, want %q", tc.options, got, tc.reply)
		}
		if asked := len(ap.questions()) > 0; asked != tc.asked {
			t.Errorf("%.60s: person asked: %v, want %v", tc.options, asked, tc.asked)
		}
	}
}
