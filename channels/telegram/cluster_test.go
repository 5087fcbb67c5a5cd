package telegram

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnguard/turnguard/cluster/busauth"
	"github.com/turnguard/turnguard/cluster/lease"
	"github.com/turnguard/turnguard/cluster/tgupdates"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"

	"github.com/turnguard/turnguard/internal/natstest"
	"github.com/turnguard/turnguard/internal/testwait"
)

// These tests run replicas of the channel — each its own engine, channel
// and NATS connection — against one real nats-server and one fake Bot API,
// on the real clock (a synctest bubble cannot hold sockets to a server).

const (
	clusterPollerTTL = 2 * time.Second
	clusterWait      = 60 * time.Second // generous bound on a loaded machine; the real bounds are asserted apart
	clusterSecret    = "cluster-webhook-secret"
)

// leaseLeader is the Leader a replica gets from cluster/node: the poller
// lease of cluster/lease, on the replica's own connection.
type leaseLeader struct {
	nc *nats.Conn
	id string
}

func (l leaseLeader) Lead(ctx context.Context, name string, ttl time.Duration, fn func(ctx context.Context)) error {
	js, err := jetstream.New(l.nc)
	if err != nil {
		return fmt.Errorf("lead %s: %w", name, err)
	}
	kv, err := lease.EnsureBucket(ctx, js, lease.BucketConfig{Bucket: "TG_TEST_LEASES", TTL: ttl})
	if err != nil {
		return fmt.Errorf("lead %s: %w", name, err)
	}
	cand, err := lease.Campaign(ctx, kv, name, l.id, lease.Options{})
	if err != nil {
		return fmt.Errorf("lead %s: %w", name, err)
	}
	defer func() { <-cand.Done() }()
	for {
		term, err := cand.Await(ctx)
		if err != nil {
			return nil // ctx ended, or the campaign did
		}
		fctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-term.Lost():
			case <-fctx.Done():
			}
			cancel()
		}()
		fn(fctx)
		cancel()
		select { // compete again once this term has ended
		case <-term.Lost():
		case <-ctx.Done():
			return nil
		}
	}
}

// replica is one gateway replica's Telegram channel.
type replica struct {
	id   string
	eng  *gateway.Engine
	demo *demo.Runner
	ch   *Channel
	tr   *memTransport
	nc   *nats.Conn

	stopRun context.CancelFunc
	runDone chan error
	once    sync.Once
}

type clusterRig struct {
	t    *testing.T
	nats *natstest.Cluster
	api  *fakeAPI
	logs *syncBuffer
	mode string
	reps []*replica

	mu      sync.Mutex
	handled map[int64][]string // update id → the replicas that handled it
}

func newClusterRig(t *testing.T, mode string) *clusterRig {
	r := &clusterRig{t: t, nats: natstest.Start(t, 1), api: newFakeAPI(testToken), logs: &syncBuffer{}, mode: mode,
		handled: map[int64][]string{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replicas' logs:\n%s", r.logs.String())
		}
	})
	return r
}

