package lease_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnguard/turnguard/cluster/lease"
	"github.com/turnguard/turnguard/internal/natstest"
)

const testTTL = 2 * time.Second

func bucket(t testing.TB, nc *nats.Conn, replicas int) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := lease.EnsureBucket(ctx, js, lease.BucketConfig{Bucket: "tg_leases", TTL: testTTL, Replicas: replicas})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// pool is a set of candidates for one lease, each on its own connection;
// every renewal checks that no other candidate believes it leads.
type pool struct {
	t     testing.TB
	c     *natstest.Cluster
	mu    sync.Mutex
	cands map[string]*lease.Candidate
	conns map[string]*nats.Conn
	n     int
}

func newPool(t testing.TB, c *natstest.Cluster) *pool {
	return &pool{t: t, c: c, cands: map[string]*lease.Candidate{}, conns: map[string]*nats.Conn{}}
}

// add starts a candidate connected to node i.
func (p *pool) add(ctx context.Context, i int) string {
	p.t.Helper()
	p.mu.Lock()
	p.n++
	id := "replica-" + strconv.Itoa(p.n)
	p.mu.Unlock()
	nc := p.c.Connect(p.t, i)
	kv := bucket(p.t, nc, p.c.Size())
	var self *lease.Candidate
	cand, err := lease.Campaign(ctx, kv, "telegram-poller", id, lease.Options{OnRenew: func(uint64) {
		p.mu.Lock()
		defer p.mu.Unlock()
		for o, c := range p.cands {
			if c != self && c.Leading() {
				p.t.Errorf("%s renewed while %s leads", id, o)
			}
		}
	}})
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	self = cand
	p.cands[id] = cand
	p.conns[id] = nc
	p.mu.Unlock()
	return id
}

// leaders returns the candidates that believe they lead now.
func (p *pool) leaders() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for id, c := range p.cands {
		if c.Leading() {
			out = append(out, id)
		}
	}
	return out
}

// awaitLeader polls until exactly one candidate other than old leads,
// failing past d or if two ever lead at once.
func (p *pool) awaitLeader(old string, d time.Duration) string {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ls := p.leaders()
		if len(ls) > 1 {
			p.t.Fatalf("two leaders at once: %v", ls)
		}
		if len(ls) == 1 && ls[0] != old {
			return ls[0]
		}
		time.Sleep(time.Millisecond) // real time: polling real servers' state
	}
	p.t.Fatalf("no new leader (other than %q) within %v", old, d)
	return ""
}

// threeCandidates starts a three-node cluster and a candidate on each
// node, and returns once one leads.
func threeCandidates(ctx context.Context, t testing.TB) (*pool, string) {
	t.Helper()
	p := newPool(t, natstest.Start(t, 3))
	for i := range 3 {
		p.add(ctx, i)
	}
	return p, p.awaitLeader("", failoverBound)
}

// kill closes id's connection: to NATS, the holder is gone.
func (p *pool) kill(id string) {
	p.mu.Lock()
	nc := p.conns[id]
	p.mu.Unlock()
	nc.Close()
}

// failoverBound is the longest a takeover may take after the holder died:
// its key lives TTL after its last renewal (≤ the kill), a follower tries
// every TTL/10, and the servers and the race detector get a second.
const failoverBound = testTTL + testTTL/10 + time.Second

// TestLeaderFailoverOnThreeNodes: three candidates on three nodes; the
// leader's connection is closed three times over; each time exactly one
// other candidate leads within the bound, and no renewal anywhere happens
// while another candidate believes it leads.
func TestLeaderFailoverOnThreeNodes(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	p, leader := threeCandidates(ctx, t)
	for range 3 {
		time.Sleep(testTTL / 2) // real time: let the leader renew a couple of times
		p.kill(leader)
		killed := time.Now()
		next := p.awaitLeader(leader, failoverBound)
		t.Logf("%s killed → %s leads after %v", leader, next, time.Since(killed))
		p.add(ctx, 0)
		leader = next
	}
}

