package store

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnguard/turnguard/event"
)

// The event recorder is shared by every backend: the lock-free queue that
// Handle fills on the publishing goroutine, the spill that keeps turn
// starts and endings past a full queue, the writer goroutine that drains it
// in batches (retrying a batch that failed for the state of the storage,
// one event at a time when one event's content is at fault), Flush, the
// counters, write health and the pruner's timer. A backend supplies only
// the SQL, through BatchWriter; it embeds *EventRecorder (Handle, Flush,
// Stats, Dropped, QueueDepth and Health are its methods) and drives it
// through the RecorderControl that NewEventRecorder returns with it.

// BatchWriter is a backend's side of the event recorder.
type BatchWriter interface {
	// WriteBatch records evs, in order and every one valid (a run id,
	// unless a SessionReset, a session key and a known kind), in one
	// transaction and commits it; for the endings RecorderControl.ToOutbox
	// selects it writes their terminal messages to the outbox in that
	// transaction, committed durably. It is called on the writer
	// goroutine only, so calls never overlap.
	WriteBatch(ctx context.Context, evs []event.Event) error
	// Classify says what an error of this backend is.
	Classify(err error) Failure
	// Probe tries a small real write; the writer calls it while the store
	// cannot write, to learn when it can again.
	Probe(ctx context.Context) error
	// Check is called on the writer goroutine every few seconds and after
	// a failed batch's backoff: it reports whether the storage is the one
	// the store opened and, if not, mends it (SQLite: a deleted file is
	// recreated). A backend with nothing to check returns true.
	Check() bool
}

// Failure is what Classify says of an error.
type Failure struct {
	// EventSpecific: the content of an event (a constraint, a value too
	// big), not the state of the storage; a batch that failed so is
	// retried one event at a time and the bad event is counted failed.
	EventSpecific bool
	// Storage: the storage cannot take writes (a full disk, I/O errors, a
	// database that is down or read-only). A synchronous write that fails
	// so makes the store unwritable (Health) until a write succeeds. (A
	// batch that fails for any reason but its content does.)
	Storage bool
	// Reason is the short cause for people: "the disk is full".
	Reason string
}

// RecorderOptions tune an EventRecorder.
type RecorderOptions struct {
	QueueSize int          // events queued before step events are shed; 0 means 4096
	BatchSize int          // events per transaction; 0 means 256
	Logger    *slog.Logger // nil means slog.Default()
	// OnHealth, OutboxChannels and OnOutbox are as in Options.
	OnHealth       func(err error)
	OutboxChannels []string
	OnOutbox       func(channel string)
	// BeforeBatch, when set (tests only), is called by the writer
	// goroutine before it writes each batch.
	BeforeBatch func()
	// Linger, when positive, is how long the writer waits for more events
	// after taking a batch smaller than BatchSize, before writing it: fewer,
	// fuller batches for a store whose recorder writes only what other
	// writes already made durable (a shared PostgreSQL's claimed turns),
	// where a batch's cost is its statements and commit, not its delay.
	Linger time.Duration
}

// EventRecorder is the recording half of a store (see Handle). Its zero
// value is not usable: make one with NewEventRecorder.
type EventRecorder struct {
	w   BatchWriter
	log *slog.Logger

	ring        *evQueue      // the queue, QueueSize events; lock-free (eventqueue.go)
	qmu         sync.Mutex    // guards spill
	spill       []event.Event // never-shed events queued after the ring filled, in order
	spillN      atomic.Int64  // len(spill), read without qmu: while 0, Handle takes no lock
	wake        chan struct{} // 1-buffered: the queue has something
	batchSize   int
	linger      time.Duration // RecorderOptions.Linger
	beforeBatch func()
	dropped     atomic.Uint64
	spilled     atomic.Uint64
	failed      atomic.Uint64
	written     atomic.Uint64
	closed      atomic.Bool
	stop        chan struct{} // closed by Stop: drain the queue and exit
	done        chan struct{} // closed when the writer has exited
	started     bool

	mu        sync.Mutex
	processed uint64        // written + failed, guarded by mu
	progress  chan struct{} // closed and replaced after each batch, guarded by mu

	outboxChannels map[string]bool      // RecorderOptions.OutboxChannels
	onOutbox       func(channel string) // RecorderOptions.OnOutbox

	// Health (health.go).
	healthMu sync.Mutex
	unwrit   *UnwritableError // nil while writes succeed, guarded by healthMu
	held     bool             // Hold: only Release ends the episode, guarded by healthMu
	onHealth func(error)
	poke     chan struct{} // 1-buffered: a synchronous write failed; probe soon

	pruneDone chan struct{} // closed when the pruner has exited; nil without one

	closeBy atomic.Int64 // Unix nanoseconds after which Stop stops writing (CloseDrainLimit)
}

