// Package lease elects one leader among gateway replicas with a lease on a
// JetStream key-value key (issue 12: one replica polls Telegram). It
// imports nothing of turnguard's.
//
// The key lives in a bucket whose TTL (the stream's MaxAge) is the lease's
// TTL: every renewal writes a new revision, so the key disappears TTL after
// its holder last renewed it. A candidate takes the key with Create (which
// succeeds only when the key is absent) and renews it with Update on the
// revision it last wrote (compare-and-set), so two holders can never both
// write it.
//
// What a holder believes is bounded by its own monotonic clock: a term
// lasts GiveUpAfter (default 3/4 of the TTL) from the moment the last
// successful write was sent. A holder that cannot renew for that long
// gives up — Term.Leading turns false and Term.Lost closes — before the key
// can expire, and so before anyone else can take it. The margin (TTL −
// GiveUpAfter) absorbs the difference between the holder's clock and the
// NATS servers' wall clocks (MaxAge is measured on those) and the time a
// write spends before the stream stamps it; it assumes those differ by less
// than the margin.
//
// Why a bucket TTL and not a per-key TTL (Nats-TTL, KeyTTL with
// LimitMarkerTTL): nats.go v1.55's KeyValue.Update takes no TTL, so a
// per-key TTL would need a raw publish with hand-made KV headers on every
// renewal; a bucket of its own whose MaxAge is the TTL gives the same
// expiry with the public KV calls. Followers poll (Create every
// RetryEvery) rather than watch for the expiry marker, so the bucket needs
// no markers either.
package lease

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/turnguard/turnguard/cluster/jsstream"
)

// BucketConfig describes the bucket that holds leases; all candidates of a
// deployment share it.
type BucketConfig struct {
	// Bucket is the KV bucket's name. Required.
	Bucket string
	// TTL is every lease's time to live: how long after its holder's last
	// renewal (or death) a key disappears. Default 10 s.
	TTL time.Duration
	// Replicas of the bucket's stream: 3 in a three-node cluster, so a
	// renewal survives one node's loss. Default 1.
	Replicas int
}

// DefaultTTL is BucketConfig.TTL's default.
const DefaultTTL = 10 * time.Second

// EnsureBucket creates the lease bucket, or updates it to cfg. It is a
// memory bucket keeping one revision per key: a lease must not outlive its
// holder, and losing every lease when the whole NATS cluster restarts costs
// only a new election.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) (jetstream.KeyValue, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("lease: bucket name required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	kc := jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "turnguard: leader leases (cluster/lease)",
		History:     1,
		TTL:         cfg.TTL,
		Storage:     jetstream.MemoryStorage,
		Replicas:    cfg.Replicas,
	}
	kv, err := jsstream.KeyValue(ctx, js, kc)
	if err != nil {
		return nil, fmt.Errorf("lease: ensure bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// Options tunes a candidate; the zero value is the defaults, derived from
// the bucket's TTL.
type Options struct {
	// RenewEvery is how often a holder renews. Default TTL/4. A failed
	// renewal is retried every RenewEvery/4 until it succeeds or the term
	// ends.
	RenewEvery time.Duration
	// GiveUpAfter is how long a term lasts past the sending of the last
	// successful write. Must be below the TTL and above RenewEvery.
	// Default 3/4 of the TTL.
	GiveUpAfter time.Duration
	// RetryEvery is how often a follower tries to take the key. Default
	// TTL/10.
	RetryEvery time.Duration
	// OnRenew, if set, is called after every successful renewal with the
	// key's new revision, on the candidate's goroutine; it must not block.
	// It is for observation (tests check there that no one else leads).
	OnRenew func(rev uint64)
	// OnError, if set, is called with the errors the campaign retries
	// past (NATS unreachable, a timeout); it must not block.
	OnError func(error)
}

func (o Options) withDefaults(ttl time.Duration) (Options, error) {
	if o.RenewEvery <= 0 {
		o.RenewEvery = ttl / 4
	}
	if o.GiveUpAfter <= 0 {
		o.GiveUpAfter = ttl * 3 / 4
	}
	if o.RetryEvery <= 0 {
		o.RetryEvery = ttl / 10
	}
	if o.GiveUpAfter >= ttl || o.RenewEvery >= o.GiveUpAfter {
		return o, fmt.Errorf("lease: want RenewEvery (%v) < GiveUpAfter (%v) < TTL (%v)", o.RenewEvery, o.GiveUpAfter, ttl)
	}
	return o, nil
}

// Reason says why a term ended.
type Reason string

const (
	// ReasonGaveUp: no renewal succeeded within GiveUpAfter.
	ReasonGaveUp Reason = "no renewal succeeded in time"
	// ReasonTaken: a renewal found the key written by someone else, or
	// gone.
	ReasonTaken Reason = "the key was taken or expired"
	// ReasonResigned: the campaign's context ended.
	ReasonResigned Reason = "the campaign ended"
)

// LostError is Term.Err after a term ended.
type LostError struct {
	Name, Holder string
	Reason       Reason
	Err          error // the last error from NATS, if any
}

func (e *LostError) Error() string {
	s := fmt.Sprintf("lease %q: %s lost leadership: %s", e.Name, e.Holder, e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *LostError) Unwrap() error { return e.Err }

// ErrNoTTL: Campaign was given a bucket whose keys never expire.
var ErrNoTTL = errors.New("lease: the bucket has no TTL")

// Term is one tenure of leadership. Its methods are safe for concurrent
// use.
type Term struct {
	// Revision is the key's revision when the term began.
	Revision uint64

	lost chan struct{}

	mu       sync.Mutex
	deadline time.Time // carries a monotonic reading
	ended    bool
	err      error
}

// Leading reports whether the term still holds: it has not ended and its
// deadline (the last successful write's sending + GiveUpAfter) has not
// passed on this process's monotonic clock. It turns false at the
// deadline even before Lost closes.
func (t *Term) Leading() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.ended && time.Now().Before(t.deadline)
}

// Lost is closed when the term ends: its deadline passed without a
// renewal (closed at the deadline, before the key can expire), a renewal
// found the key taken, or the campaign ended. A poller stops polling when
// it closes.
func (t *Term) Lost() <-chan struct{} { return t.lost }

// Err is nil while the term holds, then a *LostError.
func (t *Term) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// extend moves the deadline to d if the term still holds.
func (t *Term) extend(d time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended || !time.Now().Before(t.deadline) {
		return false
	}
	if d.After(t.deadline) {
		t.deadline = d
	}
	return true
}

func (t *Term) end(err *LostError) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	t.ended, t.err = true, err
	close(t.lost)
}

func (t *Term) deadlineTime() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.deadline
}

