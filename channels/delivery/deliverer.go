package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// ErrClosed is returned by Enqueue after Close.
var ErrClosed = errors.New("delivery: closed")

// Options configure a Deliverer. Sender is required.
type Options struct {
	Sender Sender
	// Outbox records the outcome of messages with an ID; nil records
	// nothing.
	Outbox Outbox
	// Limiter is the global rate, shared by every destination (default 30
	// per second).
	Limiter *Limiter
	// Interval is a destination's least spacing of messages (default 1s).
	Interval func(dest string) time.Duration
	// Policy is how each message is tried.
	Policy Policy
	// OnDone, if set, is called on the destination's worker after each
	// message with its last error (nil: delivered).
	OnDone func(dest string, m Message, err error)
	// Log receives failures (destination, run id, error; never the text).
	Log *slog.Logger
}

// Deliverer delivers messages to destinations: in order per destination
// (one worker per destination with something queued), paced per
// destination and globally, each tried per Policy, its outcome recorded in
// the outbox. Safe for concurrent use.
type Deliverer struct {
	opts   Options
	ctx    context.Context // the workers'; cancelled by Close
	cancel context.CancelFunc

	mu      sync.Mutex
	dests   map[string]*dest
	queued  int
	drained chan struct{} // closed when queued drops to 0; nil until Close waits
	closed  bool
	wg      sync.WaitGroup
}

type dest struct {
	name    string
	queue   []Message
	pace    Pacer
	running bool
}

// New returns a Deliverer; it starts no goroutine until a message is
// queued.
func New(opts Options) *Deliverer {
	if opts.Limiter == nil {
		opts.Limiter = NewLimiter(30)
	}
	if opts.Interval == nil {
		opts.Interval = func(string) time.Duration { return time.Second }
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Deliverer{opts: opts, ctx: ctx, cancel: cancel, dests: map[string]*dest{}}
}

// Enqueue queues m for dest behind what dest already has queued.
func (d *Deliverer) Enqueue(destination string, m Message) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	q, ok := d.dests[destination]
	if !ok {
		q = &dest{name: destination, pace: Pacer{Interval: d.opts.Interval(destination)}}
		d.dests[destination] = q
	}
	q.queue = append(q.queue, m)
	d.queued++
	if !q.running {
		q.running = true
		d.wg.Add(1)
		go d.run(q)
	}
	return nil
}

// Close stops accepting messages and waits until what is queued has been
// delivered (or has failed) or ctx ends; then it stops the workers. What
// was not delivered stays pending in the outbox (if it is there) and the
// returned error says how many were left.
func (d *Deliverer) Close(ctx context.Context) error {
	d.mu.Lock()
	d.closed = true
	var wait chan struct{}
	if d.queued > 0 {
		if d.drained == nil {
			d.drained = make(chan struct{})
		}
		wait = d.drained
	}
	d.mu.Unlock()
	var err error
	left := 0
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
			err = ctx.Err()
			d.mu.Lock()
			left = d.queued
			d.mu.Unlock()
		}
	}
	d.cancel()
	d.wg.Wait()
	if err != nil {
		return fmt.Errorf("delivery: %d message(s) not delivered before close: %w", left, err)
	}
	return nil
}

// run is dest's worker: it delivers the queue in order and exits when it
// is empty.
func (d *Deliverer) run(q *dest) {
	defer d.wg.Done()
	for {
		d.mu.Lock()
		if len(q.queue) == 0 || d.ctx.Err() != nil {
			q.running = false
			if len(q.queue) == 0 && !time.Now().Before(q.pace.ReadyAt()) {
				delete(d.dests, q.name) // nothing to keep: its spacing is over
			}
			d.mu.Unlock()
			return
		}
		m := q.queue[0]
		q.queue[0] = Message{}
		q.queue = q.queue[1:]
		d.mu.Unlock()
		err := d.deliver(q, m)
		d.mu.Lock()
		if d.queued--; d.queued == 0 && d.drained != nil {
			close(d.drained)
			d.drained = nil
		}
		d.mu.Unlock()
		if d.opts.OnDone != nil {
			d.opts.OnDone(q.name, m, err)
		}
	}
}

// deliver tries m per the policy and records the outcome.
func (d *Deliverer) deliver(q *dest, m Message) error {
	ctx := d.ctx
	err := d.opts.Policy.Do(ctx, destPace{d, q}, func(ctx context.Context) error {
		return d.opts.Sender.Send(ctx, q.name, m)
	}, func(r Retry) {
		d.opts.Log.Info("delivery: retrying", "dest", q.name, "run", m.RunID, "in", r.Wait, "err", r.Err)
	})
	switch class, _ := Classify(ctx, err); class {
	case OK:
	case Canceled:
		d.opts.Log.Info("delivery: closing before the message went; it stays in the outbox", "dest", q.name, "run", m.RunID, "kind", m.Kind)
	default:
		d.opts.Log.Warn("delivery: message not delivered", "dest", q.name, "run", m.RunID, "kind", m.Kind, "err", err)
	}
	if m.ID != 0 && d.opts.Outbox != nil {
		if _, rerr := Record(ctx, d.opts.Outbox, m.ID, err); rerr != nil {
			d.opts.Log.Warn("delivery: outbox update failed", "dest", q.name, "run", m.RunID, "err", rerr)
		}
	}
	return err
}

// destPace paces a destination of a Deliverer.
type destPace struct {
	d *Deliverer
	q *dest
}

func (p destPace) Wait(ctx context.Context) error {
	for {
		p.d.mu.Lock()
		now := time.Now()
		at := p.q.pace.ReadyAt()
		if !now.Before(at) {
			p.q.pace.Take(now)
			p.d.mu.Unlock()
			break
		}
		p.d.mu.Unlock()
		if err := Sleep(ctx, at.Sub(now)); err != nil {
			return err
		}
	}
	if err := p.d.opts.Limiter.Wait(ctx, Forever); err != nil {
		return err
	}
	p.d.mu.Lock()
	p.q.pace.Hold(time.Now())
	p.d.mu.Unlock()
	return nil
}

func (p destPace) Block(dur time.Duration) {
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	p.q.pace.Block(time.Now(), dur)
}
