package exec

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

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
