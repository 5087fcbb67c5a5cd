package exec

import (
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"strings"
	"sync"
	"syscall"

	"github.com/turnguard/turnguard/config"
)

// Process is a command started in its own process group, so that a signal
// reaches the command and everything it started (children, grandchildren),
// and so that nothing of the group outlives the command: when the command
// exits, what is left of its group is killed with SIGKILL before the command
// is reaped. (On Linux this is race-free: the group is signalled while the
// exited leader still holds its process id. Elsewhere leftovers are not
// killed after a normal exit.) The openai runner's command tools use it too.
type Process struct {
	cmd  *osexec.Cmd
	pid  int
	done chan struct{}
	err  error // cmd.Wait's result, set before done is closed

	mu     sync.Mutex
	exited bool // the leader exited; the group must no longer be signalled
}

// Start starts cmd in a new process group (it sets cmd.SysProcAttr.Setpgid)
// and begins waiting for it.
func Start(cmd *osexec.Cmd) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{})}
	go p.wait()
	return p, nil
}

func (p *Process) wait() {
	if waitExited(p.pid) == nil {
		p.mu.Lock()
		p.exited = true
		_ = syscall.Kill(-p.pid, syscall.SIGKILL) // leftovers of the group
		p.mu.Unlock()
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