// Candidate campaigns for one lease until its context ends.
type Candidate struct {
	name, holder string
	ttl          time.Duration
	opt          Options
	s            store

	mu      sync.Mutex
	term    *Term
	changed chan struct{} // closed and replaced when term changes
	done    chan struct{}
}

// Campaign starts campaigning for the lease name in kv (a bucket from
// EnsureBucket; its TTL is the lease's) as holderID, and returns at once.
// The campaign runs until ctx ends; then a leading candidate deletes the
// key (if it still holds it), so another takes over within its RetryEvery.
// holderID names the replica to observers (Holder); each term writes a
// fresh token beside it, so a restarted replica with the same id is a new
// holder.
func Campaign(ctx context.Context, kv jetstream.KeyValue, name, holderID string, opt Options) (*Candidate, error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("lease: status of bucket %s: %w", kv.Bucket(), err)
	}
	if st.TTL() <= 0 {
		return nil, fmt.Errorf("lease: bucket %s: %w", kv.Bucket(), ErrNoTTL)
	}
	return campaign(ctx, kvStore{kv}, st.TTL(), name, holderID, opt)
}

func campaign(ctx context.Context, s store, ttl time.Duration, name, holderID string, opt Options) (*Candidate, error) {
	opt, err := opt.withDefaults(ttl)
	if err != nil {
		return nil, err
	}
	if name == "" || holderID == "" {
		return nil, errors.New("lease: name and holderID required")
	}
	c := &Candidate{name: name, holder: holderID, ttl: ttl, opt: opt, s: s,
		changed: make(chan struct{}), done: make(chan struct{})}
	go c.run(ctx)
	return c, nil
}

// Await returns the current term once this candidate leads (at once if it
// does). It returns an error when ctx ends or the campaign has ended.
func (c *Candidate) Await(ctx context.Context) (*Term, error) {
	for {
		c.mu.Lock()
		t, ch := c.term, c.changed
		c.mu.Unlock()
		if t != nil && t.Leading() {
			return t, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("lease %q: await: %w", c.name, ctx.Err())
		case <-c.done:
			return nil, fmt.Errorf("lease %q: await: the campaign ended", c.name)
		}
	}
}

// Leading reports whether the candidate holds the lease now (see
// Term.Leading).
func (c *Candidate) Leading() bool {
	c.mu.Lock()
	t := c.term
	c.mu.Unlock()
	return t != nil && t.Leading()
}

// Done is closed when the campaign has ended (its context ended and the
// key, if held, was released).
func (c *Candidate) Done() <-chan struct{} { return c.done }

