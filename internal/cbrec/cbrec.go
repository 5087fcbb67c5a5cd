// Package cbrec owns a test helper: a runner.Callbacks (and
// runner.ActivityReporter) that records every call as a readable line, for
// the tests of runners that run real processes (runner/exec, runner/acp)
// and wait for a callback in real time.
package cbrec

import (
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/turnguard/turnguard/internal/tb"
)

// Recorder records callbacks as readable strings ("start tool shell",
// "done tool shell", `delta "hi"`, "heartbeat", "pause why", "resume",
// "activity") and lets a test wait for one. Safe for concurrent use.
type Recorder struct {
	mu   sync.Mutex
	evs  []string
	cond *sync.Cond
}

// New returns an empty Recorder.
func New() *Recorder {
	r := &Recorder{}
	r.cond = sync.NewCond(&r.mu)
	return r
}

func (r *Recorder) add(s string) {
	r.mu.Lock()
	r.evs = append(r.evs, s)
	r.mu.Unlock()
	r.cond.Broadcast()
}

func (r *Recorder) StepStarted(kind, name string)   { r.add("start " + kind + " " + name) }
func (r *Recorder) StepCompleted(kind, name string) { r.add("done " + kind + " " + name) }
func (r *Recorder) Delta(text string)               { r.add("delta " + strconv.Quote(text)) }
func (r *Recorder) Heartbeat()                      { r.add("heartbeat") }
func (r *Recorder) Pause(reason string)             { r.add("pause " + reason) }
func (r *Recorder) Resume()                         { r.add("resume") }
func (r *Recorder) Activity()                       { r.add("activity") }

// Events returns the calls so far, oldest first.
func (r *Recorder) Events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

// WaitFor blocks until ev has been recorded, or fails t after 10 s of real
// time (a real process is making the calls).
func (r *Recorder) WaitFor(t tb.TB, ev string) {
	t.Helper()
	timer := time.AfterFunc(10*time.Second, r.cond.Broadcast)
	defer timer.Stop()
	deadline := time.Now().Add(10 * time.Second)
	r.mu.Lock()
	defer r.mu.Unlock()
	for !slices.Contains(r.evs, ev) {
		if time.Now().After(deadline) {
			t.Fatalf("event %q never came; got %q", ev, r.evs)
		}
		r.cond.Wait()
	}
}
