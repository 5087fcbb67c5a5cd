package main

import (
	"syscall"
	"time"
)

// threadCPU returns the CPU time (user + system) the calling OS thread has
// used, and true. Call it with the goroutine locked to its thread.
func threadCPU() (time.Duration, bool) {
	const rusageThread = 1 // RUSAGE_THREAD
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
