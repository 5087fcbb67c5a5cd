package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// InUseError is the error of Open when another process holds the store's
// lock file (<path>.lock): two gateways on one store would kill each
// other's agents and mark each other's turns interrupted at start.
type InUseError struct {
	Path string // the database path
	PID  int    // the holder's pid as it wrote it, 0 if unknown
}

func (e *InUseError) Error() string {
	who := "unknown pid"
	if e.PID > 0 {
		who = "pid " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("another gateway is using %s (%s); stop it or give this one another store.path", filepath.Base(e.Path), who)
}

// lockFile takes an exclusive, non-blocking flock on path+".lock" and writes
// this process's pid into it. The lock lasts until the returned file is
// closed (or the process dies: the kernel releases it). It fails with
// *InUseError if another process holds it.
func lockFile(path string) (*os.File, error) {
	name := path + ".lock"
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			b := make([]byte, 32)
			n, _ := f.ReadAt(b, 0)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b[:n])))
			return nil, &InUseError{Path: path, PID: pid}
		}
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
