package telegram

import (
	"context"
	"errors"
	"sync"
	"time"
)

// errSaturated is returned by limiter.wait when the caller would have to
// wait longer than it is willing to.
var errSaturated = errors.New("telegram: rate limit saturated")

// limiter spaces calls evenly: at most one per interval, no bursts, so no
// window of one second ever holds more than 1s/interval calls. It is shared
// by every chat (Telegram's ~30 messages per second per bot). Safe for
// concurrent use.
type limiter struct {
	mu       sync.Mutex
	interval time.Duration
	next     time.Time // the earliest moment the next call may go
}

func newLimiter(perSecond int) *limiter {
	if perSecond < 1 {
		perSecond = 1
	}
	// Rounded up, so that perSecond calls never fit in one second.
	n := time.Duration(perSecond)
	return &limiter{interval: (time.Second + n - 1) / n}
}

// wait reserves the next slot and sleeps until it, unless the slot is more
// than maxWait away: then it reserves nothing and returns errSaturated. A
// ctx that ends while sleeping returns ctx's error (the slot is lost).
func (l *limiter) wait(ctx context.Context, maxWait time.Duration) error {
	l.mu.Lock()
	now := time.Now()
	at := l.next
	if at.Before(now) {
		at = now
	}
	if at.Sub(now) > maxWait {
		l.mu.Unlock()
		return errSaturated
	}
	l.next = at.Add(l.interval)
	l.mu.Unlock()
	return sleep(ctx, at.Sub(now))
}

// pacer is a chat's own spacing of messages (Telegram: about one message
// per second in a chat, twenty per minute in a group). It is guarded by the
// Channel's lock.
type pacer struct {
	interval time.Duration
	next     time.Time
}

// readyAt is when the chat may receive its next message.
func (p *pacer) readyAt() time.Time { return p.next }

// take uses the slot at now (or later, if the slot is not free yet).
func (p *pacer) take(now time.Time) {
	if p.next.Before(now) {
		p.next = now
	}
	p.next = p.next.Add(p.interval)
}

// hold pushes the next slot to interval after now: called when a message
// actually goes, which may be later than when its slot was taken (it also
// waited for the shared limiter).
func (p *pacer) hold(now time.Time) {
	if n := now.Add(p.interval); n.After(p.next) {
		p.next = n
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
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

// forever is a wait limit that is never reached.
const forever = time.Duration(1 << 62)
