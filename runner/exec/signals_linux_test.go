package exec_test

import (
	osexec "os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner"
)

// TestAgentDoesNotIgnoreSIGINT: the shim runs the command in the background,
// which makes sh ignore SIGINT and SIGQUIT in it; the command gets them back
// at their default (env --default-signal), so an agent that cancels its own
// tools with SIGINT works: it ignores neither, and a child it sends SIGINT
// dies with 130.
func TestAgentDoesNotIgnoreSIGINT(t *testing.T) {
	if osexec.Command("env", "--default-signal=INT,QUIT", "true").Run() != nil {
		t.Skip("no env --default-signal (GNU coreutils 8.31 or later)")
	}
	r, _ := newRunner(t, config.Exec{Command: script("sigint.sh")})
	o := await(t, start(t.Context(), r, "", runner.Nop{}))
	if o.err != nil {
		t.Fatal(o.err)
	}
	ign, st, _ := strings.Cut(o.res.Text, " ")
	mask, err := strconv.ParseUint(ign, 16, 64)
	if err != nil {
		t.Fatalf("text = %q, want \"<SigIgn> <status>\"", o.res.Text)
	}
	if mask&(1<<(syscall.SIGINT-1)) != 0 || mask&(1<<(syscall.SIGQUIT-1)) != 0 {
		t.Errorf("the agent ignores signals %#x, SIGINT or SIGQUIT among them", mask)
	}
	if st != "130" {
		t.Errorf("a child sent SIGINT ended with %s, want 130", st)
	}
}
