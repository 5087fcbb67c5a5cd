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
// closed (or the process dies: the kernel releases it); unlockFile closes
// it and removes the file, so a clean shutdown leaves no lock file behind.
// It fails with *InUseError if another process holds it.
//
// Because the holder removes the file on a clean close, a process may lock
// a file that was just removed (it opened the name before the removal):
// the lock is taken only when the name still refers to the locked file,
// otherwise the name is opened again.
func lockFile(path string) (*os.File, error) {
	name := path + ".lock"
	for attempt := 0; ; attempt++ {
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
		held, herr := f.Stat()
		named, nerr := os.Stat(name)
		if herr == nil && nerr == nil && os.SameFile(held, named) {
			if err := f.Truncate(0); err == nil {
				_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
			}
			return f, nil
		}
		f.Close()
		if attempt == 10 {
			return nil, fmt.Errorf("lock %s: the file keeps being replaced", name)
		}
	}
}

// unlockFile removes the lock file while still holding its lock, then
// closes it (releasing the lock): a clean shutdown leaves no <path>.lock.
func unlockFile(f *os.File) error {
	rmErr := os.Remove(f.Name())
	if errors.Is(rmErr, os.ErrNotExist) {
		rmErr = nil
	}
	return errors.Join(rmErr, f.Close())
}