// RecorderControl is the backend's handle on its EventRecorder: what the
// backend, and not the store's users, calls.
type RecorderControl struct{ r *EventRecorder }

// NewEventRecorder makes the recorder of a backend that writes through w.
// Nothing runs until RecorderControl.Start. It refuses an empty outbox
// channel name (ErrInvalid).
func NewEventRecorder(w BatchWriter, o RecorderOptions) (*EventRecorder, RecorderControl, error) {
	if o.QueueSize <= 0 {
		o.QueueSize = defaultQueueSize
	}
	if o.BatchSize <= 0 {
		o.BatchSize = defaultBatchSize
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	r := &EventRecorder{
		w: w, log: o.Logger,
		ring: newEvQueue(o.QueueSize), wake: make(chan struct{}, 1), batchSize: o.BatchSize, linger: o.Linger,
		beforeBatch: o.BeforeBatch, onHealth: o.OnHealth, poke: make(chan struct{}, 1), onOutbox: o.OnOutbox,
		stop: make(chan struct{}), done: make(chan struct{}), progress: make(chan struct{}),
	}
	for _, ch := range o.OutboxChannels {
		if ch == "" {
			return nil, RecorderControl{}, fmt.Errorf("empty outbox channel: %w", ErrInvalid)
		}
		if r.outboxChannels == nil {
			r.outboxChannels = map[string]bool{}
		}
		r.outboxChannels[ch] = true
	}
	return r, RecorderControl{r}, nil
}

// Start starts the writer goroutine.
func (c RecorderControl) Start() {
	c.r.started = true
	go c.r.run()
}

// StartPruner starts a goroutine that calls prune every interval until
// Stop, skipping while the store cannot write (deleting needs a write too;
// it resumes afterwards). Call it at most once, after Start.
func (c RecorderControl) StartPruner(interval time.Duration, prune func(ctx context.Context, now time.Time) (PruneStats, error)) {
	r := c.r
	r.pruneDone = make(chan struct{})
	go func() {
		defer close(r.pruneDone)
		t := time.NewTimer(interval)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-t.C:
			}
			if r.Health() == nil {
				ps, err := prune(context.Background(), time.Now())
				if err != nil {
					r.log.Error("store: pruning failed; retrying at the next interval", "err", err)
				} else if ps != (PruneStats{}) {
					r.log.Info("store: pruned", "messages", ps.Messages, "turns", ps.Turns, "sessions", ps.Sessions,
						"journal", ps.Journal, "outbox", ps.Outbox, "approvals", ps.Approvals)
				}
			}
			t.Reset(interval)
		}
	}()
}

// Stop refuses further events (Handle drops and counts them), writes what
// was queued — each queued batch gets one more attempt until
// CloseDrainLimit, see Close — and stops the writer and the pruner. The
// backend closes its database after it. Call it once.
func (c RecorderControl) Stop() {
	r := c.r
	r.closed.Store(true)
	r.closeBy.Store(time.Now().Add(CloseDrainLimit).UnixNano())
	close(r.stop)
	if r.started {
		<-r.done
	}
	if r.pruneDone != nil {
		<-r.pruneDone
	}
}

// Closed reports whether Stop has been called: the backend's methods
// return ErrClosed then.
func (c RecorderControl) Closed() bool { return c.r.closed.Load() }

// ToOutbox reports whether ev ends a turn whose terminal messages the
// store writes to the outbox with the end (Options.OutboxChannels).
func (c RecorderControl) ToOutbox(ev *event.Event) bool { return c.r.toOutbox(ev) }

func (r *EventRecorder) toOutbox(ev *event.Event) bool {
	return (ev.Kind == event.Aborted || ev.Kind == event.Finished) && ev.ChatRef != "" && r.outboxChannels[ev.Channel]
}

// AnyToOutbox reports whether one of evs is selected by ToOutbox.
func (c RecorderControl) AnyToOutbox(evs []event.Event) bool {
	for i := range evs {
		if c.r.toOutbox(&evs[i]) {
			return true
		}
	}
	return false
}

