package pgcoord

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/testwait"
)

// childEnv, set to a database URL, makes the test binary a replica process
// (childMain) instead of running tests.
const childEnv = "TURNGUARD_PGCOORD_CHILD"

const (
	childRun   = "stopped-run"
	childLease = 1500 * time.Millisecond
)

// childMain is a replica in its own process: it joins as "stopped", claims
// childRun for a Telegram chat and says "claimed"; once fenced (after the
// parent's SIGSTOP and SIGCONT) it says "fenced: …", then tries to finish
// the turn — through Finish ("finish: …") and straight at the database,
// past its own fence ("dbfinish: …") — and exits.
func childMain() int {
	ctx := context.Background()
	say := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	r, err := JoinURL(ctx, os.Getenv(childEnv), Options{ReplicaID: "stopped", Lease: childLease, Notice: notice,
		OutboxChannels: []string{"telegram"}, Logger: quiet})
	if err != nil {
		say("error: %v", err)
		return 1
	}
	if err := r.Claim(ctx, Claim{RunID: childRun, SessionKey: "telegram:77", Channel: "telegram", ChatRef: "77",
		Text: "a long job"}); err != nil {
		say("error: %v", err)
		return 1
	}
	say("claimed %d", r.Epoch())
	select {
	case <-r.Fenced():
		say("fenced: %v", r.Err())
	case <-time.After(30 * time.Second):
		say("error: never fenced")
		return 1
	}
	say("finish: %v", r.Finish(ctx, finished(childRun, "the late reply")))
	say("dbfinish: %v", r.finish(ctx, finished(childRun, "the late reply"), false))
	return 0
}

// The owner of a turn is SIGSTOPped for two leases: survivors take its turn
// over within lease + 1 s; after SIGCONT it reports itself fenced at once,
// and its late final is refused both by its fence and by the database: the
// user gets exactly one interrupted notice and no late reply.
func TestSIGSTOPedOwnerIsTakenOverAndItsLateFinalRefused(t *testing.T) {
	url := pgtest.New(t)
	var seen takeovers
	for i := range 2 {
		join(t, url, fmt.Sprintf("survivor-%d", i), childLease, func(o *Options) { o.OnTakeover = seen.add })
	}
	p := db(t, url)

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), childEnv+"="+url)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(prefix string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok || !strings.HasPrefix(l, prefix) {
				t.Fatalf("the child said %q (open %v), want %q…; stderr: %s", l, ok, prefix, stderr.String())
			}
			return l
		case <-time.After(20 * time.Second):
			t.Fatalf("the child said nothing for 20 s, want %q…; stderr: %s", prefix, stderr.String())
		}
		return ""
	}
	var epoch int64
	if _, err := fmt.Sscanf(next("claimed"), "claimed %d", &epoch); err != nil {
		t.Fatal(err)
	}

	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	testwait.Until(t, childLease+3*time.Second, "the survivors take the stopped replica over", func() bool {
		n, _, _ := seen.of(epoch)
		return n > 0
	})
	n, first, taken := seen.of(epoch)
	if took := first.Sub(stopped); took > childLease+time.Second {
		t.Errorf("taken over %s after SIGSTOP, want ≤ lease + 1 s = %s", took, childLease+time.Second)
	}
	// Both survivors may take part (one ends the turn in a batch, the
	// other deletes the lease), but the turn is ended once and the epoch
	// has one last takeover.
	testwait.Until(t, childLease+3*time.Second, "the stopped epoch's last takeover", func() bool { return seen.lasts(epoch) > 0 })
	n, _, taken = seen.of(epoch)
	if last := seen.lasts(epoch); n > 2 || last != 1 || len(taken) != 1 || taken[0].RunID != childRun || !taken[0].Outboxed {
		t.Fatalf("%d takeovers of the stopped epoch (%d last), turns %+v; want 1 or 2, one last, one turn %s, its notice in the outbox",
			n, last, taken, childRun)
	}
	time.Sleep(time.Until(stopped.Add(2 * childLease))) // real time: the owner stays stopped for two leases
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	continued := time.Now()
	fenced := next("fenced:")
	if d := time.Since(continued); d > childLease/3 {
		t.Errorf("the child reported its fence %s after SIGCONT, want at once", d)
	}
	if !strings.Contains(fenced, ErrFenced.Error()) {
		t.Errorf("child: %q", fenced)
	}
	if l := next("finish:"); !strings.Contains(l, ErrStale.Error()) {
		t.Errorf("the late Finish: %q, want it refused as stale", l)
	}
	if l := next("dbfinish:"); !strings.Contains(l, ErrStale.Error()) {
		t.Errorf("the late finish past the fence: %q, want the database to refuse it as stale", l)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v; stderr: %s", err, stderr.String())
	}
	_, _ = io.Copy(io.Discard, out)

	if n := count(t, p, `SELECT count(*) FROM messages WHERE run_id = $1 AND role = 'assistant'`, childRun); n != 1 {
		t.Errorf("%d assistant messages for the run, want the one notice", n)
	}
	if n := count(t, p, `SELECT count(*) FROM messages WHERE text = 'the late reply'`); n != 0 {
		t.Errorf("the late reply is in the history")
	}
	if n := count(t, p, `SELECT count(*) FROM outbox WHERE run_id = $1`, childRun); n != 1 {
		t.Errorf("%d outbox rows for the run, want the one notice", n)
	}
	if n := count(t, p, `SELECT count(*) FROM turns WHERE run_id = $1 AND stop_reason = 'interrupted'`, childRun); n != 1 {
		t.Errorf("the run is not ended as interrupted")
	}
}
