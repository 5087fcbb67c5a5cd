package delivery_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/channels/delivery"
)

// fakeSender records what each destination received and when, and answers
// with the scripted errors first.
type fakeSender struct {
	start  time.Time
	mu     sync.Mutex
	got    []string           // "dest@elapsed text"
	at     []time.Duration    // each send's time since start
	script map[string][]error // per text: the answers of its first attempts
}

func newSender() *fakeSender {
	return &fakeSender{start: time.Now(), script: map[string][]error{}}
}

func (s *fakeSender) Send(_ context.Context, dest string, m delivery.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := time.Since(s.start)
	s.at = append(s.at, at)
	if errs := s.script[m.Text]; len(errs) > 0 {
		s.script[m.Text] = errs[1:]
		if errs[0] != nil {
			s.got = append(s.got, fmt.Sprintf("%s@%v %s ✗", dest, at, m.Text))
			return errs[0]
		}
	}
	s.got = append(s.got, fmt.Sprintf("%s@%v %s", dest, at, m.Text))
	return nil
}

// dest is what destination d received, each with its time since d's first
// send, rounded to 100ms (the global limiter's share).
func (s *fakeSender) dest(d string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	var first time.Duration = -1
	for i, l := range s.got {
		name, rest, _ := strings.Cut(l, "@")
		if name != d {
			continue
		}
		_, text, _ := strings.Cut(rest, " ")
		if first < 0 {
			first = s.at[i]
		}
		out = append(out, fmt.Sprintf("+%v %s", (s.at[i]-first).Round(100*time.Millisecond), text))
	}
	return out
}

// times are the send times, in order.
func (s *fakeSender) times() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.at)
}

func (s *fakeSender) log() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// fakeOutbox records the outcome calls. The first failMarks
// MarkDelivered calls fail (the database restarted).
type fakeOutbox struct {
	mu        sync.Mutex
	got       []string
	failMarks int
}

func (o *fakeOutbox) note(s string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, s)
	return nil
}
func (o *fakeOutbox) MarkDelivered(_ context.Context, id int64) error {
	o.mu.Lock()
	fail := o.failMarks > 0
	o.failMarks--
	o.mu.Unlock()
	if fail {
		_ = o.note(fmt.Sprintf("%d mark failed", id))
		return errors.New("connection reset by peer")
	}
	return o.note(fmt.Sprintf("%d delivered", id))
}
func (o *fakeOutbox) MarkAttempt(_ context.Context, id int64, err error) error {
	return o.note(fmt.Sprintf("%d attempt: %v", id, err))
}
func (o *fakeOutbox) MarkFailed(_ context.Context, id int64, reason string) error {
	return o.note(fmt.Sprintf("%d failed: %s", id, reason))
}
func (o *fakeOutbox) log() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.got)
}

func want(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n  %s\nwant:\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// run delivers msgs (destination, message) with the sender and outbox,
// lets everything settle in fake time and closes the Deliverer.
func run(t *testing.T, s *fakeSender, o *fakeOutbox, opts delivery.Options, msgs ...any) {
	t.Helper()
	opts.Sender, opts.Outbox, opts.Log = s, o, quiet
	d := delivery.New(opts)
	for i := 0; i < len(msgs); i += 2 {
		if err := d.Enqueue(msgs[i].(string), msgs[i+1].(delivery.Message)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := d.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := d.Enqueue("a", delivery.Message{Text: "late"}); !errors.Is(err, delivery.ErrClosed) {
		t.Errorf("Enqueue after Close = %v, want ErrClosed", err)
	}
}

var quiet = slog.New(slog.DiscardHandler)

func msg(id int64, text string) delivery.Message { return delivery.Message{ID: id, Text: text} }

// TestPacing: each destination gets its messages in order, one per its
// interval; destinations go in parallel, and no two sends of any
// destinations come closer than the global rate allows.
func TestPacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, o := newSender(), &fakeOutbox{}
		run(t, s, o, delivery.Options{Limiter: delivery.NewLimiter(10), Interval: func(d string) time.Duration {
			if d == "group" {
				return 3 * time.Second
			}
			return time.Second
		}},
			"a", msg(1, "a1"), "a", msg(2, "a2"), "a", msg(3, "a3"), "group", msg(4, "g1"), "group", msg(5, "g2"))
		want(t, "destination a", s.dest("a"), []string{"+0s a1", "+1s a2", "+2s a3"})
		want(t, "the group", s.dest("group"), []string{"+0s g1", "+3s g2"})
		times := s.times()
		for i := 1; i < len(times); i++ {
			if gap := times[i] - times[i-1]; gap < 100*time.Millisecond {
				t.Errorf("sends %d and %d are %v apart, under the global 10 per second", i, i+1, gap)
			}
		}
		if n := len(o.log()); n != 5 {
			t.Errorf("outbox updates = %v, want 5 delivered", o.log())
		}
	})
}

