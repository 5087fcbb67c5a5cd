// Package errlog keeps the details of turn failures for operators. A user
// whose turn failed is shown only a short error id; the details — the error
// chain, a panic value and its stack — are kept here under that id, with
// secrets redacted, in a ring of bounded size, and served by the admin API
// (and written to the log) only.
package errlog

import (
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Record is one failure.
type Record struct {
	ID         string    `json:"id"`
	Time       time.Time `json:"time"`
	RunID      string    `json:"runId"`
	SessionKey string    `json:"sessionKey"`
	Channel    string    `json:"channel"`
	Runner     string    `json:"runner"`
	Step       string    `json:"step,omitempty"` // the step running when it failed
	// Error is the error's message; Chain the messages of the wrapped
	// errors, outermost first, each with its Go type.
	Error string   `json:"error"`
	Chain []string `json:"chain,omitempty"`
	// Detail is what the error offers operators beyond its message (an
	// exec agent's last stderr lines).
	Detail string `json:"detail,omitempty"`
	Panic  string `json:"panic,omitempty"` // the panic value of a panicking runner
	Stack  string `json:"stack,omitempty"` // its goroutine's stack
}

// Ring holds the most recent records, at most its capacity. Safe for
// concurrent use.
type Ring struct {
	mu   sync.Mutex
	recs []Record // circular; next is the slot to write
	next int
	full bool
}

// NewRing returns a ring that keeps the last capacity records (at least 1).
func NewRing(capacity int) *Ring { return &Ring{recs: make([]Record, max(capacity, 1))} }

// Add stores rec, replacing the oldest record when the ring is full.
func (r *Ring) Add(rec Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs[r.next] = rec
	r.next = (r.next + 1) % len(r.recs)
	if r.next == 0 {
		r.full = true
	}
}

// List returns the records, newest first.
func (r *Ring) List() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.next
	if r.full {
		n = len(r.recs)
	}
	out := make([]Record, 0, n)
	for i := 1; i <= n; i++ {
		out = append(out, r.recs[(r.next-i+len(r.recs))%len(r.recs)])
	}
	return out
}

// Get returns the record with id (case-insensitive).
func (r *Ring) Get(id string) (Record, bool) {
	for _, rec := range r.List() {
		if strings.EqualFold(rec.ID, id) {
			return rec, true
		}
	}
	return Record{}, false
}

// idAlphabet has no letters a person confuses with digits (I, L, O, U).
const idAlphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// NewID returns a fresh error id: "E" and five characters a person can read
// out over the phone (E7K2QX). 32^5 ids: a collision within one ring is
// unlikely, and harmless (Get returns the newer).
func NewID() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	id := []byte{'E', 0, 0, 0, 0, 0}
	for i, v := range b {
		id[i+1] = idAlphabet[int(v)%len(idAlphabet)]
	}
	return string(id)
}

// Chain lists err and the errors it wraps, outermost first, as "type:
// message". A joined error's branches follow in order.
func Chain(err error) []string {
	var out []string
	var walk func(error, int)
	walk = func(e error, depth int) {
		if e == nil || depth > 16 || len(out) >= 32 {
			return
		}
		out = append(out, fmt.Sprintf("%T: %s", e, e.Error()))
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x, depth+1)
			}
		default:
			walk(errors.Unwrap(e), depth+1)
		}
	}
	walk(err, 0)
	return out
}

// Redaction replaces a secret.
const Redaction = "[redacted]"

// secretShapes are values that look like credentials whatever their
// source: API keys of common providers, bearer tokens, key=value pairs
// naming a key, token, secret or password.
var secretShapes = regexp.MustCompile(`(?i)(sk-[A-Za-z0-9_-]{8,}|bearer\s+[A-Za-z0-9._~+/=-]{8,}|\b[0-9]{6,}:[A-Za-z0-9_-]{30,}\b)|((?:api[_-]?key|token|secret|password|passwd)["']?\s*[:=]\s*["']?)[^\s"',;]+`)

// Redactor replaces known secrets (the configuration's) and values shaped
// like credentials. The zero Redactor redacts shapes only.
type Redactor struct{ secrets []string }

// NewRedactor returns a redactor for secrets; empty and very short values
// (under 4 characters, which would mangle ordinary text) are ignored.
func NewRedactor(secrets []string) *Redactor {
	var s []string
	for _, v := range secrets {
		if len(v) >= 4 {
			s = append(s, v)
		}
	}
	// Longest first, so a secret containing another is replaced whole.
	slices.SortFunc(s, func(a, b string) int { return len(b) - len(a) })
	return &Redactor{secrets: slices.Compact(s)}
}

// Redact returns s with every secret replaced by Redaction.
func (r *Redactor) Redact(s string) string {
	if r != nil {
		for _, v := range r.secrets {
			s = strings.ReplaceAll(s, v, Redaction)
		}
	}
	return secretShapes.ReplaceAllStringFunc(s, func(m string) string {
		sub := secretShapes.FindStringSubmatch(m)
		if sub[2] != "" {
			return sub[2] + Redaction
		}
		return Redaction
	})
}

// RedactRecord redacts every text field of rec.
func (r *Redactor) RedactRecord(rec Record) Record {
	rec.Error = r.Redact(rec.Error)
	rec.Detail = r.Redact(rec.Detail)
	rec.Panic = r.Redact(rec.Panic)
	rec.Stack = r.Redact(rec.Stack)
	chain := make([]string, len(rec.Chain))
	for i, c := range rec.Chain {
		chain[i] = r.Redact(c)
	}
	rec.Chain = chain
	return rec
}
