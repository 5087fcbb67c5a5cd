package lease

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/internal/faketime"
)

// The campaign's timing under testing/synctest: a fake bucket whose keys
// expire TTL after their last write on the bubble's clock, shared by
// candidates each reaching it through a client that a test can cut off.

type fakeEntry struct {
	val []byte
	rev uint64
	at  time.Time
}

type fakeBucket struct {
	ttl  time.Duration
	mu   sync.Mutex
	seq  uint64
	keys map[string]*fakeEntry
}

func newFakeBucket(ttl time.Duration) *fakeBucket {
	return &fakeBucket{ttl: ttl, keys: map[string]*fakeEntry{}}
}

// live returns key's entry unless it is absent or expired. b.mu held.
func (b *fakeBucket) live(key string) *fakeEntry {
	e := b.keys[key]
	if e == nil || time.Since(e.at) >= b.ttl {
		return nil
	}
	return e
}

func (b *fakeBucket) write(key string, val []byte) uint64 {
	b.seq++
	b.keys[key] = &fakeEntry{val: val, rev: b.seq, at: time.Now()}
	return b.seq
}

// overwrite writes key as a foreign holder would.
func (b *fakeBucket) overwrite(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.write(key, []byte("intruder\nx"))
}

// client is one candidate's view of the bucket. cut makes every call wait
// for its context (an unreachable server); lostAck makes the next update
// apply but answer an error.
type client struct {
	b       *fakeBucket
	mu      sync.Mutex
	cut     bool
	lostAck bool
	late    time.Duration // every update applies this long after it is sent
}

func (c *client) set(f func(c *client)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(c)
}

