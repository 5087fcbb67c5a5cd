package tgupdates

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnguard/turnguard/internal/natstest"
	"github.com/turnguard/turnguard/internal/testwait"
)

// TestAssignSpreadsEvenly: 16 partitions over 3 members go 6/5/5, every
// partition to one member, the same for every caller; a member leaving
// hands out only what it had plus what the load bound moves.
func TestAssignSpreadsEvenly(t *testing.T) {
	members := []string{"a", "b", "c"}
	owner := assign(members, 16)
	load := map[string]int{}
	for p, m := range owner {
		if m == "" {
			t.Fatalf("partition %d has no owner", p)
		}
		load[m]++
	}
	got := []int{load["a"], load["b"], load["c"]}
	slices.Sort(got)
	if !slices.Equal(got, []int{5, 5, 6}) {
		t.Fatalf("loads %v; want 5, 5, 6", load)
	}
	if !slices.Equal(owner, assign(slices.Clone(members), 16)) {
		t.Fatal("assign is not deterministic")
	}
	two := assign([]string{"a", "b"}, 16)
	for p := range 16 {
		if two[p] == "c" {
			t.Fatalf("partition %d assigned to a departed member", p)
		}
	}
}

// TestPartitionIsStableAndInRange: a chat always maps to the same
// partition in [0, N), negative (group) ids included, and chats spread.
func TestPartitionIsStableAndInRange(t *testing.T) {
	cfg := Config{Partitions: 16}
	seen := map[int]bool{}
	for _, chat := range []int64{1, 2, 3, -1001234567890, 123456789, -5, 0, 42, 7, 99, 1000, -1000} {
		p := cfg.Partition(chat)
		if p < 0 || p >= 16 || p != cfg.Partition(chat) {
			t.Fatalf("Partition(%d) = %d", chat, p)
		}
		seen[p] = true
	}
	if len(seen) < 6 {
		t.Fatalf("12 chats fell on only %d partitions", len(seen))
	}
}

// journal records every handling, in the order handlers started, across
// the replicas of one test process.
type journal struct {
	mu      sync.Mutex
	entries []handling
}

type handling struct {
	replica  string
	id, chat int64
	delivery uint64
	at       time.Time
}

func (j *journal) add(replica string, u Update) {
	j.mu.Lock()
	defer j.mu.Unlock()
	now := time.Now()
	j.entries = append(j.entries, handling{replica, u.ID, u.ChatID, u.Delivery, now})
}

func (j *journal) snapshot() []handling {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.entries)
}

// handledAll waits until every id in want has been handled at least once.
func (j *journal) handledAll(t *testing.T, want map[int64]int64, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		seen := map[int64]bool{}
		for _, h := range j.snapshot() {
			seen[h.id] = true
		}
		if len(seen) == len(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d updates handled within %v", len(seen), len(want), d)
		}
		time.Sleep(10 * time.Millisecond) // real time: waiting on real servers and other goroutines
	}
}

// checkOrder asserts, per chat, that the handlings are the chat's updates in
// publication order, each once, except that an update a dead replica
// (dead) handled without acknowledging may come again right after.
func (j *journal) checkOrder(t *testing.T, want map[int64]int64, dead string) (redelivered int) {
	t.Helper()
	perChat := map[int64][]int64{} // chat → its ids in publication order
	ids := slices.Sorted(maps.Keys(want))
	for _, id := range ids {
		perChat[want[id]] = append(perChat[want[id]], id)
	}
	next := map[int64]int{}        // chat → index of the next expected id
	lastBy := map[int64]handling{} // chat → its last handling
	for _, h := range j.snapshot() {
		if want[h.id] != h.chat {
			t.Fatalf("update %d handled as chat %d; published for chat %d", h.id, h.chat, want[h.id])
		}
		list, i := perChat[h.chat], next[h.chat]
		switch {
		case i < len(list) && h.id == list[i]:
			next[h.chat]++
		case i > 0 && h.id == list[i-1] && lastBy[h.chat].replica == dead && dead != "":
			redelivered++ // the dead replica's unacknowledged update, again
		default:
			t.Fatalf("chat %d: update %d (delivery %d) handled by %s out of order or twice; expected %v next, last was %+v",
				h.chat, h.id, h.delivery, h.replica, list[min(i, len(list)-1)], lastBy[h.chat])
		}
		lastBy[h.chat] = h
	}
	for chat, list := range perChat {
		if next[chat] != len(list) {
			t.Fatalf("chat %d: %d of %d updates handled", chat, next[chat], len(list))
		}
	}
	return redelivered
}

// replica is one consumer replica of a test, on its own connection.
type replica struct {
	id   string
	nc   *nats.Conn
	c    *Consumer
	stop context.CancelFunc
}

