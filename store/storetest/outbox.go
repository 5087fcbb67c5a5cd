package storetest

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/turnguard/turnguard/store"
)

func testOutboxLifecycle(t *testing.T, h *H) {
	ctx := context.Background()
	path := h.New(t)
	s := h.Open(t, path, Config{})
	final := store.OutboxMessage{Channel: "telegram", ChatRef: "42", RunID: "run-1", Kind: store.OutboxFinal, Text: "Paris."}
	notice := store.OutboxMessage{Channel: "telegram", ChatRef: "7", RunID: "run-2", Kind: store.OutboxNotice, Text: "⚠️ time limit"}
	ws := store.OutboxMessage{Channel: "ws", RunID: "run-3", Kind: store.OutboxFinal, Text: "hi"}
	var ids []int64
	for _, m := range []store.OutboxMessage{final, notice, ws} {
		id, err := s.Enqueue(ctx, m)
		if err != nil {
			t.Fatalf("Enqueue(%+v): %v", m, err)
		}
		ids = append(ids, id)
	}

	// Delivery of the first fails with an error carrying the bot token.
	sendErr := &url.Error{Op: "Post", URL: "https://api.telegram.org/bot123456:AAH-secretTOKEN_x/sendMessage",
		Err: errors.New("dial tcp: connection refused")}
	if err := s.MarkAttempt(ctx, ids[0], sendErr); err != nil {
		t.Fatal(err)
	}
	s.Close() // the process restarts before any delivery succeeded

	s = h.Open(t, path, Config{})
	pending, err := s.Pending(ctx, "telegram", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 2 || pending[0].ID != ids[0] || pending[1].ID != ids[1] {
		t.Fatalf("pending telegram after restart = %+v, want the two telegram messages, oldest first", pending)
	}
	p := pending[0]
	if p.Text != "Paris." || p.ChatRef != "42" || p.RunID != "run-1" || p.Kind != store.OutboxFinal ||
		p.Attempts != 1 || p.LastAttemptAt.IsZero() || p.CreatedAt.IsZero() {
		t.Errorf("pending[0] = %+v", p)
	}
	if strings.Contains(p.LastError, "secretTOKEN") || !strings.Contains(p.LastError, "connection refused") {
		t.Errorf("last error %q: want the cause without the token", p.LastError)
	}
	if all, _ := s.Pending(ctx, "", 0); len(all) != 3 {
		t.Errorf("Pending(all) = %d messages, want 3", len(all))
	}

	if err := s.MarkDelivered(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDelivered(ctx, ids[0]); err != nil {
		t.Errorf("second MarkDelivered: %v", err)
	}
	if err := s.MarkFailed(ctx, ids[1], "Forbidden: bot was blocked by the user"); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkFailed(ctx, ids[0], "too late"); err != nil {
		t.Errorf("MarkFailed of a delivered message: %v", err)
	}
	if pending, _ := s.Pending(ctx, "telegram", 0); len(pending) != 0 {
		t.Errorf("pending telegram = %+v, want none", pending)
	}
	c, err := s.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (store.OutboxCounts{Pending: 1, Delivered: 1, Failed: 1}); c != want {
		t.Errorf("Counts = %+v, want %+v (delivered stands over a later MarkFailed)", c, want)
	}

	for name, err := range map[string]error{
		"MarkDelivered": s.MarkDelivered(ctx, 999),
		"MarkAttempt":   s.MarkAttempt(ctx, 999, errors.New("x")),
		"MarkFailed":    s.MarkFailed(ctx, 999, "x"),
	} {
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s(unknown id) = %v, want ErrNotFound", name, err)
		}
	}
}

func testOutboxDedup(t *testing.T, h *H) {
	ctx := context.Background()
	s := h.Open(t, h.New(t), Config{})
	m := store.OutboxMessage{Channel: "telegram", ChatRef: "42", RunID: "run-1", Kind: store.OutboxNotice, Text: "⚠️ stopped"}
	id, err := s.Enqueue(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.Enqueue(ctx, m)
	if !errors.Is(err, store.ErrDuplicate) || again != id {
		t.Errorf("second Enqueue = %d, %v; want %d, ErrDuplicate", again, err, id)
	}
	// The run's other kind is a different message.
	m.Kind = store.OutboxFinal
	if _, err := s.Enqueue(ctx, m); err != nil {
		t.Errorf("Enqueue of the final after the notice: %v", err)
	}
	if p, _ := s.Pending(ctx, "telegram", 0); len(p) != 2 {
		t.Errorf("pending = %d messages, want 2", len(p))
	}
}

func testEnqueueRejectsBadInput(t *testing.T, h *H) {
	s := h.Open(t, h.New(t), Config{})
	ok := store.OutboxMessage{Channel: "telegram", ChatRef: "42", RunID: "run-1", Kind: store.OutboxFinal, Text: "x"}
	tests := []struct {
		name string
		edit func(*store.OutboxMessage)
	}{
		{"no channel", func(m *store.OutboxMessage) { m.Channel = "" }},
		{"no run id", func(m *store.OutboxMessage) { m.RunID = "" }},
		{"unknown kind", func(m *store.OutboxMessage) { m.Kind = "draft" }},
		{"empty text", func(m *store.OutboxMessage) { m.Text = "" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := ok
			tc.edit(&m)
			if _, err := s.Enqueue(context.Background(), m); !errors.Is(err, store.ErrInvalid) {
				t.Errorf("Enqueue = %v, want ErrInvalid", err)
			}
		})
	}
	if p, _ := s.Pending(context.Background(), "", 0); len(p) != 0 {
		t.Errorf("rejected messages were stored: %+v", p)
	}
}

// testOutboxPartsSentAndIsPending: the parts of a split message that
// reached the chat are kept (never going down) and listed by Pending, so a
// resend goes on after them; IsPending tells a pending message from a
// delivered one and an unknown id.
func testOutboxPartsSentAndIsPending(t *testing.T, h *H) {
	ctx := context.Background()
	s := h.Open(t, h.New(t), Config{})
	id, err := s.Enqueue(ctx, store.OutboxMessage{Channel: "telegram", ChatRef: "42", RunID: "run-1", Kind: store.OutboxFinal, Text: "long"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{2, 1} {
		if err := s.MarkPartsSent(ctx, id, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.MarkPartsSent(ctx, id, -1); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("MarkPartsSent(-1) = %v, want ErrInvalid", err)
	}
	if p, _ := s.Pending(ctx, "telegram", 0); len(p) != 1 || p[0].PartsSent != 2 {
		t.Fatalf("pending = %+v, want one message with 2 parts sent", p)
	}
	if pending, err := s.IsPending(ctx, id); !pending || err != nil {
		t.Errorf("IsPending before delivery = %v, %v; want true", pending, err)
	}
	if err := s.MarkDelivered(ctx, id); err != nil {
		t.Fatal(err)
	}
	if pending, err := s.IsPending(ctx, id); pending || err != nil {
		t.Errorf("IsPending after delivery = %v, %v; want false", pending, err)
	}
	if _, err := s.IsPending(ctx, id+100); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("IsPending of an unknown id: %v, want ErrNotFound", err)
	}
	if err := s.MarkPartsSent(ctx, id+100, 1); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("MarkPartsSent of an unknown id: %v, want ErrNotFound", err)
	}
}