// TestResignHandsOverAtOnce: a leader whose campaign ends deletes its key,
// so the next leader need not wait for the TTL.
func TestResignHandsOverAtOnce(t *testing.T) {
	c := natstest.Start(t, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	nc := c.Connect(t, 0)
	kv := bucket(t, nc, 1)
	actx, resign := context.WithCancel(ctx)
	a, err := lease.Campaign(actx, kv, "p", "a", lease.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Await(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := lease.Campaign(ctx, kv, "p", "b", lease.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if h, err := lease.Holder(ctx, kv, "p"); err != nil || h != "a" {
		t.Fatalf("Holder = %q, %v; want a", h, err)
	}
	resign()
	<-a.Done()
	from := time.Now()
	wctx, wcancel := context.WithTimeout(ctx, testTTL/2)
	defer wcancel()
	if _, err := b.Await(wctx); err != nil {
		t.Fatalf("b did not lead within TTL/2 of a's resignation: %v", err)
	}
	t.Logf("handed over in %v", time.Since(from))
}

// TestCampaignRefusesABucketWithoutTTL: keys that never expire cannot hold
// a lease.
func TestCampaignRefusesABucketWithoutTTL(t *testing.T) {
	c := natstest.Start(t, 1)
	nc := c.Connect(t, 0)
	js, _ := jetstream.New(nc)
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "forever"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease.Campaign(t.Context(), kv, "p", "a", lease.Options{}); err == nil || !strings.Contains(err.Error(), "no TTL") {
		t.Fatalf("Campaign on a bucket without TTL: %v", err)
	}
}

// The holder as a process of its own: TestLeaderProcessKilled runs this
// test binary again with envChild set; the child campaigns and prints
// "leading" when elected and "renewed <unix ns>" after every renewal.
const envChild = "TURNGUARD_LEASE_CHILD"

func TestMain(m *testing.M) {
	if url := os.Getenv(envChild); url != "" {
		os.Exit(child(url))
	}
	os.Exit(m.Run())
}

func child(url string) int {
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	kv, err := lease.EnsureBucket(ctx, js, lease.BucketConfig{Bucket: "tg_leases", TTL: testTTL, Replicas: 3})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	var mu sync.Mutex
	cand, err := lease.Campaign(ctx, kv, "telegram-poller", "child", lease.Options{OnRenew: func(uint64) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Println("renewed", time.Now().UnixNano())
	}})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	if _, err := cand.Await(ctx); err != nil {
		fmt.Println("error", err)
		return 1
	}
	mu.Lock()
	fmt.Println("leading", time.Now().UnixNano())
	mu.Unlock()
	select {}
}

// TestLeaderProcessKilled: the leader is a process of its own, SIGKILLed
// mid-term; a candidate in this process leads within the bound, and not
// before the dead holder's term would have ended (its last renewal +
// GiveUpAfter), so the two never both believed they led.
func TestLeaderProcessKilled(t *testing.T) {
	c := natstest.Start(t, 3)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+strings.Join(c.URLs(), ","))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var lastRenewal time.Time
	renewals := 0
	timeout := time.After(30 * time.Second)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var me *lease.Candidate
	for renewals < 3 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the child ended")
			}
			f := strings.Fields(l)
			switch f[0] {
			case "error":
				t.Fatalf("child: %s", l)
			case "leading":
				nc := c.Connect(t, 1)
				me, err = lease.Campaign(ctx, bucket(t, nc, 3), "telegram-poller", "parent", lease.Options{})
				if err != nil {
					t.Fatal(err)
				}
			case "renewed":
				ns, _ := strconv.ParseInt(f[1], 10, 64)
				lastRenewal = time.Unix(0, ns)
				renewals++
			}
		case <-timeout:
			t.Fatal("the child did not lead and renew within 30 s")
		}
	}
	if me.Leading() {
		t.Fatal("the parent leads while the child renews")
	}
	_ = cmd.Process.Kill()
	killed := time.Now()
	// Renewals printed before the kill but not yet read still count.
	for l := range lines {
		if f := strings.Fields(l); f[0] == "renewed" {
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			lastRenewal = time.Unix(0, ns)
		}
	}
	wctx, wcancel := context.WithTimeout(ctx, failoverBound)
	defer wcancel()
	if _, err := me.Await(wctx); err != nil {
		t.Fatalf("no new leader within %v of the kill: %v", failoverBound, err)
	}
	now := time.Now()
	if giveUp := lastRenewal.Add(testTTL * 3 / 4); now.Before(giveUp) {
		t.Fatalf("the parent led %v before the child's term would have ended", giveUp.Sub(now))
	}
	t.Logf("SIGKILL → new leader in %v (%v after the child's last renewal)", now.Sub(killed), now.Sub(lastRenewal))
}

// BenchmarkFailover measures kill → new leader over 20 kills: three
// candidates on three nodes of a real cluster, TTL 2 s (RenewEvery 500
// ms, GiveUpAfter 1.5 s, RetryEvery 200 ms); the leader's connection is
// closed (to NATS, exactly a dead process) and a fresh candidate joins.
//
//	go test -run '^$' -bench Failover -benchtime 1x ./cluster/lease/
func BenchmarkFailover(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, leader := threeCandidates(ctx, b)
	var took []time.Duration
	for range b.N {
		for k := range 20 {
			time.Sleep(time.Duration(k%5) * testTTL / 10) // real time: kill at varying points between renewals
			p.kill(leader)
			killed := time.Now()
			next := p.awaitLeader(leader, failoverBound)
			took = append(took, time.Since(killed))
			p.add(ctx, k%3)
			leader = next
		}
	}
	slices.Sort(took)
	q := func(f float64) float64 { return float64(took[int(f*float64(len(took)-1))].Milliseconds()) }
	b.ReportMetric(q(0.5), "failover-p50-ms")
	b.ReportMetric(q(0.99), "failover-p99-ms")
	b.ReportMetric(q(1), "failover-max-ms")
	b.ReportMetric(float64(len(took)), "kills")
}
