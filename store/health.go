package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrUnwritable: the store cannot write now. Health returns an
// *UnwritableError that wraps it.
var ErrUnwritable = errors.New("store cannot write")

// UnwritableError says why and since when the store cannot write.
type UnwritableError struct {
	Reason string    // for people: "the disk is full", …
	Since  time.Time // the first failure of the episode
	Err    error     // the failure (for logs)
}

func (e *UnwritableError) Error() string {
	return fmt.Sprintf("store cannot write since %s: %s", e.Since.UTC().Format(time.RFC3339), e.Reason)
}

// Unwrap makes errors.Is(err, ErrUnwritable) and the underlying error
// reachable.
func (e *UnwritableError) Unwrap() []error { return []error{ErrUnwritable, e.Err} }

// Health returns nil while the store can write, and an *UnwritableError
// (wrapping ErrUnwritable) from a write that failed for the state of the
// storage — SQLite: the disk full, I/O errors, the file read-only, locked
// by another process, corrupt or deleted; PostgreSQL: the server down or
// unreachable, out of disk, read-only — until a write (a queued batch or
// the writer's probe, every few seconds) succeeds again. It never does I/O.
func (r *EventRecorder) Health() error {
	r.healthMu.Lock()
	defer r.healthMu.Unlock()
	if r.unwrit == nil {
		return nil
	}
	cp := *r.unwrit
	return &cp
}

// setHealth records the outcome of a write by the writer: nil ends an
// unwritable episode, an error starts one (or continues it).
func (r *EventRecorder) setHealth(err error) {
	r.healthMu.Lock()
	defer r.healthMu.Unlock()
	prev := r.unwrit
	if err == nil {
		if prev == nil || r.held {
			return // held (SQLite: writes to a deleted file succeed): only Release ends it
		}
		r.unwrit = nil
		r.log.Warn("store: writing again; new turns are accepted", "unwritable_for", time.Since(prev.Since).Round(time.Millisecond).String())
		if r.onHealth != nil {
			r.onHealth(nil)
		}
		return
	}
	if prev != nil {
		if r.held {
			return
		}
		prev.Err = err
		if r := r.w.Classify(err).Reason; r != prev.Reason {
			prev.Reason = r
		}
		return
	}
	r.unwrit = &UnwritableError{Reason: r.w.Classify(err).Reason, Since: time.Now(), Err: err}
	r.log.Error("store: cannot write; readiness fails and new turns are refused until it can",
		"reason", r.unwrit.Reason, "err", err)
	if r.onHealth != nil {
		cp := *r.unwrit
		r.onHealth(&cp)
	}
}

// NoteWrite is called by the backend with the outcome of a synchronous
// write (outbox, queue, MarkInterrupted): a failure for the state of the
// storage starts an unwritable episode and has the writer probe until it
// ends.
func (c RecorderControl) NoteWrite(err error) { c.r.noteWrite(err) }

// SetHealth records the outcome of a write by the backend's writer
// goroutine (a probe after a mend): nil ends an unwritable episode that is
// not held, an error starts or continues one.
func (c RecorderControl) SetHealth(err error) { c.r.setHealth(err) }

// Hold makes the store unwritable for err until Release, whatever writes
// do meanwhile (SQLite: the file was deleted, and writes to the unlinked
// file succeed).
func (c RecorderControl) Hold(err error) {
	r := c.r
	r.healthMu.Lock()
	r.held = true
	r.healthMu.Unlock()
	r.setHealth(err)
}

// Release ends a Hold; the next successful write ends the episode.
func (c RecorderControl) Release() {
	r := c.r
	r.healthMu.Lock()
	defer r.healthMu.Unlock()
	r.held = false
}

// noteWrite: see RecorderControl.NoteWrite.
func (r *EventRecorder) noteWrite(err error) {
	if err == nil || !r.w.Classify(err).Storage {
		return
	}
	r.setHealth(err)
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// maintain runs on the writer goroutine between batches: it has the
// backend check its storage and, while the store cannot write, probes.
func (r *EventRecorder) maintain() {
	if r.closed.Load() || !r.w.Check() {
		return
	}
	if r.Health() != nil {
		r.setHealth(r.w.Probe(context.Background()))
	}
}
