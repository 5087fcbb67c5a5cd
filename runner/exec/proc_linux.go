package exec

import (
	"bytes"
	"errors"
	"os"
	osexec "os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// shimScript is the group leader every command runs under on Linux (see
// Start). It is started with a parent-death signal (deathSignal), which the
// kernel delivers to it — and only to it — when the gateway dies, however it
// dies. Its trap then kills every process carrying the command's run tag
// (also those that left the group with setsid) and its whole process group.
// It traps SIGTERM with a no-op, so an abort's SIGTERM to the group reaches
// the command, which has its grace, while the shim waits on; a trap (not an
// ignore) because an ignored signal would stay ignored in the command. The
// command runs in the background so that `wait` — which a trapped signal
// interrupts — can be used; its stdin is passed through fd 9 because sh gives
// a background command /dev/null. sh also makes a background command ignore
// SIGINT and SIGQUIT, and the command's children inherit that, which breaks
// an agent that cancels its own tools with SIGINT: where env has
// --default-signal (GNU coreutils 8.31 or later), wrap runs the command
// through it, which sets both back to their default. The trap acts only when the
// shim's parent has changed (the kernel reparents before it signals), so a
// SIGUSR1 the command sends its own group does nothing. Without /bin/sh
// (a minimal container) commands run without the shim. The shim exits with the
// command's status: its exit code, or the signal that killed it, raised again.
// A wait that the TERM trap interrupted returns 143, not the command's
// status; if the command ended meanwhile (kill -0 fails), the wait after the
// loop reports its real status — or 127, "unknown", when the last wait in
// the loop already reported it.
const shimScript = `m="` + RunTagEnv + `=$` + RunTagEnv + `"
trap 'read -r _ _ _ pp _ </proc/$$/stat
if [ "$pp" != "$PPID" ]; then
trap "" USR1
if [ -n "$` + RunTagEnv + `" ]; then
	for f in $(grep -lsxzF -e "$m" /proc/[0-9]*/environ); do
		p=${f#/proc/}; p=${p%/environ}
		[ "$p" = "$$" ] || kill -s KILL "$p" 2>/dev/null
	done
fi
kill -s KILL 0
fi' USR1
trap : TERM
exec 9<&0
"$@" 0<&9 9<&- &
pid=$!
exec 9<&-
while :; do
	wait "$pid" 2>/dev/null; st=$?
	kill -0 "$pid" 2>/dev/null || break
done
wait "$pid" 2>/dev/null; s=$?
[ "$s" = 127 ] || st=$s
if [ "$st" -gt 128 ]; then
	trap - TERM USR1
	kill -s "$((st - 128))" "$$" 2>/dev/null
fi
exit "$st"`

// haveSh reports whether /bin/sh exists.
var haveSh = sync.OnceValue(func() bool {
	_, err := os.Stat("/bin/sh")
	return err == nil
})

// envDefaultSignal returns the path of an env that supports
// --default-signal (GNU coreutils 8.31 or later), or "" (checked once, by
// running it).
var envDefaultSignal = sync.OnceValue(func() string {
	for _, env := range []string{"/usr/bin/env", "/bin/env"} {
		if osexec.Command(env, "--default-signal=INT,QUIT", "--", "/bin/sh", "-c", ":").Run() == nil {
			return env
		}
	}
	return ""
})

// deathSignal is the signal the shim gets when the gateway dies.
const deathSignal = syscall.SIGUSR1

// shimArg0 names the shim in ps output.
const shimArg0 = "turnguard-shim"

// wrap makes cmd run under the shim: /bin/sh -c shimScript turnguard-shim
// <command path> <args…>. The command's own argv[0] becomes its path.
func wrap(cmd *osexec.Cmd) {
	if cmd.Err != nil || cmd.Path == "" || !haveSh() {
		return // Start reports the error
	}
	args := []string{"/bin/sh", "-c", shimScript, shimArg0}
	// env would take a command path with "=" for a variable assignment.
	if env := envDefaultSignal(); env != "" && !strings.Contains(cmd.Path, "=") {
		args = append(args, env, "--default-signal=INT,QUIT", "--")
	}
	args = append(append(args, cmd.Path), cmd.Args[1:]...)
	cmd.Path, cmd.Args = "/bin/sh", args
	cmd.SysProcAttr.Pdeathsig = deathSignal
}

// waitExited blocks until process pid has exited, without reaping it, so its
// process id (and group id) stays reserved until Wait reaps it.
func waitExited(pid int) error {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// exitWait bounds how long killGroup and killTagged wait for the processes
// they killed to exit.
const exitWait = time.Second

// killGroup sends SIGKILL to process group pgid and waits (at most
// exitWait) until the processes that were in it have exited, so that when a
// Process is done nothing of its group still runs. (A SIGKILL takes effect
// when its target next runs; the shim, killed with the group, may be reaped
// before the command is gone.)
func killGroup(pgid int) {
	fds := pidfds(func(pid string) bool { return pgrpOf(pid) == pgid })
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	waitPidfds(fds)
}

// pgrpOf returns the process group of process pid, or -1.
func pgrpOf(pid string) int {
	n, err := strconv.Atoi(pid)
	if err != nil {
		return -1
	}
	g, err := syscall.Getpgid(n)
	if err != nil {
		return -1
	}
	return g
}

// killTagged sends SIGKILL to every process but this one whose environment
// has an entry for which match is true (entries are "KEY=value"), waits (at
// most exitWait) until they have exited, and returns how many it signalled.
// Processes whose environment cannot be read (another user's) are skipped.
func killTagged(match func(entry []byte) bool) (int, error) {
	fds := pidfds(func(pid string) bool {
		env, err := os.ReadFile("/proc/" + pid + "/environ")
		return err == nil && hasEntry(env, match)
	})
	n := 0
	for _, fd := range fds {
		if unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
			n++
		}
	}
	waitPidfds(fds)
	return n, nil
}

// pidfds returns a pidfd of every process but this one for which match is
// true. match is asked again once the pidfd is open, so the pidfd holds a
// process that matched: a recycled process id is never signalled or waited
// for. Processes without a
// pidfd (gone, or a kernel before 5.3) are skipped.
func pidfds(match func(pid string) bool) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var fds []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if !match(e.Name()) {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		if match(e.Name()) { // still: the pidfd holds the process that matched
			fds = append(fds, fd)
		} else {
			unix.Close(fd)
		}
	}
	return fds
}

// waitPidfds waits until each process has exited (its pidfd is readable),
// for at most exitWait in all, and closes the pidfds.
func waitPidfds(fds []int) {
	deadline := time.Now().Add(exitWait)
	for _, fd := range fds {
		for {
			ms := int(time.Until(deadline).Milliseconds())
			if ms <= 0 {
				break
			}
			_, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, ms)
			if !errors.Is(err, syscall.EINTR) {
				break
			}
		}
		unix.Close(fd)
	}
}

// hasEntry reports whether a NUL-separated environment block has an entry
// for which match is true.
func hasEntry(env []byte, match func([]byte) bool) bool {
	for len(env) > 0 {
		entry, rest, _ := bytes.Cut(env, []byte{0})
		if match(entry) {
			return true
		}
		env = rest
	}
	return false
}
