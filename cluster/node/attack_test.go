package node

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnguard/turnguard/cluster/busauth"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/internal/natstest"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/testwait"
)

// The cluster bus is a trust boundary (issue 19): these tests are the
// attacks of its report, by a local process that can reach NATS, against
// real nats-server processes started with the replicas' authorization.

// outsider has credentials but no replica's rights: it may only use its
// own inbox (a monitoring tool's account, say).
var outsider = busauth.User{Name: "outsider", Password: "outsider-pw", Publish: []string{"_INBOX.>"}, Subscribe: []string{"_INBOX.>"}}

// recorder is an engine that records what it was asked to do.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) note(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, s)
}

func (r *recorder) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func (r *recorder) Send(_ context.Context, req gateway.SendRequest) (gateway.Ack, error) {
	r.note("send " + req.SessionKey)
	return gateway.Ack{RunID: req.RunID}, nil
}

func (r *recorder) Abort(_ context.Context, key, _ string, _ event.StopReason, _ string, operator bool) (gateway.AbortResult, error) {
	r.note("abort " + key)
	return gateway.AbortResult{}, nil
}

func (r *recorder) Resolve(_ context.Context, req gateway.ResolveRequest) (gateway.ResolveResult, error) {
	r.note("resolve " + req.ApprovalID)
	return gateway.ResolveResult{}, nil
}

func (r *recorder) StopWith(_ context.Context, req gateway.StopRequest) (gateway.StopResult, error) {
	r.note("stop " + req.SessionKey)
	return gateway.StopResult{}, nil
}

func (r *recorder) Status(key string) gateway.TurnStatus {
	r.note("status " + key)
	return gateway.TurnStatus{SessionKey: key}
}

// attackRig is replicas a and b (a serving a recorder) on a NATS server
// that admits the two replicas and the outsider.
func attackRig(t *testing.T) (*natstest.Cluster, *Node, *Node, *recorder) {
	t.Helper()
	c := natstest.StartAuth(t, 1, []busauth.User{replicaUser("a"), replicaUser("b"), outsider})
	dbURL := pgtest.New(t)
	a, b := start(t, dbURL, c, "a"), start(t, dbURL, c, "b")
	rec := &recorder{}
	a.Serve(rec)
	return c, a, b, rec
}

// dial connects to c as user (nil: with no credentials), collecting the
// asynchronous errors the server sends (permission violations).
func dial(t *testing.T, c *natstest.Cluster, user *busauth.User, extra ...nats.Option) (*nats.Conn, <-chan error, error) {
	t.Helper()
	errs := make(chan error, 16)
	opts := []nats.Option{nats.NoReconnect(), nats.Timeout(2 * time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		})}
	if user != nil {
		opts = append(opts, nats.UserInfo(user.Name, user.Password))
	}
	nc, err := nats.Connect(c.URL(0), append(opts, extra...)...)
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, errs, err
}

// violation waits for a permission violation on errs.
func violation(t *testing.T, errs <-chan error, what string) {
	t.Helper()
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("%s: got %v, want a permissions violation", what, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the server did not refuse it", what)
	}
}

// The forged requests of the report, each as an outsider would write it:
// the operator flag set, someone else's name as the owner or requester.
var forgeries = []struct {
	op   string
	body any
}{
	{"resolve", resolveBody{ResolveRequest: gateway.ResolveRequest{ApprovalID: "ap-1", OptionID: "allow", SessionKey: "tg:1", By: "@admin", Operator: true}}},
	{"abort", abortBody{AbortRequest: gateway.AbortRequest{SessionKey: "tg:1", Reason: event.ReasonUser, Requester: "tg:1", Operator: true}}},
	{"send", sendBody{SessionKey: "tg:1", Channel: "telegram", ChatRef: "1", RunID: "tg-1-99", Text: "rm -rf /", Owner: "tg:1"}},
	{"stop", stopBody{StopRequest: gateway.StopRequest{SessionKey: "tg:1", Operator: true}}},
}

// A client with no credentials cannot connect at all.
func TestBusRefusesAClientWithoutCredentials(t *testing.T) {
	c := natstest.StartAuth(t, 1, []busauth.User{replicaUser("a")})
	if _, _, err := dial(t, c, nil); err == nil {
		t.Fatal("a client with no credentials connected")
	}
	if _, _, err := dial(t, c, &busauth.User{Name: "a", Password: "guessed"}); err == nil {
		t.Fatal("a client with a wrong password connected")
	}
}

// An outsider with credentials but no replica's rights can neither read
// the chats (subscribe to everything) nor send any forwarded request.
func TestBusOutsiderCanNeitherReadNorAct(t *testing.T) {
	c, _, b, rec := attackRig(t)
	nc, errs, err := dial(t, c, &outsider)
	if err != nil {
		t.Fatalf("the outsider's own credentials: %v", err)
	}
	seen := make(chan *nats.Msg, 64)
	if _, err := nc.ChanSubscribe(">", seen); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	violation(t, errs, "subscribe to >")
	for _, f := range forgeries {
		data, _ := json.Marshal(f.body)
		if err := nc.Publish(rpcSubject("a", f.op), data); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		violation(t, errs, "publish a "+f.op)
	}
	// A replica's real traffic meanwhile reaches the outsider nowhere.
	if _, err := b.ForwardAbort(testContext(t, 10*time.Second), "a", gateway.AbortRequest{SessionKey: "ws:real"}); err != nil {
		t.Fatalf("a genuine forward: %v", err)
	}
	select {
	case m := <-seen:
		t.Fatalf("the outsider read %s: %q", m.Subject, m.Data)
	default:
	}
	if got := rec.Calls(); len(got) != 1 || got[0] != "abort ws:real" {
		t.Fatalf("the engine was asked %q, want only the genuine abort", got)
	}
}

