package tgupdates

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnguard/turnguard/cluster/busauth"
	"github.com/turnguard/turnguard/internal/natstest"
	"github.com/turnguard/turnguard/internal/testwait"
)

// signedConfig is a Config whose updates are signed and verified with
// replica's key under secret.
func signedConfig(t *testing.T, secret []byte, replica string) Config {
	t.Helper()
	k, err := busauth.New(secret, replica)
	if err != nil {
		t.Fatal(err)
	}
	return Config{Sign: k.Sign, Verify: func(subject string, h nats.Header, data []byte, bound ...string) error {
		_, err := k.Verify(subject, h, data, false, bound...)
		return err
	}}
}

// A forged Telegram update (issue 19: a callback_query "from" another
// user, published on the updates subject with the two headers set) is
// never handled: neither unsigned, nor signed with a guessed secret, nor a
// genuine update's signature on another chat. The consumer refuses each,
// counts them and reports them once; a replica's own update is handled.
// The forger holds a replica's NATS credentials but not the cluster
// secret (a leaked or misconfigured account); one without them cannot
// publish there at all.
func TestForgedUpdatesAreDropped(t *testing.T) {
	secret := []byte("tgupdates-test-cluster-secret-0123456789")
	outsider := busauth.User{Name: "outsider", Password: "o", Publish: []string{"_INBOX.>"}, Subscribe: []string{"_INBOX.>"}}
	c := natstest.StartAuth(t, 1, []busauth.User{busauth.ReplicaUser("r1", "p1"), busauth.ReplicaUser("r2", "p2"), outsider})
	cfg := signedConfig(t, secret, "r1")
	asReplica := func(id, pw string) *nats.Conn {
		return c.Connect(t, 0, nats.UserInfo(id, pw), nats.CustomInboxPrefix(busauth.InboxPrefix(id)))
	}
	nc := asReplica("r1", "p1")
	var mu sync.Mutex
	var handled []string
	var reports []error
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	l := newLog(t, nc, cfg)
	opt := testOptions("r1")
	opt.OnError = func(err error) { mu.Lock(); reports = append(reports, err); mu.Unlock() }
	cons, err := Consume(ctx, nc, cfg, func(_ context.Context, u Update) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, string(u.Raw))
		return nil
	}, opt)
	if err != nil {
		t.Fatal(err)
	}

	js, err := jetstream.New(asReplica("r2", "p2"))
	if err != nil {
		t.Fatal(err)
	}
	const chat = 42
	forge := func(id int64, raw string, sign func(*nats.Msg)) {
		t.Helper()
		m := &nats.Msg{Subject: cfg.withDefaults().subject(cfg.Partition(chat)), Data: []byte(raw), Header: nats.Header{}}
		m.Header.Set(HeaderUpdateID, strconv.FormatInt(id, 10))
		m.Header.Set(HeaderChatID, strconv.Itoa(chat))
		sign(m)
		if _, err := js.PublishMsg(t.Context(), m); err != nil {
			t.Fatalf("publish forged update %d: %v", id, err)
		}
	}
	guessed := signedConfig(t, []byte("a-guessed-secret-of-at-least-32-bytes!!"), "r2")
	forge(1, `{"callback_query":{"from":{"id":7},"data":"unsigned"}}`, func(*nats.Msg) {})
	forge(2, `{"callback_query":{"from":{"id":7},"data":"guessed"}}`, func(m *nats.Msg) { guessed.Sign(m, boundHeaders...) })
	// A genuine signature (update 3 of chat 43) moved onto chat 42.
	genuine := &nats.Msg{Subject: "x", Header: nats.Header{}, Data: []byte(`{"callback_query":{"data":"moved"}}`)}
	genuine.Header.Set(HeaderUpdateID, "3")
	genuine.Header.Set(HeaderChatID, "43")
	genuine.Subject = cfg.withDefaults().subject(cfg.Partition(43))
	cfg.Sign(genuine, boundHeaders...)
	forge(3, string(genuine.Data), func(m *nats.Msg) {
		for _, h := range []string{busauth.HeaderReplica, busauth.HeaderTime, busauth.HeaderNonce, busauth.HeaderSig} {
			m.Header.Set(h, genuine.Header.Get(h))
		}
	})
	if err := l.PublishUpdate(t.Context(), 4, chat, []byte(`{"message":"genuine"}`)); err != nil {
		t.Fatal(err)
	}

	out, errs := connectAs(t, c, outsider)
	if err := out.Publish(cfg.withDefaults().subject(0), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	_ = out.Flush()
	select {
	case err := <-errs:
		t.Logf("the outsider's publication: %v", err)
	case <-time.After(5 * time.Second):
		t.Error("the server let an outsider publish an update")
	}

	testwait.Until(t, 15*time.Second, "the genuine update is handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) > 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(handled) != 1 || handled[0] != `{"message":"genuine"}` {
		t.Fatalf("handled %q, want only the genuine update", handled)
	}
	if got := cons.Refused(); got != 3 {
		t.Errorf("Refused = %d, want 3", got)
	}
	if len(reports) != 1 {
		t.Errorf("%d reports of refused updates, want 1 (rate-limited): %v", len(reports), reports)
	}
}

// connectAs connects to c as u, collecting the server's asynchronous
// errors.
func connectAs(t *testing.T, c *natstest.Cluster, u busauth.User) (*nats.Conn, <-chan error) {
	t.Helper()
	errs := make(chan error, 4)
	nc := c.Connect(t, 0, nats.UserInfo(u.Name, u.Password), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	return nc, errs
}
