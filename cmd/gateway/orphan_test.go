package main

// Orphan process tests: the built binary runs an exec agent and is killed
// with SIGKILL; nothing of the agent may survive it, and what a shim could
// not kill is killed by the next start on the same store.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	execrunner "github.com/turnguard/turnguard/runner/exec"
)

// orphanConfig runs every turn on testdata/orphan_agent.sh with its store in
// dir; the agent writes its pids to pidfile.
func orphanConfig(t *testing.T, dir, pidfile string) string {
	t.Helper()
	agent, err := filepath.Abs(filepath.Join("testdata", "orphan_agent.sh"))
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`server:
  listen: 127.0.0.1:0
  token: %s
agents:
  defaults:
    runner: exec
  exec:
    command: %s
    env:
      PIDFILE: %s
store:
  path: %s
`, testToken, agent, pidfile, filepath.Join(dir, "gateway.db"))
}

// startOrphanTurn starts the gateway with orphanConfig in dir and a turn
// run on it, and returns once the agent's tool runs: the configuration, the
// gateway and the agent's pids (agent, child, setsid grandchild).
func startOrphanTurn(t *testing.T, dir, run string) (cfg string, p *gatewayProc, pids []int) {
	t.Helper()
	pidfile := filepath.Join(dir, "agent.pids")
	cfg = orphanConfig(t, dir, pidfile)
	p = startGateway(t, dir, cfg)
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, "main", run, "hello")
	cl.waitEvent("agent", 10*time.Second, toolStarted(run, "hang"))
	b, err := os.ReadFile(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		pids = append(pids, pid)
	}
	if len(pids) != 3 {
		t.Fatalf("pid file %q", b)
	}
	return cfg, p, pids
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(st, ')')
	return i < 0 || !bytes.HasPrefix(st[i+1:], []byte(" Z"))
}

// pgid returns the process group of pid.
func pgid(t *testing.T, pid int) int {
	t.Helper()
	g, err := syscall.Getpgid(pid)
	if err != nil {
		t.Fatalf("getpgid %d: %v", pid, err)
	}
	return g
}

// groupMembers lists the live processes of process group g.
func groupMembers(g int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pg, err := syscall.Getpgid(pid); err == nil && pg == g && alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// TestSIGKILLedGatewayLeavesNoAgent: a gateway killed with SIGKILL in the
// middle of an exec turn takes the agent's whole process group and the
// grandchild that left it with setsid down with it within a second; a
// leftover the shim could not kill (a process tagged for this store by
// hand) is killed by the next start on the same store, before it listens.
func TestSIGKILLedGatewayLeavesNoAgent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Linux only")
	}
	dir := t.TempDir()
	cfg, p, pids := startOrphanTurn(t, dir, "run-orphan")
	agent, setsidChild := pids[0], pids[2]
	group := pgid(t, agent)
	if pgid(t, setsidChild) == group {
		t.Fatalf("the grandchild did not leave the group")
	}
	defer func() { // never leave them behind, whatever the test found
		syscall.Kill(-group, syscall.SIGKILL)
		syscall.Kill(setsidChild, syscall.SIGKILL)
	}()

	p.signal(syscall.SIGKILL)
	killed := time.Now()
	p.wait(5 * time.Second)
	for {
		left := groupMembers(group)
		if alive(setsidChild) {
			left = append(left, setsidChild)
		}
		if len(left) == 0 {
			break
		}
		if time.Since(killed) > time.Second {
			t.Fatalf("1s after the gateway was killed, agent processes %v still run (group %d, setsid grandchild %d)", left, group, setsidChild)
		}
		time.Sleep(10 * time.Millisecond) // real time: the kernel and the shim kill other processes
	}

	// A leftover that escaped everything: tagged for this store by hand.
	inst := execrunner.InstanceID(filepath.Join(dir, "gateway.db"))
	leftover := exec.Command("sleep", "600")
	leftover.Env = append(cleanEnv(), execrunner.RunTagEnv+"="+execrunner.Tag(inst, "run-by-hand"))
	leftover.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	stranger := exec.Command("sleep", "600") // another store's: not ours to kill
	stranger.Env = append(cleanEnv(), execrunner.RunTagEnv+"="+execrunner.Tag(execrunner.InstanceID(filepath.Join(dir, "other.db")), "run-by-hand"))
	for _, c := range []*exec.Cmd{leftover, stranger} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	}
	exited := make(chan error, 1)
	go func() { exited <- leftover.Wait() }()

	p = startGateway(t, dir, cfg)
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("the leftover ended with %v, want killed", err)
		}
	case <-time.After(5 * time.Second): // real time: a real process
		t.Fatal("the restarted gateway did not kill the leftover agent process")
	}
	if !strings.Contains(p.log(), `"msg":"killed agent processes left running by the last stop","count":1`) {
		t.Errorf("the restart did not log the leftover it killed:\n%s", p.log())
	}
	if !alive(stranger.Process.Pid) {
		t.Error("the restart killed another store's agent process")
	}
}

// TestSecondGatewayOnTheSameStoreRefused: a second gateway started on the
// store a running one uses fails at start with a sentence naming the file and
// the first one's pid, and neither kills the first one's running agent nor
// marks its turn interrupted.
func TestSecondGatewayOnTheSameStoreRefused(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Linux only")
	}
	dir := t.TempDir()
	cfg, first, pids := startOrphanTurn(t, dir, "run-first")
	agent := pids[0]
	defer syscall.Kill(-pgid(t, agent), syscall.SIGKILL)

	second := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(second, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gatewayBin, "-config", second)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), "GATEWAY_LOG_FORMAT=json")
	out, err := runWithin(t, cmd, 30*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("the second gateway: %v, want a failed start\n%s", err, out)
	}
	want := fmt.Sprintf("another gateway is using gateway.db (pid %d)", first.cmd.Process.Pid)
	if !strings.Contains(out, want) {
		t.Errorf("the second gateway's output lacks %q:\n%s", want, out)
	}
	if !alive(agent) {
		t.Fatal("the second start killed the first gateway's running agent")
	}
	if strings.Contains(out, "interrupted") {
		t.Errorf("the second start marked turns interrupted:\n%s", out)
	}
	select {
	case <-first.done:
		t.Fatalf("the first gateway exited:\n%s", first.log())
	default:
	}
}
