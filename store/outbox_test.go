package store_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/turnguard/turnguard/store"
)

func TestOutboxLifecycle(t *testing.T) {
	ctx := context.Background()
	path := dbPath(t)
	s := open(t, path, store.Options{})
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

	s = open(t, path, store.Options{})
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

func TestOutboxDedup(t *testing.T) {
	ctx := context.Background()
	s := open(t, dbPath(t), store.Options{})
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

func TestEnqueueRejectsBadInput(t *testing.T) {
	s := open(t, dbPath(t), store.Options{})
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

func TestErrorText(t *testing.T) {
	long := strings.Repeat("é", 400) // 800 bytes
	tests := []struct {
		name     string
		err      error
		want     string // exact, or "" to check only the properties below
		mustNot  []string
		mustHave []string
	}{
		{name: "nil", err: nil, want: ""},
		{name: "plain", err: errors.New("chat not found"), want: "chat not found"},
		{
			name: "url error keeps host and cause, drops the path",
			err: fmt.Errorf("send: %w", &url.Error{Op: "Post", URL: "https://api.telegram.org/bot1:AA-b_c/sendMessage?x=1",
				Err: errors.New("i/o timeout")}),
			want: "Post https://api.telegram.org/…: i/o timeout",
		},
		{
			name:     "telegram token in plain text",
			err:      errors.New("GET /bot987654321:ZZZ-yyy_xxx/getMe failed"),
			mustNot:  []string{"ZZZ-yyy_xxx"},
			mustHave: []string{"bot<redacted>", "failed"},
		},
		{
			name:     "bearer token",
			err:      errors.New("401 for Authorization: Bearer sk-abc.def"),
			mustNot:  []string{"sk-abc.def"},
			mustHave: []string{"Bearer <redacted>"},
		},
		{
			name:     "key=value secrets",
			err:      errors.New(`bad request: api_key=sk-123&token: "tok-456" password=hunter2`),
			mustNot:  []string{"sk-123", "tok-456", "hunter2"},
			mustHave: []string{"bad request"},
		},
		{
			name:     "truncated on a rune boundary",
			err:      errors.New(long),
			mustHave: []string{"…"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := store.ErrorText(tc.err)
			if tc.want != "" || tc.err == nil {
				if got != tc.want {
					t.Errorf("ErrorText = %q, want %q", got, tc.want)
				}
			}
			for _, s := range tc.mustNot {
				if strings.Contains(got, s) {
					t.Errorf("ErrorText = %q contains %q", got, s)
				}
			}
			for _, s := range tc.mustHave {
				if !strings.Contains(got, s) {
					t.Errorf("ErrorText = %q lacks %q", got, s)
				}
			}
			if !utf8.ValidString(got) || len(got) > 512+len("…") {
				t.Errorf("ErrorText = %d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
			}
		})
	}
}

// TestOutboxPartsSentAndIsPending: the parts of a split message that
// reached the chat are kept (never going down) and listed by Pending, so a
// resend goes on after them; IsPending tells a pending message from a
// delivered one and an unknown id.
func TestOutboxPartsSentAndIsPending(t *testing.T) {
	ctx := context.Background()
	s := open(t, dbPath(t), store.Options{})
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
