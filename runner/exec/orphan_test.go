package exec_test

// Orphans: nothing an agent starts outlives its turn or the gateway. These
// tests run real processes; waits on them are bounded real time.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner/exec"
)

func linuxOnly(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the shim and run tags are Linux only")
	}
}

// readPids waits (10s of real time at most) for the script to write its
// pid file and returns the pids in it.
func readPids(t *testing.T, path string, n int) []int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil {
			var pids []int
			for _, f := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(f)
				if err != nil {
					t.Fatalf("pid file %q: %v", b, err)
				}
				pids = append(pids, pid)
			}
			if len(pids) == n {
				return pids
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid file %s never had %d pids", path, n)
		}
		time.Sleep(10 * time.Millisecond) // real time: another process writes the file
	}
}

// TestSetsidGrandchildKilledOnAbort: a grandchild that left the agent's
// process group with setsid is killed with the group when the turn is
// aborted (found by its run tag).
func TestSetsidGrandchildKilledOnAbort(t *testing.T) {
	linuxOnly(t)
	pidfile := filepath.Join(t.TempDir(), "pids")
	r, _ := newRunner(t, config.Exec{Command: script("setsid_grandchild.sh"), Env: map[string]string{"PIDFILE": pidfile}})
	rec := newRecorder()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch := start(ctx, r, "", rec)
	rec.WaitFor(t, "heartbeat")
	pids := readPids(t, pidfile, 2)
	if g0, _ := syscall.Getpgid(pids[0]); g0 != 0 {
		if g1, _ := syscall.Getpgid(pids[1]); g1 == g0 {
			t.Fatal("the grandchild did not leave the agent's process group")
		}
	}
	cancel()
	o := await(t, ch)
	if !errors.Is(o.err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", o.err)
	}
	// When Run returns, nothing of the turn still runs: no polling.
	for _, pid := range pids { // the agent, the setsid grandchild
		if syscall.Kill(pid, 0) == nil && !zombie(pid) {
			t.Errorf("process %d still runs after Run returned", pid)
		}
	}
	waitGone(t, pids[0])
	waitGone(t, pids[1])
}

// TestHelperGateway is not a test: run by TestShimKillsEverythingWhenGatewayDies
// as a separate process (a stand-in for the gateway), it starts the agent
// script under the shim and waits to be killed.
func TestHelperGateway(t *testing.T) {
	pidfile := os.Getenv("TURNGUARD_TEST_HELPER_PIDFILE")
	if pidfile == "" {
		t.Skip("helper process only")
	}
	cmd := osexec.Command(script("setsid_grandchild.sh"))
	cmd.Env = exec.Environ("PIDFILE=" + pidfile)
	if _, err := exec.StartTagged(cmd, exec.Tag("", "death-test")); err != nil {
		t.Fatal(err)
	}
	select {} // until killed
}

// TestShimKillsEverythingWhenGatewayDies: when the process that started an
// agent dies by SIGKILL, the kernel's parent-death signal makes the shim
// kill the agent's process group and its setsid grandchild within a second.
func TestShimKillsEverythingWhenGatewayDies(t *testing.T) {
	linuxOnly(t)
	pidfile := filepath.Join(t.TempDir(), "pids")
	gw := osexec.Command(os.Args[0], "-test.run=^TestHelperGateway$")
	gw.Env = append(os.Environ(), "TURNGUARD_TEST_HELPER_PIDFILE="+pidfile)
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	pids := readPids(t, pidfile, 2)
	group, err := syscall.Getpgid(pids[0])
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(-group, syscall.SIGKILL)
	defer syscall.Kill(pids[1], syscall.SIGKILL)

	if err := gw.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = gw.Wait()
	killed := time.Now()
	for _, pid := range []int{group, pids[0], pids[1]} { // shim, agent, setsid grandchild
		for syscall.Kill(pid, 0) == nil && !zombie(pid) {
			if time.Since(killed) > time.Second {
				t.Fatalf("process %d still runs 1s after its gateway was killed (shim %d, agent %d, setsid grandchild %d)", pid, group, pids[0], pids[1])
			}
			time.Sleep(5 * time.Millisecond) // real time: the kernel and the shim kill other processes
		}
	}
}

// TestShimIgnoresSIGUSR1WhileParentLives: the death trap acts only once the
// shim's parent is gone, so a SIGUSR1 the agent sends its own group (or
// anyone sends the shim) kills nothing.
func TestShimIgnoresSIGUSR1WhileParentLives(t *testing.T) {
	linuxOnly(t)
	cmd := osexec.Command("/bin/sh", "-c", "trap '' USR1; echo up; kill -s USR1 0; sleep 0.3; echo still")
	cmd.Env = exec.Environ()
	var out strings.Builder
	cmd.Stdout = &out
	p, err := exec.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Wait()
	if got := p.State().String(); got != "exit status 0" || out.String() != "up\nstill\n" {
		t.Errorf("status %q, output %q; want the command to finish", got, out.String())
	}
}

