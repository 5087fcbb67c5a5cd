package delivery

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrSaturated is returned by Limiter.Wait when the caller would have to
// wait longer than it is willing to.
var ErrSaturated = errors.New("delivery: rate limit saturated")

// Forever is a wait limit that is never reached.
const Forever = time.Duration(1 << 62)

// Limiter spaces calls evenly: at most one per interval, no bursts, so no
// window of one second ever holds more than 1s/interval calls. One is
// shared by every destination of a channel (Telegram: ~30 messages per
// second per bot). Safe for concurrent use.
type Limiter struct {
	mu       sync.Mutex
	interval time.Duration
	next     time.Time // the earliest moment the next call may go
}

// NewLimiter allows perSecond calls per second (at least 1).
func NewLimiter(perSecond int) *Limiter {
	if perSecond < 1 {
		perSecond = 1
	}
	// Rounded up, so that perSecond calls never fit in one second.
	n := time.Duration(perSecond)
	return &Limiter{interval: (time.Second + n - 1) / n}
}

// Wait reserves the next slot and sleeps until it, unless the slot is more
// than maxWait away: then it reserves nothing and returns ErrSaturated. A
// ctx that ends while sleeping returns ctx's error (the slot is lost).
func (l *Limiter) Wait(ctx context.Context, maxWait time.Duration) error {
	l.mu.Lock()
	now := time.Now()
	at := l.next
	if at.Before(now) {
		at = now
	}
	if at.Sub(now) > maxWait {
		l.mu.Unlock()
		return ErrSaturated
	}
	l.next = at.Add(l.interval)
	l.mu.Unlock()
	return Sleep(ctx, at.Sub(now))
}

// Pacer is one destination's own spacing of messages (Telegram: about one
// message per second in a chat, twenty per minute in a group) and its
// rate-limit block. It is not safe for concurrent use: its owner guards it.
type Pacer struct {
	Interval time.Duration
	next     time.Time
	blocked  time.Time // a retry-after: nothing goes before
}

// ReadyAt is when the destination may receive its next message.
func (p *Pacer) ReadyAt() time.Time {
	if p.blocked.After(p.next) {
		return p.blocked
	}
	return p.next
}

// Blocked is the end of the current rate-limit block (zero if none).
func (p *Pacer) Blocked() time.Time { return p.blocked }

// Take uses the slot at now (or later, if the slot is not free yet).
func (p *Pacer) Take(now time.Time) {
	if p.next.Before(now) {
		p.next = now
	}
	p.next = p.next.Add(p.Interval)
}

// Hold pushes the next slot to Interval after now: called when a message
// actually goes, which may be later than when its slot was taken (it also
// waited for the shared Limiter).
func (p *Pacer) Hold(now time.Time) {
	if n := now.Add(p.Interval); n.After(p.next) {
		p.next = n
	}
}

// Block holds every message to the destination until now+d (a 429's
// retry-after).
func (p *Pacer) Block(now time.Time, d time.Duration) {
	if until := now.Add(d); until.After(p.blocked) {
		p.blocked = until
	}
}

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