func (c *client) gate(ctx context.Context) error {
	c.mu.Lock()
	cut := c.cut
	c.mu.Unlock()
	if cut {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// delay runs apply late (a write on its way) and returns its result, or
// ctx's error if ctx ends first (the write still lands later).
func delay[T any](ctx context.Context, late time.Duration, apply func() T) (T, error) {
	if late <= 0 {
		return apply(), nil
	}
	ch := make(chan T, 1)
	go func() {
		faketime.Advance(late) // the write's delay on the way
		ch <- apply()
	}()
	select {
	case v := <-ch:
		return v, nil
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

func (c *client) create(ctx context.Context, key string, val []byte) (uint64, error) {
	if err := c.gate(ctx); err != nil {
		return 0, err
	}
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if c.b.live(key) != nil {
		return 0, errExists
	}
	return c.b.write(key, val), nil
}

func (c *client) update(ctx context.Context, key string, val []byte, rev uint64) (uint64, error) {
	if err := c.gate(ctx); err != nil {
		return 0, err
	}
	c.mu.Lock()
	late := c.late
	c.mu.Unlock()
	type result struct {
		rev uint64
		err error
	}
	r, err := delay(ctx, late, func() result {
		c.b.mu.Lock()
		defer c.b.mu.Unlock()
		e := c.b.live(key)
		if e == nil || e.rev != rev {
			return result{err: errConflict}
		}
		n := c.b.write(key, val)
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.lostAck {
			c.lostAck = false
			return result{err: errors.New("timeout: no answer")}
		}
		return result{rev: n}
	})
	if err != nil {
		return 0, err
	}
	return r.rev, r.err
}

func (c *client) get(ctx context.Context, key string) ([]byte, uint64, error) {
	if err := c.gate(ctx); err != nil {
		return nil, 0, err
	}
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	e := c.b.live(key)
	if e == nil {
		return nil, 0, errNotFound
	}
	return e.val, e.rev, nil
}

func (c *client) del(ctx context.Context, key string, rev uint64) error {
	if err := c.gate(ctx); err != nil {
		return err
	}
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	e := c.b.live(key)
	if e == nil || e.rev != rev {
		return errConflict
	}
	delete(c.b.keys, key)
	return nil
}

const fakeTTL = 10 * time.Second

// field is a set of candidates on one fake bucket; at every renewal of any
// of them it checks that no other believes it leads.
type field struct {
	t     *testing.T
	b     *fakeBucket
	mu    sync.Mutex
	cands []*Candidate
	names []string
	renew map[string][]time.Time
}

// newField returns an empty field and the context its campaigns run on; at
// the test's end (inside the bubble) every campaign is stopped and waited
// for.
func newField(t *testing.T) (*field, context.Context) {
	f := &field{t: t, b: newFakeBucket(fakeTTL), renew: map[string][]time.Time{}}
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(func() { f.stop(cancel) })
	return f, ctx
}

// leader starts holder's campaign and waits until it leads.
func (f *field) leader(ctx context.Context, holder string) (*Candidate, *client, *Term) {
	f.t.Helper()
	c, cl := f.join(ctx, holder)
	return c, cl, await(f.t, ctx, c)
}

func (f *field) join(ctx context.Context, holder string) (*Candidate, *client) {
	cl := &client{b: f.b}
	var self *Candidate
	c, err := campaign(ctx, cl, fakeTTL, "poller", holder, Options{OnRenew: func(uint64) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.renew[holder] = append(f.renew[holder], time.Now())
		for i, o := range f.cands {
			if o != self && o.Leading() {
				f.t.Errorf("%s renewed while %s leads", holder, f.names[i])
			}
		}
	}})
	if err != nil {
		f.t.Fatal(err)
	}
	self = c
	f.mu.Lock()
	f.cands = append(f.cands, c)
	f.names = append(f.names, holder)
	f.mu.Unlock()
	return c, cl
}

// stop ends every campaign and waits until each has released its key.
func (f *field) stop(cancel context.CancelFunc) {
	cancel()
	f.mu.Lock()
	cands := append([]*Candidate(nil), f.cands...)
	f.mu.Unlock()
	for _, c := range cands {
		<-c.Done()
	}
}

func (f *field) renewals(holder string) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.renew[holder]...)
}

func await(t *testing.T, ctx context.Context, c *Candidate) *Term {
	t.Helper()
	term, err := c.Await(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return term
}

// TestTimingRenewsEveryQuarterTTL: a lone holder renews every TTL/4 and
// keeps its term for as long as the bucket answers.
func TestTimingRenewsEveryQuarterTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, ctx := newField(t)
		_, _, term := f.leader(ctx, "a")
		start := time.Now()
		faketime.Advance(time.Minute + time.Second) // 24 renewals, the last at 60 s
		if !term.Leading() || term.Err() != nil {
			t.Fatalf("term ended after a minute of healthy renewals: %v", term.Err())
		}
		rs := f.renewals("a")
		if len(rs) != 24 { // 60 s / 2.5 s
			t.Fatalf("%d renewals in a minute; want 24 (every 2.5 s)", len(rs))
		}
		prev := start
		for _, r := range rs {
			if d := r.Sub(prev); d != fakeTTL/4 {
				t.Fatalf("renewal %v after the previous; want %v", d, fakeTTL/4)
			}
			prev = r
		}
	})
}

// TestTimingGivesUpBeforeTheKeyExpires: a holder cut off from NATS ends
// its term 3/4 TTL after its last renewal — Leading false, Lost closed —
// while its key still lives, and a follower takes the key only after it
// expired.
func TestTimingGivesUpBeforeTheKeyExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, ctx := newField(t)
		a, ca, term := f.leader(ctx, "a")
		b, _ := f.join(ctx, "b")
		faketime.Advance(7 * time.Second) // a few renewals
		ca.set(func(c *client) { c.cut = true })
		rs := f.renewals("a")
		last := rs[len(rs)-1]
		<-term.Lost()
		lostAt := time.Now()
		if got := lostAt.Sub(last); got != fakeTTL*3/4 {
			t.Fatalf("gave up %v after the last renewal; want %v", got, fakeTTL*3/4)
		}
		var le *LostError
		if !errors.As(term.Err(), &le) || le.Reason != ReasonGaveUp {
			t.Fatalf("Err = %v; want ReasonGaveUp", term.Err())
		}
		if a.Leading() {
			t.Fatal("a still leads after Lost")
		}
		if b.Leading() {
			t.Fatal("b leads before the key expired")
		}
		bt := await(t, ctx, b)
		took := time.Now()
		if took.Before(last.Add(fakeTTL)) {
			t.Fatalf("b took the key %v after a's last renewal, before the TTL", took.Sub(last))
		}
		if bound := last.Add(fakeTTL + fakeTTL/10); took.After(bound) {
			t.Fatalf("b took the key %v after a's last renewal; want within TTL + RetryEvery", took.Sub(last))
		}
		if !bt.Leading() {
			t.Fatal("b's term does not hold")
		}
	})
}