// A client with another replica's credentials (b's: it may publish
// requests to any replica) cannot read a's requests, and what it sends
// without the cluster secret — each forgery of the report, unsigned or
// signed with another secret — is refused by a's handler: the engine is
// never asked. A genuine signed request is not accepted twice.
func TestBusForgedRequestsAreRefused(t *testing.T) {
	c, a, _, rec := attackRig(t)
	u := replicaUser("b")
	nc, errs, err := dial(t, c, &u, nats.CustomInboxPrefix(busauth.InboxPrefix("b")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.SubscribeSync(rpcSubject("a", "resolve")); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	violation(t, errs, "subscribe to a's requests")
	if _, err := nc.SubscribeSync(busauth.InboxPrefix("a") + ".>"); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	violation(t, errs, "subscribe to a's inbox")

	wrong, err := busauth.New([]byte("a-guessed-secret-that-is-32-bytes-long!!"), "b")
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t, 30*time.Second)
	for _, f := range forgeries {
		for _, sign := range []struct {
			name string
			with func(*nats.Msg)
		}{
			{"unsigned", func(*nats.Msg) {}},
			{"signed with another secret", func(m *nats.Msg) { wrong.Sign(m) }},
			{"a replica's signature for another operation", func(m *nats.Msg) {
				m.Subject = rpcSubject("a", "abort")
				key(t, "b").Sign(m)
				m.Subject = rpcSubject("a", f.op)
			}},
		} {
			data, _ := json.Marshal(f.body)
			m := &nats.Msg{Subject: rpcSubject("a", f.op), Data: data}
			sign.with(m)
			if f.op == "abort" && sign.name == "a replica's signature for another operation" {
				continue // the same operation: not a forgery
			}
			reply, err := nc.RequestMsgWithContext(ctx, m)
			if err != nil {
				t.Fatalf("%s %s: %v", sign.name, f.op, err)
			}
			var ans answer
			if err := json.Unmarshal(reply.Data, &ans); err != nil || ans.Err == nil || !strings.Contains(ans.Err.Msg, "refused") {
				t.Errorf("%s %s: answered %s, want refused", sign.name, f.op, reply.Data)
			}
		}
	}
	if got := rec.Calls(); len(got) != 0 {
		t.Fatalf("forged requests reached the engine: %q", got)
	}
	if a.Refused() == 0 {
		t.Error("Refused counts nothing")
	}

	// A request signed with the secret (as replica b would) is served
	// once; the same message again is a replay.
	data, _ := json.Marshal(abortBody{AbortRequest: gateway.AbortRequest{SessionKey: "ws:signed"}})
	m := &nats.Msg{Subject: rpcSubject("a", "abort"), Data: data}
	key(t, "b").Sign(m)
	for i, want := range []string{"", "refused"} {
		reply, err := nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: m.Subject, Data: m.Data, Header: m.Header})
		if err != nil {
			t.Fatal(err)
		}
		var ans answer
		_ = json.Unmarshal(reply.Data, &ans)
		got := ""
		if ans.Err != nil && strings.Contains(ans.Err.Msg, "refused") {
			got = "refused"
		}
		if got != want {
			t.Errorf("signed request, time %d: answered %s, want %q", i+1, reply.Data, want)
		}
	}
	testwait.Until(t, 5*time.Second, "the signed abort reaches the engine", func() bool { return len(rec.Calls()) == 1 })
}

// A replica configured with another cluster secret is refused like any
// forger, and its caller gets gateway.ErrClusterUnavailable (words for
// the user), not an engine answer.
func TestBusReplicaWithAnotherSecretIsRefused(t *testing.T) {
	c := natstest.StartAuth(t, 1, []busauth.User{replicaUser("a"), replicaUser("b")})
	dbURL := pgtest.New(t)
	a := start(t, dbURL, c, "a")
	rec := &recorder{}
	a.Serve(rec)
	b := start(t, dbURL, c, "b", func(o *Options) {
		k, err := busauth.New([]byte("another-deployments-secret-0123456789ab"), "b")
		if err != nil {
			t.Fatal(err)
		}
		o.Auth = k
	})
	_, err := b.ForwardAbort(testContext(t, 10*time.Second), "a", gateway.AbortRequest{SessionKey: "ws:x", Operator: true})
	if !errors.Is(err, gateway.ErrClusterUnavailable) {
		t.Fatalf("ForwardAbort: %v, want ErrClusterUnavailable", err)
	}
	if got := rec.Calls(); len(got) != 0 {
		t.Fatalf("the engine was asked %q", got)
	}
}
