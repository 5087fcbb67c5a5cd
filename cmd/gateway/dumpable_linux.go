package main

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// hideFromAgents makes the gateway process non-dumpable
// (prctl(PR_SET_DUMPABLE, 0)): its /proc/<pid> files — environ, mem, maps,
// fd — become root's, so an agent running as the gateway's user cannot read
// the gateway's environment (its GATEWAY_* secrets, removed from the
// agent's own environment) or memory, nor ptrace it. Agents are unaffected:
// execve makes each program dumpable again. It does not stop root: an agent
// running as root reads everything (see docs/security.md). Side effects: no
// core dumps, and a debugger of the same user cannot attach.
func hideFromAgents() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", err)
	}
	return nil
}
