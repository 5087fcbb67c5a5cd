// Package testproc owns how tests start a server process that must not
// outlive the test binary: the kernel signals the child when the thread that
// started it ends (the parent-death signal), and that thread is locked to a
// goroutine that waits for the child, so it ends only when the child has
// exited — or when the whole test binary dies, killed or crashed, without
// running its clean-up. (Go may end an unlocked thread at any time.)
package testproc

import (
	"os/exec"
	"runtime"
	"syscall"
)

// Start starts cmd with the parent-death signal sig (kept with any other
// SysProcAttr fields cmd has; Go sets it after a Credential change, which
// would clear it) and waits for it in the background; done is closed once
// it has exited and Wait has returned (cmd.ProcessState is then set).
func Start(cmd *exec.Cmd, sig syscall.Signal) (done <-chan struct{}, err error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = sig
	exited := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the goroutine's end ends its thread, which is
		// harmless once the child has exited.
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}
