// Package testwait owns the one way tests that run against real processes
// (PostgreSQL, nats-server, a built gateway) wait for something to become
// true: poll it on the real clock until a deadline. Timing under test runs
// in testing/synctest bubbles instead (internal/faketime); this is for what
// a bubble cannot hold — real servers, sockets and processes.
package testwait

import (
	"time"

	"github.com/turnguard/turnguard/internal/tb"
)

// Every is how often Until polls.
const Every = 10 * time.Millisecond

// Until polls cond every Every until it holds, and fails the test (naming
// what) when it still does not after within.
func Until(t tb.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(within, cond) {
		t.Fatalf("not within %v: %s", within, what)
	}
}

// NoError polls f until it returns nil, and fails the test with f's last
// error when it still fails after within.
func NoError(t tb.TB, within time.Duration, f func() error) {
	t.Helper()
	var last error
	if !poll(within, func() bool { last = f(); return last == nil }) {
		t.Fatalf("not within %v: %v", within, last)
	}
}

// poll reports whether cond held within the time given, polling every Every.
func poll(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(Every) // real time: polling real servers and processes
	}
	return true
}