// Holder returns the holderID that holds the lease name in kv, or "" when
// nobody does.
func Holder(ctx context.Context, kv jetstream.KeyValue, name string) (string, error) {
	v, _, err := kvStore{kv}.get(ctx, name)
	if errors.Is(err, errNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("lease %q: holder: %w", name, err)
	}
	h, _, _ := bytes.Cut(v, []byte("\n"))
	return string(h), nil
}

func (c *Candidate) setTerm(t *Term) {
	c.mu.Lock()
	c.term = t
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

func (c *Candidate) report(err error) {
	if c.opt.OnError != nil && err != nil {
		c.opt.OnError(fmt.Errorf("lease %q (%s): %w", c.name, c.holder, err))
	}
}

func (c *Candidate) run(ctx context.Context) {
	defer close(c.done)
	for {
		t, val := c.acquire(ctx)
		if t == nil {
			return
		}
		c.setTerm(t)
		c.hold(ctx, t, val)
		c.setTerm(nil)
	}
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// acquire tries to create the key every RetryEvery until it succeeds
// (a new term and the value written) or ctx ends (nil).
func (c *Candidate) acquire(ctx context.Context) (*Term, []byte) {
	for ctx.Err() == nil {
		val := []byte(c.holder + "\n" + nuid.Next())
		start := time.Now()
		cctx, cancel := context.WithDeadline(ctx, start.Add(c.opt.GiveUpAfter))
		rev, err := c.s.create(cctx, c.name, val)
		cancel()
		switch {
		case err == nil:
			t := &Term{Revision: rev, lost: make(chan struct{}), deadline: start.Add(c.opt.GiveUpAfter)}
			if t.Leading() {
				return t, val
			}
			c.release(ctx, val) // created too late to believe in: hand it back
		case errors.Is(err, errExists):
		default:
			c.report(fmt.Errorf("take the key: %w", err))
		}
		if !sleep(ctx, c.opt.RetryEvery) {
			return nil, nil
		}
	}
	return nil, nil
}

// hold renews t's key until the term ends.
func (c *Candidate) hold(ctx context.Context, t *Term, val []byte) {
	rev := t.Revision
	next := time.Now().Add(c.opt.RenewEvery)
	var last error
	lost := func(r Reason) { t.end(&LostError{Name: c.name, Holder: c.holder, Reason: r, Err: last}) }
	for {
		deadline := t.deadlineTime()
		wake := next
		if deadline.Before(wake) {
			wake = deadline
		}
		tm := time.NewTimer(time.Until(wake))
		select {
		case <-ctx.Done():
			tm.Stop()
			lost(ReasonResigned)
			c.release(ctx, val)
			return
		case <-tm.C:
		}
		start := time.Now()
		if !start.Before(deadline) {
			lost(ReasonGaveUp)
			c.release(ctx, val)
			return
		}
		uctx, cancel := context.WithDeadline(ctx, deadline)
		nrev, err := c.s.update(uctx, c.name, val, rev)
		if errors.Is(err, errConflict) {
			// Our own earlier write may have landed without its answer.
			var got []byte
			got, nrev, err = c.s.get(uctx, c.name)
			switch {
			case err == nil && bytes.Equal(got, val):
				rev = nrev // adopted; the deadline stays (we do not know when it landed)
				cancel()
				next = time.Now()
				continue
			case err == nil || errors.Is(err, errNotFound):
				cancel()
				lost(ReasonTaken)
				return
			}
		}
		cancel()
		if err == nil {
			rev = nrev
			if !t.extend(start.Add(c.opt.GiveUpAfter)) {
				lost(ReasonGaveUp) // the write landed after the deadline: too late to believe in
				c.release(ctx, val)
				return
			}
			if c.opt.OnRenew != nil {
				c.opt.OnRenew(rev)
			}
			last = nil
			next = start.Add(c.opt.RenewEvery)
			continue
		}
		last = err
		c.report(fmt.Errorf("renew: %w", err))
		next = time.Now().Add(c.opt.RenewEvery / 4)
	}
}

// release deletes the key if it still holds val, so a follower need not
// wait for the TTL. Best effort, bounded by RetryEvery·5; runs after ctx
// ended too.
func (c *Candidate) release(ctx context.Context, val []byte) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*c.opt.RetryEvery)
	defer cancel()
	got, rev, err := c.s.get(rctx, c.name)
	if err != nil || !bytes.Equal(got, val) {
		return
	}
	if err := c.s.del(rctx, c.name, rev); err != nil && !errors.Is(err, errConflict) {
		c.report(fmt.Errorf("release: %w", err))
	}
}
