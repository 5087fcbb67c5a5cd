package storetest

import (
	"context"
	"errors"
	"testing"

	"github.com/turnguard/turnguard/store"
)

// testAgentSessionsRecordReplaceForget: the agent session of a session key
// is recorded, survives a reopen (a gateway restart), is replaced by the
// key's next conversation (/new) without touching other keys, and is
// forgotten by an empty id; a key with none answers "", "".
func testAgentSessionsRecordReplaceForget(t *testing.T, h *H) {
	ctx := context.Background()
	loc := h.New(t)
	s := h.Open(t, loc, Config{})
	must := func(key, conv, id string) {
		t.Helper()
		if err := s.SetAgentSession(ctx, key, conv, id); err != nil {
			t.Fatalf("SetAgentSession(%q, %q, %q): %v", key, conv, id, err)
		}
	}
	check := func(s store.Backend, key, wantConv, wantID string) {
		t.Helper()
		conv, id, err := s.AgentSession(ctx, key)
		if err != nil || conv != wantConv || id != wantID {
			t.Errorf("AgentSession(%q) = %q, %q, %v; want %q, %q", key, conv, id, err, wantConv, wantID)
		}
	}
	check(s, "ws:a", "", "")
	must("ws:a", "conv-1", "sess-1")
	must("telegram:42", "conv-9", "sess-9")
	check(s, "ws:a", "conv-1", "sess-1")

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = h.Open(t, loc, Config{})
	check(s, "ws:a", "conv-1", "sess-1")

	must("ws:a", "conv-2", "sess-2")
	check(s, "ws:a", "conv-2", "sess-2")
	check(s, "telegram:42", "conv-9", "sess-9")

	must("ws:a", "", "")
	check(s, "ws:a", "", "")
	check(s, "telegram:42", "conv-9", "sess-9")
	must("ws:nobody", "", "") // forgetting nothing is no error
}

// testSetAgentSessionRejectsBadInput: no session key, or an id without its
// conversation, is ErrInvalid and records nothing.
func testSetAgentSessionRejectsBadInput(t *testing.T, h *H) {
	ctx := context.Background()
	s := h.Open(t, h.New(t), Config{})
	for _, c := range []struct{ key, conv, id string }{
		{"", "conv", "sess"},
		{"", "", ""},
		{"ws:a", "", "sess"},
	} {
		if err := s.SetAgentSession(ctx, c.key, c.conv, c.id); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("SetAgentSession(%q, %q, %q) = %v, want ErrInvalid", c.key, c.conv, c.id, err)
		}
	}
	if conv, id, err := s.AgentSession(ctx, "ws:a"); err != nil || conv != "" || id != "" {
		t.Errorf("after refused writes: %q, %q, %v; want nothing", conv, id, err)
	}
}
