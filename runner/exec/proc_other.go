//go:build !linux

package exec

import (
	"errors"
	osexec "os/exec"
	"syscall"
)

// wrap does nothing here: there is no parent-death signal, so a command may
// outlive a gateway that is killed.
func wrap(cmd *osexec.Cmd) {}

// waitExited is not available here: the group's leftovers are not killed
// after a normal exit.
func waitExited(pid int) error { return errors.ErrUnsupported }

// killTagged is not available here: processes that left their group are not
// found.
func killTagged(match func(entry []byte) bool) (int, error) { return 0, errors.ErrUnsupported }

// killGroup sends SIGKILL to process group pgid.
func killGroup(pgid int) { _ = syscall.Kill(-pgid, syscall.SIGKILL) }