// start runs a replica: Run until its stop (or the test's end).
func (r *clusterRig) start(id string) *replica {
	t := r.t
	t.Helper()
	c := testConfig(func(c *config.Config) {
		if r.mode == config.TelegramWebhook {
			c.Channels.Telegram.Mode, c.Channels.Telegram.WebhookSecret = config.TelegramWebhook, clusterSecret
		}
	})
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	src := config.NewSource(c)
	log := slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("replica", id)
	rp := &replica{id: id, demo: demo.New(), tr: &memTransport{h: r.api}, nc: r.nats.Connect(t, 0), runDone: make(chan error, 1)}
	// The update stream signed and verified as a gateway's is (cmd/gateway).
	key, err := busauth.New([]byte("telegram-cluster-tests-secret-0123456789"), id)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := gateway.New(gateway.Options{Config: src, Runners: map[string]runner.Runner{"demo": rp.demo}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	eng.Start(context.Background())
	rp.eng = eng
	rp.ch, err = New(eng, src, Options{Log: log, HTTPClient: &http.Client{Transport: rp.tr}, PollTimeout: 2 * time.Second,
		Cluster: &Cluster{
			Conn: rp.nc, ReplicaID: id, Leader: leaseLeader{nc: rp.nc, id: id}, PollerTTL: clusterPollerTTL,
			Updates:  tgupdates.Config{Partitions: 4, Sign: key.Sign, Verify: key.VerifyStored},
			Consumer: tgupdates.ConsumerOptions{MemberTTL: 2 * time.Second, PinnedTTL: 2 * time.Second, AckWait: 3 * time.Second, RetryDelay: 200 * time.Millisecond},
		}})
	if err != nil {
		t.Fatal(err)
	}
	rp.ch.onStoredHandled = func(u tgupdates.Update) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.handled[u.ID] = append(r.handled[u.ID], id)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rp.stopRun = cancel
	go func() { rp.runDone <- rp.ch.Run(ctx) }()
	r.reps = append(r.reps, rp)
	t.Cleanup(func() { r.stop(rp) })
	return rp
}

// stop shuts a replica down as the gateway does.
func (r *clusterRig) stop(rp *replica) {
	rp.once.Do(func() {
		rp.stopRun()
		select {
		case err := <-rp.runDone:
			if err != nil {
				r.t.Errorf("%s: Run: %v", rp.id, err)
			}
		case <-time.After(30 * time.Second): // real time: bounding a hang
			r.t.Errorf("%s: Run did not return after its context ended", rp.id)
		}
		rp.demo.Release()
		rp.eng.Shutdown(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rp.ch.Close(ctx); err != nil {
			r.t.Errorf("%s: Close: %v", rp.id, err)
		}
		if strings.Contains(r.logs.String(), testToken) {
			r.t.Errorf("the bot token is in the logs")
		}
	})
}

// crash makes a replica vanish as a killed process does: its NATS
// connection closes (its lease and membership are no longer renewed, its
// pins lapse) and it reaches Telegram no more. Nothing is released.
func (r *clusterRig) crash(rp *replica) {
	rp.tr.setFail(func(*http.Request) error { return errors.New("dial tcp: the process is dead") })
	rp.nc.Close()
}

// pollers returns the replicas polling now.
func (r *clusterRig) pollers() []string {
	var out []string
	for _, rp := range r.reps {
		if rp.ch.Polling() {
			out = append(out, rp.id)
		}
	}
	return out
}

// awaitPoller waits until exactly one replica other than old polls.
func (r *clusterRig) awaitPoller(old string) string {
	r.t.Helper()
	var got string
	testwait.Until(r.t, clusterWait, "one replica polling", func() bool {
		ps := r.pollers()
		if len(ps) > 1 {
			r.t.Fatalf("two replicas poll at once: %v", ps)
		}
		if len(ps) == 1 && ps[0] != old {
			got = ps[0]
			return true
		}
		return false
	})
	return got
}

// awaitSpread waits until the partitions are spread over the live
// replicas (each consumes some).
func (r *clusterRig) awaitSpread(live ...*replica) {
	r.t.Helper()
	testwait.Until(r.t, clusterWait, "the partitions spread over the replicas", func() bool {
		n := 0
		for _, rp := range live {
			cons := rp.ch.consumer.Load()
			if cons == nil || len(cons.Partitions()) == 0 {
				return false
			}
			n += len(cons.Partitions())
		}
		return n == 4
	})
}

// replies is what chat shows that the test's messages asked for ("reply
// N-K" for its K-th message), in order.
func (r *clusterRig) replies(chat int64) []string {
	var out []string
	for _, s := range r.api.screen(chat) {
		if strings.HasPrefix(s, "reply ") {
			out = append(out, s)
		}
	}
	return out
}

func replyText(chat int64, k int) string { return fmt.Sprintf("reply %d-%d", chat, k) }

func askText(chat int64, k int) string { return fmt.Sprintf("/steps say:reply_%d-%d", chat, k) }

// awaitReplies waits until each chat shows exactly its replies 1…n, in
// order, then until the stream holds no unhandled update, and checks again:
// no update was handled twice.
func (r *clusterRig) awaitReplies(chats []int64, n int) {
	r.t.Helper()
	want := func(chat int64) []string {
		var w []string
		for k := 1; k <= n; k++ {
			w = append(w, replyText(chat, k))
		}
		return w
	}
	testwait.Until(r.t, clusterWait, "every chat's replies", func() bool {
		for _, chat := range chats {
			if got := r.replies(chat); !slices.Equal(got, want(chat)) {
				if len(got) > n || (len(got) > 0 && !slices.Equal(got, want(chat)[:min(len(got), n)])) {
					r.t.Fatalf("chat %d shows %q; want %q (in order, once each)\nlogs:\n%s", chat, got, want(chat), r.logs.String())
				}
				return false
			}
		}
		return true
	})
	r.awaitStreamEmpty()
	for _, chat := range chats {
		if got := r.replies(chat); !slices.Equal(got, want(chat)) {
			r.t.Errorf("chat %d shows %q; want %q (in order, once each)", chat, got, want(chat))
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.handled) != len(chats)*n {
		r.t.Errorf("%d updates handled; want %d", len(r.handled), len(chats)*n)
	}
	for id, by := range r.handled {
		if len(by) != 1 {
			r.t.Errorf("update %d handled %d times, by %v", id, len(by), by)
		}
	}
}

// awaitStreamEmpty waits until every stored update was handled and
// acknowledged (the work-queue stream removes those).
func (r *clusterRig) awaitStreamEmpty() {
	r.t.Helper()
	nc := r.nats.Connect(r.t, 0)
	js, err := jetstream.New(nc)
	if err != nil {
		r.t.Fatal(err)
	}
	testwait.NoError(r.t, clusterWait, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, "TG_UPDATES")
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 0 {
			return fmt.Errorf("%d updates still in the stream", info.State.Msgs)
		}
		return nil
	})
}

// confirmed reports whether Telegram (the fake) holds no update any more:
// the poller's offset moved past every one.
func (r *clusterRig) confirmed() bool {
	r.api.mu.Lock()
	defer r.api.mu.Unlock()
	return len(r.api.updates) == 0
}

var clusterChats = []int64{alice, bob, 1003, 1004, 1005, 1006}

// TestClusterPolling: one replica polls; each update polled reaches
// exactly one replica and every chat's updates are handled in order.
func TestClusterPolling(t *testing.T) {
	r := newClusterRig(t, config.TelegramPolling)
	a, b := r.start("replica-a"), r.start("replica-b")
	r.awaitPoller("")
	r.awaitSpread(a, b)
	const n = 3
	for k := 1; k <= n; k++ {
		for _, chat := range clusterChats {
			r.api.say(chat, askText(chat, k))
		}
	}
	r.awaitReplies(clusterChats, n)
	testwait.Until(t, clusterWait, "the poller to confirm every update to Telegram", r.confirmed)
	var sentBy []string
	for _, rp := range r.reps {
		if rp.tr.sendCount() > 0 {
			sentBy = append(sentBy, rp.id)
		}
	}
	if len(sentBy) != 2 {
		t.Errorf("replies sent by %v; want both replicas (the partitions are spread)", sentBy)
	}
}

// TestClusterPollerFailover: the polling replica dies (no goodbye: its
// lease is left to expire); another polls within the lease's TTL, and the
// updates sent around the death are each handled once, in order.
func TestClusterPollerFailover(t *testing.T) {
	for _, how := range []string{"crash", "shutdown"} {
		t.Run(how, func(t *testing.T) {
			r := newClusterRig(t, config.TelegramPolling)
			reps := map[string]*replica{}
			for _, id := range []string{"replica-a", "replica-b"} {
				reps[id] = r.start(id)
			}
			leader := r.awaitPoller("")
			r.awaitSpread(reps["replica-a"], reps["replica-b"])
			for _, chat := range clusterChats {
				r.api.say(chat, askText(chat, 1))
			}
			r.awaitReplies(clusterChats, 1)

			died := time.Now()
			if how == "crash" {
				r.crash(reps[leader])
			} else {
				go r.stop(reps[leader])
			}
			for _, chat := range clusterChats { // sent while no one polls
				r.api.say(chat, askText(chat, 2))
			}
			next := r.awaitPoller(leader)
			took := time.Since(died)
			t.Logf("%s died; %s polls %v later", leader, next, took)
			if took > clusterPollerTTL+time.Second {
				t.Errorf("%s polls %v after %s died; want within the lease TTL (%v) + 1 s", next, took, leader, clusterPollerTTL)
			}
			for _, chat := range clusterChats {
				r.api.say(chat, askText(chat, 3))
			}
			r.awaitReplies(clusterChats, 3)
			testwait.Until(t, clusterWait, "the new poller to confirm every update to Telegram", r.confirmed)
		})
	}
}

// TestClusterWebhook: any replica receiving the webhook stores the update
// and answers 200 once it is stored; the replica consuming the chat's
// partition handles it, in order, once — also when Telegram sends an
// update again through another replica. A replica that cannot store it
// answers 500, so Telegram sends it again.
func TestClusterWebhook(t *testing.T) {
	r := newClusterRig(t, config.TelegramWebhook)
	a, b := r.start("replica-a"), r.start("replica-b")
	r.awaitSpread(a, b)
	post := func(rp *replica, body string) int {
		req := httptest.NewRequest(http.MethodPost, "/telegram/webhook", strings.NewReader(body))
		req.Header.Set(SecretHeader, clusterSecret)
		rec := httptest.NewRecorder()
		rp.ch.WebhookHandler().ServeHTTP(rec, req)
		return rec.Code
	}
	update := func(id int64, chat int64, k int) string {
		return fmt.Sprintf(`{"update_id":%d,"message":{"message_id":%d,"date":1,"chat":{"id":%d,"type":"private"},"from":{"id":%d,"first_name":"U"},"text":%q}}`,
			id, id, chat, chat, askText(chat, k))
	}
	testwait.Until(t, clusterWait, "both replicas accepting webhooks", func() bool {
		return a.ch.ready.Load() && b.ch.ready.Load()
	})
	const n = 3
	id := int64(500)
	for k := 1; k <= n; k++ {
		for i, chat := range clusterChats {
			id++
			body := update(id, chat, k)
			via := []*replica{a, b}[(i+k)%2]
			if code := post(via, body); code != http.StatusOK {
				t.Fatalf("webhook on %s: status %d, want 200", via.id, code)
			}
			if k == 2 { // Telegram did not get our 200 and sends it again, here through the other replica
				other := []*replica{a, b}[(i+k+1)%2]
				if code := post(other, body); code != http.StatusOK {
					t.Fatalf("webhook resent on %s: status %d, want 200", other.id, code)
				}
			}
		}
	}
	r.awaitReplies(clusterChats, n)

	r.crash(a)
	if code := post(a, update(id+1, alice, n+1)); code != http.StatusInternalServerError {
		t.Errorf("webhook on a replica without NATS: status %d, want 500", code)
	}
	if got := r.replies(alice); len(got) != n {
		t.Errorf("alice shows %q after a refused webhook", got)
	}
}
