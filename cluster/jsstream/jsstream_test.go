package jsstream_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnguard/turnguard/cluster/jsstream"
	"github.com/turnguard/turnguard/internal/natstest"
)

func TestTransient(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"no peers for placement", &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}, true},
		{"temporarily unavailable", &jetstream.APIError{Code: 503, ErrorCode: 10008}, true},
		{"not leader", &jetstream.APIError{Code: 500, ErrorCode: 10009}, true},
		{"no responders", jetstream.ErrNoStreamResponse, false},
		{"no responders (core)", nats.ErrNoResponders, true},
		{"timeout", nats.ErrTimeout, true},
		{"wrapped placement", errors.Join(errors.New("ctx"), &jetstream.APIError{ErrorCode: 10005}), true},
		{"bad request", &jetstream.APIError{Code: 400, ErrorCode: 10003}, false},
		{"subjects overlap", &jetstream.APIError{Code: 400, ErrorCode: 10065}, false},
		{"other", errors.New("boom"), false},
	} {
		if got := jsstream.Transient(c.err); got != c.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// refusing is a JetStream whose first creations are refused as a forming
// cluster refuses them ("no suitable peers for placement"): a real
// server's refusal cannot be staged on cue (a killed node is noticed only
// after the meta leader's timeout, and a creation meanwhile hangs).
type refusing struct {
	jetstream.JetStream
	refusals int
	calls    int
}

func (r *refusing) CreateStream(ctx context.Context, sc jetstream.StreamConfig) (jetstream.Stream, error) {
	r.calls++
	if r.calls <= r.refusals {
		return nil, &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}
	}
	return r.JetStream.CreateStream(ctx, sc)
}

// TestStreamWaitsOutRefusals: a stream ensured while the cluster refuses
// to place it is created once it accepts, instead of failing the
// replica's start-up.
func TestStreamWaitsOutRefusals(t *testing.T) {
	c := natstest.Start(t, 1)
	js, err := jetstream.New(c.Connect(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	r := &refusing{JetStream: js, refusals: 3}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := jsstream.Stream(ctx, r, jetstream.StreamConfig{Name: "WAIT", Subjects: []string{"wait.>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatalf("Stream after 3 refusals: %v", err)
	}
	if r.calls != 4 || s.CachedInfo().Config.Name != "WAIT" {
		t.Fatalf("%d creations, stream %q; want 4 and WAIT", r.calls, s.CachedInfo().Config.Name)
	}
}

// TestEnsureBacksOff: refusals are retried at 50, 100, 200, 400, 800 ms
// and then every second until the context ends; the error names the
// attempts and keeps the refusal.
func TestEnsureBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refusal := &jetstream.APIError{Code: 503, ErrorCode: 10008}
		start := time.Now()
		var at []time.Duration
		create := func(context.Context) (int, error) {
			at = append(at, time.Since(start))
			return 0, refusal
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		_, err := jsstream.Ensure(ctx, create, create, errors.New("exists"))
		if !errors.Is(err, refusal) {
			t.Fatalf("err %v; want the refusal", err)
		}
		want := []time.Duration{0, 50, 150, 350, 750, 1550, 2550, 3550}
		for i := range want {
			want[i] *= time.Millisecond
		}
		if !slices.Equal(at, want) {
			t.Fatalf("attempts at %v; want %v", at, want)
		}
		if !strings.Contains(err.Error(), "after 8 attempts") {
			t.Fatalf("err %q does not count the attempts", err)
		}
	})
}

// TestStreamGivesUpWithTheLastRefusal: while the peers stay away, Stream
// returns when its context ends, with the refusal it kept getting.
func TestStreamGivesUpWithTheLastRefusal(t *testing.T) {
	c := natstest.Start(t, 3)
	js, err := jetstream.New(c.Connect(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	c.Kill(1)
	c.Kill(2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = jsstream.Stream(ctx, js, jetstream.StreamConfig{Name: "AWAY", Subjects: []string{"away.>"}, Storage: jetstream.MemoryStorage, Replicas: 3})
	if err == nil {
		t.Fatal("a stream of 3 replicas was placed with two nodes down")
	}
	if !jsstream.Transient(err) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stream = %v; want the transient refusal or the deadline", err)
	}
}

// TestStreamUpdatesAndRefusesAtOnce: an existing stream is updated to the
// new configuration; an invalid one is refused at once, not retried.
func TestStreamUpdatesAndRefusesAtOnce(t *testing.T) {
	c := natstest.Start(t, 1)
	js, err := jetstream.New(c.Connect(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc := jetstream.StreamConfig{Name: "UPD", Subjects: []string{"upd.>"}, Storage: jetstream.MemoryStorage, MaxMsgs: 10}
	if _, err := jsstream.Stream(ctx, js, sc); err != nil {
		t.Fatal(err)
	}
	sc.MaxMsgs = 20
	s, err := jsstream.Stream(ctx, js, sc)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxMsgs; got != 20 {
		t.Fatalf("MaxMsgs %d after the update, want 20", got)
	}
	start := time.Now()
	_, err = jsstream.Stream(ctx, js, jetstream.StreamConfig{Name: "OVERLAP", Subjects: []string{"upd.x"}, Storage: jetstream.MemoryStorage})
	if err == nil {
		t.Fatal("a stream overlapping another's subjects was created")
	}
	if jsstream.Transient(err) || ctx.Err() != nil {
		t.Fatalf("overlap: %v (ctx %v); want a refusal returned at once", err, ctx.Err())
	}
	// real time: not a timing assertion on the clock, a bound that the
	// refusal was not retried until the context's 30 s.
	if time.Since(start) > 10*time.Second {
		t.Fatalf("the refusal took %v", time.Since(start))
	}
}