// Handle records ev. It is an event.Handler for bus.Subscribe("", …): it is
// called on the publishing goroutine, so it never blocks, never does I/O
// and never fails. It appends ev to the writer's queue. Delta events are
// ignored (the reply is recorded whole when the turn ends).
//
// Beyond QueueSize queued events (a slow or failing disk), events
// are shed by kind:
//   - TurnStarted, Aborted, Finished and ForceFinalized are never shed:
//     they wait beyond the queue size (counted in Spilled). A lost ending
//     would leave its turn "running" and the next start would tell the user
//     a false "interrupted"; a lost start would let an ending create the
//     turn without its question. They are bounded by the turns that can
//     run: while the store cannot write, new turns are refused (see
//     Health). SessionReset (/new, which is not a turn and is not refused)
//     is kept too, until another QueueSize events have spilled.
//     ApprovalRequested and ApprovalResolved are never shed either: a lost
//     request leaves no record of the question, a lost resolution records
//     an answered question as cancelled. A turn waits on one question at
//     a time, so they too are bounded by the turns that can run.
//   - StepStarted, StepCompleted, Paused, Resumed, Progress and Recovered
//     are shed and counted (Dropped): losing them only makes the recorded
//     current step, the journal and the stall history less detailed.
//
// Events are written in the order Handle received them, whatever was shed
// (calls that overlap are in some order; one publisher's, such as one run's,
// in its own). Handle takes no lock while nothing has spilled: the queue is a
// lock-free ring (eventqueue.go), so publishers of different runs do not wait for
// each other or for the writer. After Close every event is dropped and
// counted.
//
// The writer goroutine applies queued events in order, in batches of up to
// BatchSize per transaction (with a Linger, a smaller batch waits that long
// for more):
//   - TurnStarted creates the session if new, the turn (state running) and
//     the user's message in the history.
//   - StepStarted / StepCompleted update the turn's current and last step.
//   - Aborted and Finished end the turn (state aborted / finished, stop
//     reason, end time) and append the assistant message described on
//     Message; they create the turn if its TurnStarted was lost. Only the
//     first ending of a turn counts. For a turn of an outbox channel
//     (Options.OutboxChannels) the first ending also writes its terminal
//     messages to the outbox, in the same transaction (committed durably);
//     Options.OnOutbox is called after the commit.
//   - ApprovalRequested records the approval, pending; ApprovalResolved
//     its outcome (only while pending); Aborted and Finished also cancel
//     the run's approvals still pending (approval.go).
//   - Every event except Delta, including the above, is journaled.
//
// A batch that fails for the state of the disk or the file (full, I/O
// error, read-only, locked) is kept and retried with backoff until it is
// written; meanwhile Health reports the store as unwritable. An event
// without a run id or session key is counted as failed.
func (r *EventRecorder) Handle(ev event.Event) {
	if ev.Kind == event.Delta {
		return
	}
	if r.closed.Load() {
		r.dropped.Add(1)
		return
	}
	ev.Locals = nil // the run's subscriber state is not the store's to keep alive
	// Lock-free unless an event that is never shed meets a full ring or
	// what spilled: nothing spilled and the ring has room, or the event is
	// shed.
	if r.spillN.Load() != 0 || !r.ring.push(&ev) {
		if !neverShed(ev.Kind) || !r.enqueueSlow(&ev) {
			r.dropped.Add(1)
			return
		}
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// enqueueSlow queues ev, an event that is never shed, when the ring was
// full or events have spilled (a slow or failing disk): behind what
// spilled, so the order holds, or into the ring if the writer has made room
// and nothing spilled. It reports false when ev is shed all the same (a
// SessionReset past QueueSize spilled events).
//
// A push that checked spillN before another publisher spilled may still land
// in the ring ahead of the spilled events: the two calls overlapped, so either
// order is the order Handle received them in. One publisher's (one run's)
// next event sees the spill and queues behind it.
func (r *EventRecorder) enqueueSlow(ev *event.Event) bool {
	r.qmu.Lock()
	defer r.qmu.Unlock()
	switch {
	case len(r.spill) == 0 && r.ring.push(ev):
	case neverShed(ev.Kind) && (ev.Kind != event.SessionReset || len(r.spill) < int(r.ring.n)):
		r.spill = append(r.spill, *ev)
		r.spillN.Store(int64(len(r.spill)))
		r.spilled.Add(1)
	default:
		return false
	}
	return true
}

// neverShed reports whether events of kind k are kept however long the
// queue is.
func neverShed(k event.Kind) bool {
	switch k {
	case event.TurnStarted, event.Aborted, event.Finished, event.ForceFinalized, event.SessionReset,
		event.ApprovalRequested, event.ApprovalResolved:
		return true
	}
	return false
}

// Dropped reports how many events Handle shed because the queue was full
// (or refused because the store was closed).
func (r *EventRecorder) Dropped() uint64 { return r.dropped.Load() }

// QueueDepth reports how many events are waiting for the writer.
func (r *EventRecorder) QueueDepth() int {
	return r.ring.len() + int(r.spillN.Load())
}

// enqueued reports how many events Handle has accepted: every position of
// the ring ever claimed and every event that spilled.
func (r *EventRecorder) enqueued() uint64 { return r.ring.claimed() + r.spilled.Load() }

// Stats returns the recorder's counters.
func (r *EventRecorder) Stats() Stats {
	return Stats{
		Enqueued: r.enqueued(), Written: r.written.Load(), Dropped: r.dropped.Load(),
		Spilled: r.spilled.Load(), Failed: r.failed.Load(), QueueDepth: r.QueueDepth(),
	}
}

// Flush returns nil once every event that Handle accepted before the call
// has been written or counted as failed. It returns ctx's error if ctx ends
// first (as it will while the store cannot write), and ErrClosed if the
// store is closed before then (Close itself writes what was queued).
func (r *EventRecorder) Flush(ctx context.Context) error {
	target := r.enqueued()
	for {
		r.mu.Lock()
		reached, wait := r.processed >= target, r.progress
		r.mu.Unlock()
		if reached {
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return fmt.Errorf("flush store: %w", ctx.Err())
		case <-r.done:
			r.mu.Lock()
			reached = r.processed >= target
			r.mu.Unlock()
			if reached {
				return nil
			}
			return fmt.Errorf("flush store: %w", ErrClosed)
		}
	}
}

// run is the writer goroutine: it writes the queue, checks the file and,
// while the store cannot write, probes it.
func (r *EventRecorder) run() {
	defer close(r.done)
	check := time.NewTimer(checkInterval)
	defer check.Stop()
	batch := make([]event.Event, 0, r.batchSize)
	stopping := false
	for {
		if stopping && time.Now().UnixNano() > r.closeBy.Load() {
			r.abandonQueue()
			return
		}
		if batch = r.take(batch); len(batch) > 0 {
			if r.linger > 0 && !stopping {
				batch = r.fill(batch, &stopping)
			}
			r.writeUntilDone(batch, &stopping)
			clear(batch) // do not keep the texts alive until the slots are reused
			batch = batch[:0]
			select {
			case <-check.C:
				r.maintain()
				check.Reset(checkInterval)
			default:
			}
			continue
		}
		if stopping {
			return
		}
		select {
		case <-r.wake:
		case <-r.stop:
			stopping = true
		case <-r.poke:
			r.maintain()
		case <-check.C:
			r.maintain()
			check.Reset(checkInterval)
		}
	}
}

// fill waits up to the linger for more queued events after batch's, until
// the batch is full, Stop is called (stopping set) or events spill beyond
// the queue (those come in take's order, next).
func (r *EventRecorder) fill(batch []event.Event, stopping *bool) []event.Event {
	t := time.NewTimer(r.linger)
	defer t.Stop()
	for len(batch) < r.batchSize && r.spillN.Load() == 0 {
		select {
		case <-r.wake:
			batch = r.ring.pop(batch, r.batchSize-len(batch))
		case <-r.stop:
			*stopping = true
			return batch
		case <-t.C:
			return batch
		}
	}
	return batch
}

// abandonQueue counts every queued event failed, without writing it: Close
// ran out of time (CloseDrainLimit).
func (r *EventRecorder) abandonQueue() {
	var n int
	var scratch []event.Event
	for {
		scratch = r.ring.pop(scratch[:0], 256)
		if len(scratch) == 0 {
			break
		}
		n += len(scratch)
		clear(scratch)
	}
	r.qmu.Lock()
	n += len(r.spill)
	clear(r.spill)
	r.spill = nil
	r.spillN.Store(0)
	r.qmu.Unlock()
	if n > 0 {
		r.log.Error("store: closing took too long; queued events not recorded", "count", n, "limit", CloseDrainLimit)
		r.counted(0, uint64(n))
	}
}

// take moves up to a batch of queued events into batch, in the order
// Handle received them: the ring first, then what spilled past it.
func (r *EventRecorder) take(batch []event.Event) []event.Event {
	if batch = r.ring.pop(batch, r.batchSize); len(batch) > 0 || r.spillN.Load() == 0 {
		return batch
	}
	r.qmu.Lock()
	defer r.qmu.Unlock()
	if batch = r.ring.pop(batch, r.batchSize); len(batch) > 0 {
		return batch // pushed after the first look: they come first (see enqueueSlow)
	}
	n := min(len(r.spill), r.batchSize)
	batch = append(batch, r.spill[:n]...)
	clear(r.spill[:n])
	if r.spill = r.spill[n:]; len(r.spill) == 0 {
		r.spill = nil
	}
	r.spillN.Store(int64(len(r.spill)))
	return batch
}

// writeUntilDone writes batch, retrying with backoff while it fails for
// the state of the disk or the file. Once the store is closing it tries
// once more and counts what still fails as failed.
func (r *EventRecorder) writeUntilDone(batch []event.Event, stopping *bool) {
	backoff := firstRetry
	for {
		rest, err := r.write(batch)
		if err == nil {
			r.setHealth(nil)
			return
		}
		batch = rest // what was written or counted failed is done
		r.setHealth(err)
		if *stopping {
			r.log.Error("store: closing while the store cannot write; events not recorded",
				"count", len(batch), "first_run", batch[0].RunID, "err", err)
			r.counted(0, uint64(len(batch)))
			return
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-r.stop:
			t.Stop()
			*stopping = true
		}
		backoff = min(2*backoff, maxRetry)
		r.w.Check()
	}
}

// write applies batch in one transaction. Events that cannot be valid are
// counted as failed without touching the database. If the transaction fails
// because of one event's content (a constraint, a value too big), each
// event is retried in its own transaction so that the bad one costs only
// itself. Any other failure (disk full, I/O error, a lock held past the
// busy timeout) — of the batch or of one of those retries — is returned
// with rest, the events of batch neither written nor counted failed (in
// order, never empty): the caller retries them.
func (r *EventRecorder) write(batch []event.Event) (rest []event.Event, err error) {
	if r.beforeBatch != nil {
		r.beforeBatch()
	}
	ctx := context.Background()
	var ok, bad uint64
	valid := batch
	for i := range batch {
		if err := validEvent(&batch[i]); err != nil {
			valid = nil
			break
		}
	}
	if valid == nil { // rare: copy the valid ones out, log the first bad one
		var firstErr error
		for i := range batch {
			if err := validEvent(&batch[i]); err != nil {
				if bad++; firstErr == nil {
					firstErr = fmt.Errorf("run %q, %s: %w", batch[i].RunID, batch[i].Kind, err)
				}
				continue
			}
			valid = append(valid, batch[i])
		}
		r.log.Error("store: invalid events not recorded", "count", bad, "first", firstErr)
	}
	if len(valid) > 0 {
		err = r.w.WriteBatch(ctx, valid)
	}
	switch {
	case err == nil:
		ok += uint64(len(valid))
		r.committed(valid)
	case !r.w.Classify(err).EventSpecific:
		r.counted(0, bad)
		return valid, fmt.Errorf("write %d events: %w", len(valid), err)
	default:
		for i := range valid {
			ev := &valid[i]
			one := valid[i : i+1]
			err := r.w.WriteBatch(ctx, one)
			switch {
			case err == nil:
				ok++
				r.committed(one)
			case r.w.Classify(err).EventSpecific:
				bad++
				r.log.Error("store: event not recorded", "run", ev.RunID, "kind", ev.Kind.String(), "err", err)
			default: // the disk, not the event: keep the rest for a retry
				r.counted(ok, bad)
				return valid[i:], fmt.Errorf("write event %d of %d: %w", i+1, len(valid), err)
			}
		}
	}
	r.counted(ok, bad)
	return nil, nil
}

// committed calls RecorderOptions.OnOutbox once for each outbox channel
// whose turn endings evs (just committed) hold.
func (r *EventRecorder) committed(evs []event.Event) {
	if r.onOutbox == nil || len(r.outboxChannels) == 0 {
		return
	}
	var told []string
	for i := range evs {
		if ch := evs[i].Channel; r.toOutbox(&evs[i]) && !slices.Contains(told, ch) {
			told = append(told, ch)
			r.onOutbox(ch)
		}
	}
}

// counted adds to the written and failed counters and wakes Flush.
func (r *EventRecorder) counted(ok, bad uint64) {
	r.written.Add(ok)
	r.failed.Add(bad)
	r.mu.Lock()
	r.processed += ok + bad
	close(r.progress)
	r.progress = make(chan struct{})
	r.mu.Unlock()
}

// validEvent rejects what cannot be recorded.
func validEvent(ev *event.Event) error {
	switch {
	case ev.RunID == "" && ev.Kind != event.SessionReset:
		return fmt.Errorf("%w: no run id", ErrInvalid)
	case ev.SessionKey == "":
		return fmt.Errorf("%w: no session key", ErrInvalid)
	case ev.Kind.String() == "unknown":
		return fmt.Errorf("%w: unknown event kind %d", ErrInvalid, ev.Kind)
	case ev.Kind == event.ApprovalRequested || ev.Kind == event.ApprovalResolved:
		return validApproval(ev)
	}
	return nil
}
