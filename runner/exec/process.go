package exec

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/turnguard/turnguard/config"
)

// Process is a command started in its own process group, so that a signal
// reaches the command and everything it started (children, grandchildren),
// and so that nothing of the group outlives the command: when the command
// exits, what is left of its group is killed with SIGKILL before the command
// is reaped, and Done waits (up to a second) until those processes have
// exited. (On Linux this is race-free: the group is signalled while the
// exited leader still holds its process id. Elsewhere leftovers are not
// killed after a normal exit.) The openai runner's command tools use it too.
//
// Nothing outlives the gateway either (Linux): the group's leader is a small
// sh shim (see shimScript in proc_linux.go) started with a parent-death
// signal. If the gateway dies — SIGKILL, OOM kill, panic — the kernel
// signals the shim, which kills its whole group and every process carrying
// the command's run tag. The command is the shim's child; Pid and the exit
// status are the shim's, which exits with the command's status. A parent-
// death signal follows the thread that started the command: the gateway
// never ends its threads (it does not lock goroutines to threads), so this
// is the process's death.
//
// Run tag (StartTagged): the command and everything it starts inherit the
// environment entry RunTagEnv=tag, which marks them even after they leave the
// group with setsid. When the command exits (normally or not), every process
// carrying the tag is killed too; KillInstance finds a previous gateway's
// leftovers the same way. A process that clears its environment before an
// exec (env -i) drops the tag and escapes this.
type Process struct {
	cmd  *osexec.Cmd
	pid  int
	tag  string // RunTagEnv's value; "" = untagged
	done chan struct{}
	err  error // cmd.Wait's result, set before done is closed

	mu     sync.Mutex
	exited bool // the leader exited; the group must no longer be signalled
}

// Start starts cmd in a new process group under the shim (it sets
// cmd.SysProcAttr.Setpgid and Pdeathsig and rewrites cmd.Path and cmd.Args;
// file descriptor 9 is the shim's, so cmd.ExtraFiles may not reach it) and
// begins waiting for it. It is StartTagged without a tag.
func Start(cmd *osexec.Cmd) (*Process, error) { return StartTagged(cmd, "") }

// StartTagged is Start, with RunTagEnv=tag added to cmd.Env (which must be
// set: see Environ) when tag is not empty. A tag must not contain NUL; build
// it with Tag.
func StartTagged(cmd *osexec.Cmd, tag string) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if tag != "" {
		cmd.Env = append(cmd.Env, RunTagEnv+"="+tag)
	}
	wrap(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, pid: cmd.Process.Pid, tag: tag, done: make(chan struct{})}
	go p.wait()
	return p, nil
}

func (p *Process) wait() {
	if waitExited(p.pid) == nil {
		p.mu.Lock()
		p.exited = true
		p.mu.Unlock()
		// Leftovers of the group. The exited leader is not reaped yet, so
		// its process (and group) id cannot be recycled meanwhile.
		killGroup(p.pid)
	}
	if p.tag != "" {
		// Leftovers that left the group (setsid).
		want := []byte(RunTagEnv + "=" + p.tag)
		_, _ = killTagged(func(e []byte) bool { return bytes.Equal(e, want) })
	}
	p.err = p.cmd.Wait()
	p.mu.Lock()
	p.exited = true
	p.mu.Unlock()
	close(p.done)
}

// Pid returns the command's process id, which is also its process group id.
func (p *Process) Pid() int { return p.pid }

// Signal sends sig to the whole process group. After the command exited it
// does nothing and returns nil.
func (p *Process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return nil
	}
	if err := syscall.Kill(-p.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal process group %d: %w", p.pid, err)
	}
	return nil
}

// Done is closed once the command has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait blocks until the command has exited and returns what cmd.Wait
// returned (nil, an *os/exec.ExitError, or an I/O error).
func (p *Process) Wait() error {
	<-p.done
	return p.err
}

// State returns the exit state; nil before Done is closed.
func (p *Process) State() *os.ProcessState {
	select {
	case <-p.done:
		return p.cmd.ProcessState
	default:
		return nil
	}
}

// RunTagEnv is the environment variable that tags every process of a turn:
// RunTagEnv=<gateway instance>:<run>, see Tag.
const RunTagEnv = "TURNGUARD_RUN"

// processInstance is the instance of a process that was given none: random,
// so a tag never matches another process's commands.
var processInstance = func() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "p" + hex.EncodeToString(b[:])
}()

// InstanceID returns the gateway instance id of a gateway whose state lives
// at storePath (the store file): the same for every restart on that store,
// different for another store. It is the first part of every run tag, so a
// gateway kills only its own leftovers (see KillInstance). An in-memory
// store (":memory:") is no state another process shares: its instance is
// this process's random one, so unrelated gateways never share it.
func InstanceID(storePath string) string {
	if storePath == ":memory:" {
		return processInstance
	}
	p, err := filepath.Abs(storePath)
	if err != nil {
		p = storePath
	}
	if e, err := filepath.EvalSymlinks(p); err == nil {
		p = e
	}
	sum := sha256.Sum256([]byte(p))
	return "s" + hex.EncodeToString(sum[:6])
}

// Tag returns the run tag of run runID of gateway instance: "instance:runID",
// with runID replaced by a hash when it is longer than 128 bytes or holds
// anything but printable ASCII. An empty instance is this process's random
// one.
func Tag(instance, runID string) string {
	if instance == "" {
		instance = processInstance
	}
	plain := len(runID) <= 128
	for i := 0; plain && i < len(runID); i++ {
		plain = runID[i] > ' ' && runID[i] < 0x7f
	}
	if !plain {
		sum := sha256.Sum256([]byte(runID))
		runID = "h" + hex.EncodeToString(sum[:8])
	}
	return instance + ":" + runID
}

// KillInstance sends SIGKILL to every process (but this one) tagged by
// gateway instance — the leftovers of a previous gateway on the same store
// that its shims could not kill — and returns how many there were. The
// gateway calls it at start-up, before it accepts traffic. On systems other
// than Linux it returns errors.ErrUnsupported.
func KillInstance(instance string) (int, error) {
	prefix := []byte(RunTagEnv + "=" + instance + ":")
	n, err := killTagged(func(e []byte) bool { return bytes.HasPrefix(e, prefix) })
	if err != nil {
		return n, fmt.Errorf("kill leftover agent processes: %w", err)
	}
	return n, nil
}

// TurnEnvPrefix starts the variables that describe a turn to an exec agent
// (TURNGUARD_RUN_ID, …).
const TurnEnvPrefix = "TURNGUARD_"

// Environ returns the gateway's environment for a child process, followed by
// extra ("KEY=value" entries, which win over inherited ones). It leaves out
// the gateway's configuration variables (config.EnvPrefix, "GATEWAY_": they
// may carry its secrets, such as the server token or the OpenAI API key) and
// TurnEnvPrefix variables (the runner sets those itself).
func Environ(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, config.EnvPrefix) && !strings.HasPrefix(kv, TurnEnvPrefix) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}