// TestRetryAfterHonored: a rate limit's retry-after holds the message and
// everything behind it to that destination (another destination goes on);
// then it is delivered and recorded once.
func TestRetryAfterHonored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, o := newSender(), &fakeOutbox{}
		s.script["m1"] = []error{&delivery.RetryAfterError{After: 7 * time.Second, Err: errors.New("429")}}
		run(t, s, o, delivery.Options{}, "a", msg(1, "m1"), "a", msg(2, "m2"), "b", msg(3, "b1"))
		want(t, "destination a", s.dest("a"), []string{"+0s m1 ✗", "+7s m1", "+8s m2"})
		want(t, "destination b", s.dest("b"), []string{"+0s b1"})
		got := o.log()
		slices.Sort(got)
		want(t, "outbox", got, []string{"1 delivered", "2 delivered", "3 delivered"})
	})
}

// TestServerErrorBackoffThenSuccess: 5xx and network failures are retried
// with doubling backoff until the message goes; only the delivery is
// recorded.
func TestServerErrorBackoffThenSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, o := newSender(), &fakeOutbox{}
		fail := delivery.Temporary(errors.New("HTTP 502"))
		s.script["m1"] = []error{fail, fail, fail}
		run(t, s, o, delivery.Options{}, "a", msg(1, "m1"))
		// 0s; +0.5s backoff; +1s; +2s. The chat's 1s spacing counts from
		// each attempt, so it, not the backoff, sets the last two waits.
		want(t, "sends", s.log(), []string{"a@0s m1 ✗", "a@1s m1 ✗", "a@2s m1 ✗", "a@4s m1"})
		want(t, "outbox", o.log(), []string{"1 delivered"})
	})
}

// TestFailedMarkIsRetried: a message was delivered but recording it
// failed twice (a database restart): the mark is tried again, backing off,
// until the outbox takes it — the message is not left pending to be sent
// again — and the destination's next message goes after it.
func TestFailedMarkIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, o := newSender(), &fakeOutbox{failMarks: 2}
		run(t, s, o, delivery.Options{}, "a", msg(1, "m1"), "a", msg(2, "m2"))
		want(t, "sends", s.log(), []string{"a@0s m1", "a@1s m2"})
		want(t, "outbox", o.log(), []string{"1 mark failed", "1 mark failed", "1 delivered", "2 delivered"})
	})
}

// TestTransientExhaustedStaysPending: a failure that outlasts the policy's
// attempts is recorded as an attempt — the message stays pending for a
// later resend — and the next message still goes.
func TestTransientExhaustedStaysPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, o := newSender(), &fakeOutbox{}
		fail := delivery.Temporary(errors.New("connection refused"))
		s.script["m1"] = []error{fail, fail}
		run(t, s, o, delivery.Options{Policy: delivery.Policy{MaxAttempts: 2}}, "a", msg(1, "m1"), "a", msg(2, "m2"))
		want(t, "outbox", o.log(), []string{"1 attempt: connection refused", "2 delivered"})
	})
}

// TestPermanentFailureMarkedFailed: a refusal (the chat is gone) is tried
// once and marked failed; the queue goes on.
func TestPermanentFailureMarkedFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, o := newSender(), &fakeOutbox{}
		s.script["m1"] = []error{errors.New("Forbidden: bot was blocked by the user")}
		var done []string
		run(t, s, o, delivery.Options{OnDone: func(dest string, m delivery.Message, err error) {
			done = append(done, fmt.Sprintf("%s %s %v", dest, m.Text, err))
		}}, "a", msg(1, "m1"), "a", msg(2, "m2"), "a", msg(0, "direct answer"))
		want(t, "sends", s.log(), []string{"a@0s m1 ✗", "a@1s m2", "a@2s direct answer"})
		want(t, "outbox", o.log(), []string{"1 failed: Forbidden: bot was blocked by the user", "2 delivered"})
		want(t, "OnDone", done, []string{"a m1 Forbidden: bot was blocked by the user", "a m2 <nil>", "a direct answer <nil>"})
	})
}

// TestCloseLeavesUndeliveredPending: Close bounded by its context leaves
// what could not go in the outbox (nothing recorded for it) and says so.
func TestCloseLeavesUndeliveredPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, o := newSender(), &fakeOutbox{}
		s.script["m1"] = []error{&delivery.RetryAfterError{After: time.Hour, Err: errors.New("429")}}
		d := delivery.New(delivery.Options{Sender: s, Outbox: o, Log: quiet})
		if err := d.Enqueue("a", msg(1, "m1")); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Close(ctx); err == nil || !strings.Contains(err.Error(), "1 message(s) not delivered") {
			t.Errorf("Close = %v, want one message left", err)
		}
		want(t, "outbox", o.log(), nil)
	})
}
