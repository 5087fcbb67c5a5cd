package acp_test

import (
	"context"
	"errors"
	"testing"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner/acp"
)

// TestListSessions: with an agent that advertises sessionCapabilities.list,
// ListSessions gives its sessions in the workdir (session/list) and which
// one serves the conversation; without it, or before the conversation has
// a session, it says so.
func TestListSessions(t *testing.T) {
	r, _, _ := newRunner(t, grace, func(c *config.ACP) { c.Env = map[string]string{"ACP_TEST_CAPS": "list"} })
	if _, err := r.ListSessions(context.Background(), "a"); !errors.Is(err, acp.ErrNoSession) {
		t.Errorf("before any turn: %v, want ErrNoSession", err)
	}
	mustSay(t, r, (&conv{key: "a", id: "ca"}).turn("remember apples"))
	mustSay(t, r, (&conv{key: "b", id: "cb"}).turn("hello"))
	got, err := r.ListSessions(context.Background(), "b")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Sessions) != 2 || got.More {
		t.Fatalf("sessions %+v, want two", got)
	}
	if got.Sessions[0].Title != "remember apples" || got.Sessions[1].Title != "hello" {
		t.Errorf("titles %q, %q", got.Sessions[0].Title, got.Sessions[1].Title)
	}
	if got.Current == "" || got.Current != got.Sessions[1].ID || got.Sessions[0].ID == got.Current {
		t.Errorf("current %q among %+v, want the second", got.Current, got.Sessions)
	}

	plain, _, _ := newRunner(t, grace, nil)
	mustSay(t, plain, (&conv{key: "a", id: "ca"}).turn("hello"))
	if _, err := plain.ListSessions(context.Background(), "a"); !errors.Is(err, acp.ErrNoList) {
		t.Errorf("an agent without list: %v, want ErrNoList", err)
	}
}