func testOptions(id string) ConsumerOptions {
	return ConsumerOptions{ReplicaID: id, MemberTTL: 2 * time.Second, PinnedTTL: 2 * time.Second,
		AckWait: 3 * time.Second, RetryDelay: 100 * time.Millisecond}
}

// takeoverBound: how long a dead replica's partitions may wait — its
// membership expires (MemberTTL + a refresh), its pin expires (PinnedTTL)
// and its unacknowledged update is redelivered (AckWait) concurrently —
// plus slack for the race detector on two shared cores.
const takeoverBound = 3*time.Second + 500*time.Millisecond + 3*time.Second

func startReplica(t *testing.T, c *natstest.Cluster, node int, cfg Config, id string, h Handler) *replica {
	t.Helper()
	nc := c.Connect(t, node)
	ctx, stop := context.WithCancel(context.Background())
	cons, err := Consume(ctx, nc, cfg, h, testOptions(id))
	if err != nil {
		stop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		select {
		case <-cons.Done():
		case <-time.After(10 * time.Second):
			t.Errorf("replica %s did not stop within 10 s", id)
		}
	})
	return &replica{id: id, nc: nc, c: cons, stop: stop}
}

func newLog(t *testing.T, nc *nats.Conn, cfg Config) *Log {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := NewLog(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// publishAll publishes updates first..last (chat = id mod chats) the way a
// poller does: the offset advances only past a nil PublishUpdate; an error
// is retried. It returns the errors seen and the id → chat map.
func publishAll(t *testing.T, l *Log, first, last int64, chats int64, pace time.Duration, during func(id int64)) (int, map[int64]int64) {
	t.Helper()
	want := map[int64]int64{}
	errs := 0
	deadline := time.Now().Add(60 * time.Second)
	for id := first; id <= last; {
		if time.Now().After(deadline) {
			t.Fatalf("publishing stuck at update %d", id)
		}
		chat := 1000 + id%chats
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := l.PublishUpdate(ctx, id, chat, []byte(strconv.FormatInt(time.Now().UnixNano(), 10)))
		cancel()
		if err != nil {
			var pe *PublishError
			if !errors.As(err, &pe) || pe.UpdateID != id {
				t.Fatalf("PublishUpdate error %v is not a *PublishError for %d", err, id)
			}
			errs++
			time.Sleep(50 * time.Millisecond) // real time: a poller's retry pause
			continue
		}
		want[id] = chat
		if during != nil {
			during(id)
		}
		id++
		if pace > 0 {
			time.Sleep(pace) // real time: updates arrive over time, so a kill lands mid-stream
		}
	}
	return errs, want
}

func streamMsgs(t *testing.T, nc *nats.Conn, cfg Config) uint64 {
	t.Helper()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(t.Context(), cfg.withDefaults().Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// TestResentUpdatesAreStoredOnce: a batch published twice (a poller that
// re-fetched after a failure, a webhook retried) is stored once, and each
// update handled once.
func TestResentUpdatesAreStoredOnce(t *testing.T) {
	c := natstest.Start(t, 1)
	nc := c.Connect(t, 0)
	cfg := Config{Partitions: 4}
	l := newLog(t, nc, cfg)
	_, want := publishAll(t, l, 1, 50, 7, 0, nil)
	publishAll(t, l, 1, 50, 7, 0, nil)
	publishAll(t, l, 40, 60, 7, 0, nil)
	for id := int64(51); id <= 60; id++ {
		want[id] = 1000 + id%7
	}
	if n := streamMsgs(t, nc, cfg); n != 60 {
		t.Fatalf("the stream holds %d updates; want 60", n)
	}
	var j journal
	startReplica(t, c, 0, cfg, "r1", func(_ context.Context, u Update) error { j.add("r1", u); return nil })
	j.handledAll(t, want, 10*time.Second)
	time.Sleep(500 * time.Millisecond) // real time: room for a wrong second delivery to show
	j.checkOrder(t, want, "")
}

// TestPublishAcrossANodeKill: while the stream's leader node is SIGKILLed,
// a poller-style publisher (advance only on nil) either gets nil — and
// then the update is stored — or an error and retries: at the end every
// update is stored exactly once and handled once, in order per chat.
func TestPublishAcrossANodeKill(t *testing.T) {
	c := natstest.Start(t, 3)
	cfg := Config{Partitions: 8, Replicas: 3}
	nc := c.Connect(t, 0)
	l := newLog(t, nc, cfg)
	js, _ := jetstream.New(nc)
	killed := -1
	errs, want := publishAll(t, l, 1, 300, 20, time.Millisecond, func(id int64) {
		if id != 100 {
			return
		}
		s, err := js.Stream(t.Context(), "TG_UPDATES")
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		killed, _ = strconv.Atoi(info.Cluster.Leader[1:]) // natstest names nodes n0, n1, n2
		c.Kill(killed)
	})
	t.Logf("killed node %d (the stream leader) at update 100; %d publishes failed and were retried", killed, errs)
	if n := streamMsgs(t, nc, cfg); n != 300 {
		t.Fatalf("the stream holds %d updates; want 300", n)
	}
	// Consume creates R3 assets (the partitions' consumers, the members
	// bucket), which need three live nodes.
	c.Restart(killed)
	var j journal
	h := func(_ context.Context, u Update) error { j.add("r", u); return nil }
	startReplica(t, c, killed, cfg, "r", h)
	j.handledAll(t, want, 20*time.Second)
	j.checkOrder(t, want, "")
}

// TestChatOrderAcrossAReplicaKilledMidStream: three replicas on three
// nodes share 16 partitions (5/5/6, disjoint); one is killed mid-update
// (its handler never returns, its connection is closed) while updates keep
// coming. Every update is handled; per chat in order; none twice except
// the dead replica's unacknowledged ones, once more, right after; and the
// dead replica's partitions are taken over within the bound.
func TestChatOrderAcrossAReplicaKilledMidStream(t *testing.T) {
	c := natstest.Start(t, 3)
	cfg := Config{Partitions: 16, Replicas: 3}
	var j journal
	var victimMu sync.Mutex
	armed := false
	inHandler := make(chan struct{})
	never := make(chan struct{}) // closed at cleanup, before the replicas stop (cleanups run last first)
	handler := func(id string) Handler {
		return func(_ context.Context, u Update) error {
			j.add(id, u)
			if id == "r2" {
				victimMu.Lock()
				a := armed
				armed = false
				victimMu.Unlock()
				if a {
					close(inHandler)
					<-never // dead mid-update: never returns, never acknowledges
					return errors.New("dead")
				}
			}
			time.Sleep(time.Millisecond) // real time: a handler's work
			return nil
		}
	}
	reps := []*replica{
		startReplica(t, c, 0, cfg, "r1", handler("r1")),
		startReplica(t, c, 1, cfg, "r2", handler("r2")),
		startReplica(t, c, 2, cfg, "r3", handler("r3")),
	}
	t.Cleanup(func() { close(never) })
	// The partitions settle to a disjoint 5/5/6 cover.
	deadline := time.Now().Add(10 * time.Second)
	for {
		all := map[int]int{}
		var loads []int
		for _, r := range reps {
			ps := r.c.Partitions()
			loads = append(loads, len(ps))
			for _, p := range ps {
				all[p]++
			}
		}
		slices.Sort(loads)
		ok := len(all) == 16 && slices.Equal(loads, []int{5, 5, 6})
		for _, n := range all {
			ok = ok && n == 1
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partitions did not settle to a disjoint 5/5/6 cover: %v", all)
		}
		time.Sleep(20 * time.Millisecond) // real time: replicas re-read membership every 500 ms
	}
	l := newLog(t, c.Connect(t, 0), cfg)
	var killedAt time.Time
	var victimParts []int
	killed := make(chan struct{})
	go func() { // the kill, while the publisher goes on
		defer close(killed)
		<-inHandler
		victimParts = reps[1].c.Partitions()
		reps[1].nc.Close()
		killedAt = time.Now()
	}()
	_, want := publishAll(t, l, 1, 400, 40, 2*time.Millisecond, func(id int64) {
		if id == 100 {
			victimMu.Lock()
			armed = true
			victimMu.Unlock()
		}
	})
	select {
	case <-killed:
	case <-time.After(10 * time.Second):
		t.Fatal("the victim handled nothing after update 100")
	}
	j.handledAll(t, want, 30*time.Second)
	redelivered := j.checkOrder(t, want, "r2")
	if redelivered == 0 {
		t.Fatal("the update the victim died on was not handled again")
	}
	var took time.Duration = -1
	for _, h := range j.snapshot() {
		if h.at.After(killedAt) && h.replica != "r2" && slices.Contains(victimParts, (Config{Partitions: 16}).Partition(h.chat)) {
			took = h.at.Sub(killedAt)
			break
		}
	}
	if took < 0 || took > takeoverBound {
		t.Fatalf("the victim's partitions were taken over after %v; want within %v", took, takeoverBound)
	}
	t.Logf("victim r2 owned %v; taken over %v after the kill; %d update(s) handled again", victimParts, took, redelivered)
	perReplica := map[string]int{}
	for _, h := range j.snapshot() {
		perReplica[h.replica]++
	}
	if len(perReplica) != 3 {
		t.Fatalf("handlings per replica %v; want all three", perReplica)
	}
}

// TestCleanStopHandsOverAtOnce: a replica that stops (its context ends)
// finishes its update in hand, unpins and leaves: the other takes every
// partition within a second or two, not the TTLs, and nothing is handled
// twice.
func TestCleanStopHandsOverAtOnce(t *testing.T) {
	c := natstest.Start(t, 1)
	cfg := Config{Partitions: 4}
	var j journal
	h := func(id string) Handler {
		return func(_ context.Context, u Update) error { j.add(id, u); return nil }
	}
	a := startReplica(t, c, 0, cfg, "a", h("a"))
	b := startReplica(t, c, 0, cfg, "b", h("b"))
	l := newLog(t, c.Connect(t, 0), cfg)
	_, want := publishAll(t, l, 1, 40, 8, 0, nil)
	j.handledAll(t, want, 10*time.Second)
	a.stop()
	<-a.c.Done()
	stopped := time.Now()
	for len(b.c.Partitions()) != 4 {
		if time.Since(stopped) > 2*time.Second {
			t.Fatalf("b has %v two seconds after a stopped", b.c.Partitions())
		}
		time.Sleep(10 * time.Millisecond) // real time: b re-reads membership every 500 ms
	}
	_, more := publishAll(t, l, 41, 80, 8, 0, nil)
	for id, chat := range more {
		want[id] = chat
	}
	j.handledAll(t, want, 10*time.Second)
	j.checkOrder(t, want, "")
	t.Logf("b took all partitions %v after a stopped", time.Since(stopped))
}

// BenchmarkUpdatePath measures PublishUpdate → handler through a real
// 3-node cluster (stream R3, file storage): a publisher on node 0 at a
// fixed rate over 1,000 chats, three replicas consuming 16 partitions.
//
//	go test -run '^$' -bench UpdatePath -benchtime 1x ./cluster/tgupdates/
func BenchmarkUpdatePath(b *testing.B) {
	for _, rate := range []int{100, 500, 1000} {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			benchPath(b, rate)
		})
	}
}

func benchPath(b *testing.B, rate int) {
	c := natstest.Start(b, 3)
	cfg := Config{Partitions: 16, Replicas: 3}
	var mu sync.Mutex
	var lat []time.Duration
	for i := range 3 {
		nc := c.Connect(b, i)
		ctx, stop := context.WithCancel(context.Background())
		b.Cleanup(stop)
		_, err := Consume(ctx, nc, cfg, func(_ context.Context, u Update) error {
			ns, _ := strconv.ParseInt(string(u.Raw), 10, 64)
			d := time.Since(time.Unix(0, ns))
			mu.Lock()
			lat = append(lat, d)
			mu.Unlock()
			return nil
		}, testOptions("r"+strconv.Itoa(i)))
		if err != nil {
			b.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := NewLog(ctx, c.Connect(b, 0), cfg)
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Second) // real time: the replicas settle their partitions
	const seconds = 5
	n := rate * seconds
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
			time.Sleep(d) // real time: the publisher's pace
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			raw := []byte(strconv.FormatInt(time.Now().UnixNano(), 10))
			if err := l.PublishUpdate(ctx, int64(i+1), int64(i%1000), raw); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		got := len(lat)
		mu.Unlock()
		if got >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // real time: waiting for the last handlings
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lat) < n {
		b.Fatalf("%d of %d updates handled", len(lat), n)
	}
	slices.Sort(lat)
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	b.ReportMetric(float64(len(lat)), "handled")
}

// TestReplicasStartingTogether: three replicas on three nodes set the
// stream, its consumers and the members bucket up at the same moment (a
// cluster's start): each does at once — none waits out a timeout — and an
// update published then is handled.
func TestReplicasStartingTogether(t *testing.T) {
	c := natstest.Start(t, 3)
	cfg := Config{Partitions: 4, Replicas: 3}
	var handled atomic.Int64
	h := func(context.Context, Update) error { handled.Add(1); return nil }
	var wg sync.WaitGroup
	took := make([]time.Duration, 3)
	for i := range 3 {
		nc := c.Connect(t, i)
		wg.Go(func() {
			ctx, stop := context.WithCancel(context.Background())
			t.Cleanup(stop)
			t0 := time.Now()
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if _, err := NewLog(lctx, nc, cfg); err != nil {
				t.Errorf("replica %d: %v", i, err)
				return
			}
			if _, err := Consume(ctx, nc, cfg, h, testOptions("r"+strconv.Itoa(i))); err != nil {
				t.Errorf("replica %d: %v", i, err)
				return
			}
			took[i] = time.Since(t0)
		})
	}
	wg.Wait()
	for i, d := range took {
		if d > 3*time.Second { // a lost creation race waits out the 5 s API timeout
			t.Errorf("replica %d took %v to set up; want well under the API timeout", i, d)
		}
	}
	l := newLog(t, c.Connect(t, 0), cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.PublishUpdate(ctx, 1, 42, []byte(`{"update_id":1}`)); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 20*time.Second, "the update handled", func() bool { return handled.Load() == 1 })
}
