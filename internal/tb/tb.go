// Package tb is the part of testing.TB that the project's process rigs
// (internal/natstest, internal/pgtest, internal/clusterrig, internal/wsclient,
// internal/fakebot, internal/testwait) use. A test passes its *testing.T or
// *testing.B as always; a command that drives the same rigs outside a test
// (cmd/loadtest -replicas) passes a *Run, which turns a fatal failure into an
// error returned by Do and runs the clean-ups at the end.
package tb

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
)

// TB is what the rigs call on a test. testing.TB satisfies it.
type TB interface {
	Helper()
	Name() string
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Failed() bool
	Cleanup(func())
	TempDir() string
}

var _ TB = testing.TB(nil)

// Run is a TB for a command: Logf writes to Log (default stderr), Errorf
// marks the run failed, Fatal and Skipf stop the calling goroutine's work
// by panicking with a value Do recovers; so they may be called only from
// the goroutine running Do's function, as testing.T's FailNow. Safe for
// concurrent use otherwise.
type Run struct {
	name string
	log  func(string)

	mu       sync.Mutex
	failed   bool
	errs     []string
	cleanups []func()
}

// stop is the panic value of Fatal and Skipf.
type stop struct{ msg string }

// Do runs f with a Run named name, then its clean-ups (last registered
// first, as testing does). It returns an error carrying every Errorf, Fatal
// and Skipf message when f failed or stopped; a panic other than Fatal's is
// not recovered (after the clean-ups ran).
func Do(name string, logf func(string), f func(r *Run) error) (err error) {
	if logf == nil {
		logf = func(s string) { fmt.Fprintln(os.Stderr, s) }
	}
	r := &Run{name: name, log: logf}
	defer func() {
		p := recover()
		r.runCleanups()
		if p != nil {
			s, ok := p.(stop)
			if !ok {
				panic(p)
			}
			r.mu.Lock()
			r.errs = append(r.errs, s.msg)
			r.mu.Unlock()
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.errs) > 0 {
			err = errors.Join(err, errors.New(joinLines(r.errs)))
		}
	}()
	return f(r)
}

func joinLines(s []string) string {
	out := s[0]
	for _, l := range s[1:] {
		out += "\n" + l
	}
	return out
}

func (r *Run) runCleanups() {
	for {
		r.mu.Lock()
		n := len(r.cleanups)
		if n == 0 {
			r.mu.Unlock()
			return
		}
		f := r.cleanups[n-1]
		r.cleanups = r.cleanups[:n-1]
		r.mu.Unlock()
		f()
	}
}

// Helper does nothing.
func (r *Run) Helper() {}

// Name is the name given to Do.
func (r *Run) Name() string { return r.name }

// Logf logs a line.
func (r *Run) Logf(format string, args ...any) { r.log(fmt.Sprintf(format, args...)) }

// Errorf logs and marks the run failed.
func (r *Run) Errorf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.failed = true
	r.errs = append(r.errs, msg)
	r.mu.Unlock()
}

// Fatal marks the run failed and stops it.
func (r *Run) Fatal(args ...any) { r.fail(fmt.Sprint(args...)) }

// Fatalf marks the run failed and stops it.
func (r *Run) Fatalf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...)) }

// Skipf stops the run: a command has nothing to skip to, so it is a failure.
func (r *Run) Skipf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...)) }

func (r *Run) fail(msg string) {
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
	panic(stop{msg})
}

// Failed reports whether Errorf, Fatal or Skipf was called.
func (r *Run) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// Cleanup registers f to run when Do returns.
func (r *Run) Cleanup(f func()) {
	r.mu.Lock()
	r.cleanups = append(r.cleanups, f)
	r.mu.Unlock()
}

// TempDir makes a new directory, removed when Do returns.
func (r *Run) TempDir() string {
	dir, err := os.MkdirTemp("", "turnguard-"+r.name+"-")
	if err != nil {
		r.Fatalf("tb: temporary directory: %v", err)
	}
	r.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
