package busauth

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

var secret = []byte("busauth-test-secret-0123456789abcdef")

func newKey(t *testing.T, s []byte, replica string) *Key {
	t.Helper()
	k, err := New(s, replica)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestNewRefusesAShortSecret(t *testing.T) {
	if _, err := New(secret[:MinSecretBytes-1], "a"); err == nil {
		t.Fatal("a 31-byte secret was accepted")
	}
	if _, err := New(secret, ""); err == nil {
		t.Fatal("no replica id was accepted")
	}
}

// Verify accepts what Sign signed, names its replica, and refuses every
// change of a signed field, an unsigned message, another secret, a stale
// time and a replay.
func TestVerify(t *testing.T) {
	signed := func() *nats.Msg {
		m := &nats.Msg{Subject: "tgrpc.61.resolve", Data: []byte(`{"Operator":false}`), Header: nats.Header{}}
		m.Header.Set("Tg-Chat-Id", "7")
		newKey(t, secret, "b").Sign(m, "Tg-Chat-Id")
		return m
	}
	for _, c := range []struct {
		name  string
		edit  func(m *nats.Msg)
		key   *Key
		fresh bool
		want  error
	}{
		{name: "as signed", edit: func(*nats.Msg) {}, fresh: true},
		{name: "stored, verified without the window", edit: func(*nats.Msg) {}},
		{name: "body changed", edit: func(m *nats.Msg) { m.Data = []byte(`{"Operator":true}`) }, fresh: true, want: ErrBadSig},
		{name: "subject changed", edit: func(m *nats.Msg) { m.Subject = "tgrpc.62.resolve" }, fresh: true, want: ErrBadSig},
		{name: "bound header changed", edit: func(m *nats.Msg) { m.Header.Set("Tg-Chat-Id", "8") }, fresh: true, want: ErrBadSig},
		{name: "replica changed", edit: func(m *nats.Msg) { m.Header.Set(HeaderReplica, "a") }, fresh: true, want: ErrBadSig},
		{name: "time changed", edit: func(m *nats.Msg) { m.Header.Set(HeaderTime, "1") }, fresh: true, want: ErrBadSig},
		{name: "unsigned", edit: func(m *nats.Msg) { m.Header.Del(HeaderSig) }, fresh: true, want: ErrUnsigned},
		{name: "another secret", edit: func(*nats.Msg) {}, key: newKey(t, []byte(strings.Repeat("x", 32)), "a"), fresh: true, want: ErrBadSig},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := signed()
			c.edit(m)
			k := c.key
			if k == nil {
				k = newKey(t, secret, "a")
			}
			from, err := k.Verify(m.Subject, m.Header, m.Data, c.fresh, "Tg-Chat-Id")
			if !errors.Is(err, c.want) || (c.want == nil && err != nil) {
				t.Fatalf("Verify: %v, want %v", err, c.want)
			}
			if c.want == nil && from != "b" {
				t.Fatalf("Verify names %q, want b", from)
			}
		})
	}
	t.Run("replayed", func(t *testing.T) {
		k, m := newKey(t, secret, "a"), signed()
		if _, err := k.Verify(m.Subject, m.Header, m.Data, true, "Tg-Chat-Id"); err != nil {
			t.Fatal(err)
		}
		if _, err := k.Verify(m.Subject, m.Header, m.Data, true, "Tg-Chat-Id"); !errors.Is(err, ErrReplayed) {
			t.Fatalf("the second time: %v, want ErrReplayed", err)
		}
	})
	t.Run("stale", func(t *testing.T) {
		k, m := newKey(t, secret, "a"), signed()
		k.now = func() time.Time { return time.Now().Add(Window + time.Second) }
		if _, err := k.Verify(m.Subject, m.Header, m.Data, true, "Tg-Chat-Id"); !errors.Is(err, ErrStale) {
			t.Fatalf("Verify: %v, want ErrStale", err)
		}
	})
}

// The authorization names each replica's own subjects and no other's.
func TestAuthorization(t *testing.T) {
	got := Authorization([]User{ReplicaUser("r1", "p1"), {Name: "admin", Password: "x"}})
	for _, want := range []string{`{user: "r1", password: "p1", permissions:`, `"tgrpc.7231.*"`, `"_INBOX_7231.>"`,
		"allow_responses: true", `{user: "admin", password: "x"}`} {
		if !strings.Contains(got, want) {
			t.Errorf("the authorization lacks %s:\n%s", want, got)
		}
	}
}

// docs/scaling.md shows the authorization Authorization renders for r1…r3
// (with its placeholder passwords): the documented set-up is the one the
// tests run.
func TestScalingDocShowsTheAuthorization(t *testing.T) {
	b, err := os.ReadFile("../../docs/scaling.md")
	if err != nil {
		t.Fatal(err)
	}
	want := Authorization([]User{ReplicaUser("r1", "CHANGE-ME-r1"), ReplicaUser("r2", "CHANGE-ME-r2"), ReplicaUser("r3", "CHANGE-ME-r3")})
	var indented strings.Builder
	for _, line := range strings.SplitAfter(want, "\n") {
		if line != "" {
			indented.WriteString("   " + line)
		}
	}
	if !strings.Contains(string(b), indented.String()) {
		t.Errorf("docs/scaling.md does not show the authorization of r1…r3:\n%s", indented.String())
	}
}

// The nonces remembered are those of the last few windows: older ones are
// swept, so the memory is bounded by the traffic of about a minute and a
// half, not by the process's life.
func TestNoncesAreForgotten(t *testing.T) {
	clock := time.Now()
	now := func() time.Time { return clock }
	signer, verifier := newKey(t, secret, "b"), newKey(t, secret, "a")
	signer.now, verifier.now = now, now
	verify := func() {
		t.Helper()
		m := &nats.Msg{Subject: "tgrpc.61.send", Data: []byte("x")}
		signer.Sign(m)
		if _, err := verifier.Verify(m.Subject, m.Header, m.Data, true); err != nil {
			t.Fatal(err)
		}
	}
	for range 100 {
		verify()
	}
	clock = clock.Add(3 * Window)
	verify()
	if n := len(verifier.nonces); n != 1 {
		t.Fatalf("%d nonces remembered three windows later, want 1", n)
	}
}