// zombie reports whether pid is a zombie (dead, not yet reaped).
func zombie(pid int) bool {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(st, ')')
	return i > 0 && bytes.HasPrefix(st[i+1:], []byte(" Z"))
}

// TestShimKeepsStdioAndStatus: the shim between the gateway and the command
// changes nothing the runner sees: stdin, stdout, stderr and the exit status
// (code or signal) are the command's, and SIGTERM reaches the command.
func TestShimKeepsStdioAndStatus(t *testing.T) {
	tests := []struct {
		name, script, stdin, stdout, stderr, status string
		term                                        bool
	}{
		{"stdin to stdout", "cat; echo err >&2", "hello", "hello", "err\n", "exit status 0", false},
		{"exit code", "exit 3", "", "", "", "exit status 3", false},
		{"killed by a signal", "kill -9 $$", "", "", "", "signal: killed", false},
		{"SIGTERM handled by the command", "trap 'echo bye; exit 7' TERM; echo up; sleep 60 & wait", "", "up\nbye\n", "", "exit status 7", true},
		{"SIGTERM not handled", "echo up; sleep 60", "", "up\n", "", "signal: terminated", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := osexec.Command("/bin/sh", "-c", tt.script)
			cmd.Env = exec.Environ()
			cmd.Stdin = strings.NewReader(tt.stdin)
			var stdout, stderr strings.Builder
			cmd.Stderr = &stderr
			outR, outW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stdout = outW
			p, err := exec.Start(cmd)
			outW.Close()
			if err != nil {
				t.Fatal(err)
			}
			if tt.term {
				buf := make([]byte, 3)
				if _, err := outR.Read(buf); err != nil || string(buf) != "up\n" {
					t.Fatalf("read %q, %v", buf, err)
				}
				stdout.Write(buf)
				if err := p.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}
			b := make([]byte, 4096)
			for {
				n, err := outR.Read(b)
				stdout.Write(b[:n])
				if err != nil {
					break
				}
			}
			outR.Close()
			_ = p.Wait()
			if got := p.State().String(); got != tt.status {
				t.Errorf("status = %q, want %q", got, tt.status)
			}
			if stdout.String() != tt.stdout || stderr.String() != tt.stderr {
				t.Errorf("stdout %q stderr %q, want %q %q", stdout.String(), stderr.String(), tt.stdout, tt.stderr)
			}
		})
	}
}

// TestKillInstance: at start-up a gateway kills the processes tagged by its
// own instance (left by a previous process on the same store), and no
// others.
func TestKillInstance(t *testing.T) {
	linuxOnly(t)
	inst := exec.InstanceID(filepath.Join(t.TempDir(), "gateway.db"))
	other := exec.InstanceID(filepath.Join(t.TempDir(), "other.db"))
	if inst == other {
		t.Fatalf("instance ids %q %q", inst, other)
	}
	startTagged := func(tag string) *osexec.Cmd {
		cmd := osexec.Command("sleep", "60")
		cmd.Env = append(exec.Environ(), exec.RunTagEnv+"="+tag)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	mine := startTagged(exec.Tag(inst, "run-1"))
	theirs := startTagged(exec.Tag(other, "run-1"))
	prefixOnly := startTagged(inst + "x:run-1") // a longer instance id is another instance
	n, err := exec.KillInstance(inst)
	if err != nil || n != 1 {
		t.Fatalf("KillInstance = %d, %v; want 1 process killed", n, err)
	}
	if err := mine.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("tagged process: %v, want killed", err)
	}
	for _, c := range []*osexec.Cmd{theirs, prefixOnly} {
		if err := c.Process.Signal(syscall.Signal(0)); err != nil {
			t.Errorf("another instance's process %d was killed", c.Process.Pid)
		}
	}
}

func TestTagAndInstance(t *testing.T) {
	dir := t.TempDir()
	a, b := exec.InstanceID(filepath.Join(dir, "gateway.db")), exec.InstanceID(filepath.Join(dir, ".", "gateway.db"))
	if a != b {
		t.Errorf("the same store has instance ids %q and %q", a, b)
	}
	if a == exec.InstanceID(filepath.Join(dir, "other.db")) {
		t.Errorf("two stores share instance id %q", a)
	}
	for _, tt := range []struct{ run, want string }{
		{"run-1", "i:run-1"},
		{"has space", "i:h"},
		{"nul\x00", "i:h"},
		{strings.Repeat("x", 200), "i:h"},
	} {
		if got := exec.Tag("i", tt.run); !strings.HasPrefix(got, tt.want) || strings.ContainsAny(got, " \x00") || len(got) > 140 {
			t.Errorf("Tag(i, %q) = %q", tt.run, got)
		}
	}
}
