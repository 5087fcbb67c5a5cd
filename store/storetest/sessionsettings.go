package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/turnguard/turnguard/store"
)

// testSessionBusyModeRecordReplaceForget: the busy mode /queue <mode> sets
// for a session key is recorded, survives a reopen (a gateway restart), is
// replaced without touching other keys and forgotten by ""; a key with
// none answers "". No key, or a mode longer than any, is ErrInvalid.
func testSessionBusyModeRecordReplaceForget(t *testing.T, h *H) {
	ctx := context.Background()
	loc := h.New(t)
	s := h.Open(t, loc, Config{})
	must := func(key, mode string) {
		t.Helper()
		if err := s.SetBusyMode(ctx, key, mode); err != nil {
			t.Fatalf("SetBusyMode(%q, %q): %v", key, mode, err)
		}
	}
	check := func(s store.Backend, key, want string) {
		t.Helper()
		if got, err := s.BusyModeOf(ctx, key); err != nil || got != want {
			t.Errorf("BusyModeOf(%q) = %q, %v; want %q", key, got, err, want)
		}
	}
	check(s, "ws:a", "")
	must("ws:a", "collect")
	must("telegram:42", "interrupt")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = h.Open(t, loc, Config{})
	check(s, "ws:a", "collect")
	must("ws:a", "steer")
	check(s, "ws:a", "steer")
	check(s, "telegram:42", "interrupt")
	must("ws:a", "")
	check(s, "ws:a", "")
	check(s, "telegram:42", "interrupt")
	must("ws:nobody", "")
	for _, c := range []struct{ key, mode string }{{"", "queue"}, {"ws:a", strings.Repeat("x", 33)}} {
		if err := s.SetBusyMode(ctx, c.key, c.mode); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("SetBusyMode(%q, %d bytes) = %v, want ErrInvalid", c.key, len(c.mode), err)
		}
	}
	check(s, "ws:a", "")
}
