// Package busauth makes the cluster bus (NATS) a trust boundary (issue
// 19): what one replica publishes for another — a forwarded send, abort,
// answer or /stop, a Telegram update — carries an HMAC-SHA256 signature
// under the cluster's shared secret (cluster.secret), and the receiver
// believes nothing of it without a valid one. The NATS credentials
// (cluster.nats.*) decide who may connect and where each may publish and
// subscribe; the signature decides whether the message came from a
// replica at all, so a client that can reach a subject — with no
// credentials on an open server, or with stolen or misconfigured ones —
// still cannot speak for a replica.
//
// What is signed: the subject (so a request to one replica's "resolve"
// cannot be replayed to another replica or as another operation), the
// signing replica's id, a time, a random nonce, the values of the headers
// the caller binds (a Telegram update's id and chat), and the body. Fresh
// verification (the requests) also refuses a time outside Window of the
// receiver's clock and a nonce already seen within it; stored messages
// (the updates, which wait in a stream for as long as their MaxAge) are
// verified without the window, their replays being duplicates the stream
// and the engine's run-id idempotency already absorb.
//
// ServerConfig renders the nats-server authorization a deployment runs:
// one user per replica, each with the subjects it must use and no more.
// This package imports nothing of turnguard's.
package busauth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// MinSecretBytes is the shortest cluster secret Key accepts.
const MinSecretBytes = 32

// Window is how far a fresh message's time may be from the receiver's
// clock, either way; the replicas' clocks must agree within it.
const Window = 30 * time.Second

// maxNonces bounds the nonces a Key remembers (those of the last Window);
// past it, fresh messages are refused until older nonces expire.
const maxNonces = 1 << 17

// Headers a signed message carries.
const (
	HeaderReplica = "Tg-Auth-Replica" // the signing replica's id
	HeaderTime    = "Tg-Auth-Time"    // Unix nanoseconds, decimal
	HeaderNonce   = "Tg-Auth-Nonce"   // 16 random bytes, hex
	HeaderSig     = "Tg-Auth-Sig"     // HMAC-SHA256, base64 (raw URL)
)

// Errors Verify wraps.
var (
	ErrUnsigned = errors.New("busauth: the message is not signed")
	ErrBadSig   = errors.New("busauth: the signature does not verify")
	ErrStale    = errors.New("busauth: the message's time is outside the window")
	ErrReplayed = errors.New("busauth: the message was already received")
)

// Key signs and verifies with the cluster secret as one replica. Safe for
// concurrent use.
type Key struct {
	secret  []byte
	replica string
	now     func() time.Time

	mu      sync.Mutex
	nonces  map[string]time.Time // nonce → when it may be forgotten
	pruneAt time.Time            // the next sweep of expired nonces
}

// New is the Key of replica under secret (at least MinSecretBytes).
func New(secret []byte, replica string) (*Key, error) {
	if len(secret) < MinSecretBytes {
		return nil, fmt.Errorf("busauth: the cluster secret has %d bytes, fewer than %d", len(secret), MinSecretBytes)
	}
	if replica == "" {
		return nil, errors.New("busauth: no replica id")
	}
	return &Key{secret: append([]byte(nil), secret...), replica: replica, now: time.Now, nonces: map[string]time.Time{}}, nil
}

// Replica is the id this Key signs as.
func (k *Key) Replica() string { return k.replica }

// Sign sets m's signature headers (creating m.Header if needed) over its
// subject, body and the values of the bound headers, which must be set
// already.
func (k *Key) Sign(m *nats.Msg, bound ...string) {
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	var n [16]byte
	_, _ = rand.Read(n[:]) // never fails (crypto/rand)
	m.Header.Set(HeaderReplica, k.replica)
	m.Header.Set(HeaderTime, strconv.FormatInt(k.now().UnixNano(), 10))
	m.Header.Set(HeaderNonce, hex.EncodeToString(n[:]))
	m.Header.Set(HeaderSig, base64.RawURLEncoding.EncodeToString(k.mac(m.Subject, m.Header, m.Data, bound)))
}

// Verify checks the signature of a message on subject with header h and
// body data, binding the named headers as Sign did, and returns the
// replica that signed it. With fresh, the time must be within Window and
// the nonce unseen (it is remembered). The error wraps ErrUnsigned,
// ErrBadSig, ErrStale or ErrReplayed.
func (k *Key) Verify(subject string, h nats.Header, data []byte, fresh bool, bound ...string) (string, error) {
	sig := h.Get(HeaderSig)
	if sig == "" || h.Get(HeaderReplica) == "" || h.Get(HeaderNonce) == "" || h.Get(HeaderTime) == "" {
		return "", ErrUnsigned
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, k.mac(subject, h, data, bound)) {
		return "", ErrBadSig
	}
	if !fresh {
		return h.Get(HeaderReplica), nil
	}
	ns, err := strconv.ParseInt(h.Get(HeaderTime), 10, 64)
	now := k.now()
	if err != nil {
		return "", ErrBadSig
	}
	if d := now.Sub(time.Unix(0, ns)); d > Window || d < -Window {
		return "", fmt.Errorf("%w (%d s off)", ErrStale, int64(d/time.Second))
	}
	if err := k.remember(h.Get(HeaderNonce), now); err != nil {
		return "", err
	}
	return h.Get(HeaderReplica), nil
}

// VerifyStored is Verify of a stored message (not fresh), returning only
// the error: the shape of tgupdates.Config.Verify.
func (k *Key) VerifyStored(subject string, h nats.Header, data []byte, bound ...string) error {
	_, err := k.Verify(subject, h, data, false, bound...)
	return err
}

// remember records nonce until two windows from now (a message is fresh
// for at most that long); a nonce already recorded is a replay.
func (k *Key) remember(nonce string, now time.Time) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if until, ok := k.nonces[nonce]; ok && now.Before(until) {
		return ErrReplayed
	}
	if len(k.nonces) >= maxNonces || now.After(k.pruneAt) {
		// Expired nonces go every Window (and when full), so the map holds
		// about the last three windows' worth.
		for n, until := range k.nonces {
			if !now.Before(until) {
				delete(k.nonces, n)
			}
		}
		k.pruneAt = now.Add(Window)
		if len(k.nonces) >= maxNonces {
			return fmt.Errorf("%w: more than %d fresh messages in %v", ErrReplayed, maxNonces, 2*Window)
		}
	}
	k.nonces[nonce] = now.Add(2 * Window)
	return nil
}

// mac is the HMAC of every signed field, each length-prefixed so that no
// two messages share an input.
func (k *Key) mac(subject string, h nats.Header, data []byte, bound []string) []byte {
	m := hmac.New(sha256.New, k.secret)
	field := func(b []byte) {
		var l [8]byte
		binary.BigEndian.PutUint64(l[:], uint64(len(b)))
		m.Write(l[:])
		m.Write(b)
	}
	field([]byte("turnguard-bus-v1"))
	field([]byte(subject))
	for _, name := range []string{HeaderReplica, HeaderTime, HeaderNonce} {
		field([]byte(h.Get(name)))
	}
	for _, name := range bound {
		field([]byte(name))
		field([]byte(h.Get(name)))
	}
	field(data)
	return m.Sum(nil)
}