// TestTimingTakenKeyEndsTheTermAtTheNextRenewal: a key written by someone
// else ends the term at the next renewal, with ReasonTaken.
func TestTimingTakenKeyEndsTheTermAtTheNextRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, ctx := newField(t)
		a, _, term := f.leader(ctx, "a")
		faketime.Advance(time.Second) // between renewals
		f.b.overwrite("poller")
		start := time.Now()
		<-term.Lost()
		if d := time.Since(start); d > fakeTTL/4 {
			t.Fatalf("the term ended %v after the overwrite; want at the next renewal (%v)", d, fakeTTL/4)
		}
		var le *LostError
		if !errors.As(term.Err(), &le) || le.Reason != ReasonTaken {
			t.Fatalf("Err = %v; want ReasonTaken", term.Err())
		}
		if a.Leading() {
			t.Fatal("a leads after its key was taken")
		}
	})
}

// TestTimingLostAnswerIsAdopted: a renewal that landed but whose answer was
// lost does not end the term: the next renewal finds its own value and
// goes on from that revision.
func TestTimingLostAnswerIsAdopted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, ctx := newField(t)
		_, ca, term := f.leader(ctx, "a")
		ca.set(func(c *client) { c.lostAck = true })
		faketime.Advance(30 * time.Second) // many renewals
		if !term.Leading() {
			t.Fatalf("term ended after one lost answer: %v", term.Err())
		}
	})
}

// TestTimingResignHandsOverWithinRetryEvery: a campaign whose context ends
// deletes its key; a follower takes it within its RetryEvery, not the TTL.
func TestTimingResignHandsOverWithinRetryEvery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, ctx := newField(t)
		actx, stop := context.WithCancel(ctx)
		a, _ := f.join(actx, "a")
		term := await(t, ctx, a)
		b, _ := f.join(ctx, "b")
		faketime.Advance(3 * time.Second) // b is following
		stop()
		<-a.Done()
		var le *LostError
		if !errors.As(term.Err(), &le) || le.Reason != ReasonResigned {
			t.Fatalf("Err = %v; want ReasonResigned", term.Err())
		}
		from := time.Now()
		await(t, ctx, b)
		if d := time.Since(from); d > fakeTTL/10 {
			t.Fatalf("b took over %v after a resigned; want within RetryEvery", d)
		}
	})
}

// TestTimingSlowRenewalsGiveUpAtTheDeadline: renewals that take longer
// than the term has left (a slow or partitioned server) end the term at
// its deadline — 3/4 TTL after the last successful write was sent — not
// when the slow call returns, and a write that lands later revives nothing.
func TestTimingSlowRenewalsGiveUpAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, ctx := newField(t)
		_, ca, term := f.leader(ctx, "a")
		elected := time.Now()
		ca.set(func(c *client) { c.late = 6 * time.Second })
		faketime.Advance(fakeTTL*3/4 - time.Nanosecond) // just before the deadline
		if !term.Leading() {
			t.Fatal("the term ended before its deadline")
		}
		<-term.Lost()
		if d := time.Since(elected); d != fakeTTL*3/4 {
			t.Fatalf("term lost %v after the election; want %v", d, fakeTTL*3/4)
		}
		var le *LostError
		if !errors.As(term.Err(), &le) || le.Reason != ReasonGaveUp {
			t.Fatalf("Err = %v; want ReasonGaveUp", term.Err())
		}
		faketime.Advance(2 * time.Second) // the late write lands (8.5 s)
		if term.Leading() {
			t.Fatal("a late write revived the term")
		}
	})
}
