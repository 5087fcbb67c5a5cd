package exec_test

import (
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/exec"
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

// TestInMemoryStoreHasThisProcessesInstance: a ":memory:" store shares no
// state with another process, so its instance is this process's random one
// (the one of an empty instance), not a hash of the working directory that
// every in-memory gateway started there would share — and kill.
func TestInMemoryStoreHasThisProcessesInstance(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	mem := exec.InstanceID(":memory:")
	if mem == exec.InstanceID(filepath.Join(wd, ":memory:")) {
		t.Errorf("InstanceID(:memory:) = %s, the hash of the working directory's path", mem)
	}
	if exec.Tag(mem, "r") != exec.Tag("", "r") {
		t.Errorf("InstanceID(:memory:) = %s, not this process's random instance (%s)", mem, exec.Tag("", "r"))
	}
}
