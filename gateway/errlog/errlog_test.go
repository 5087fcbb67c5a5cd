package errlog

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	r := NewRedactor([]string{"hunter2-config-token", "", "ab"})
	for _, tc := range []struct{ in, want string }{
		{"auth with hunter2-config-token failed", "auth with [redacted] failed"},
		{"openai: 401 for key sk-proj-AbC123xyz987", "openai: 401 for key [redacted]"},
		{"Authorization: Bearer eyJhbGciOi.payload.sig", "Authorization: [redacted]"},
		{`OPENAI_API_KEY=abc123def456 python agent.py`, `OPENAI_API_KEY=[redacted] python agent.py`},
		{`{"token": "zzz999yyy"}`, `{"token": "[redacted]"}`},
		{"bot 123456789:AAEhBP0av28CLjqkw5Tb8wI1f-kk3xLk4Hs died", "bot [redacted] died"},
		{"a tab and ab stay", "a tab and ab stay"},
	} {
		if got := r.Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestRingKeepsNewestAndFindsByID(t *testing.T) {
	r := NewRing(3)
	for i := range 5 {
		r.Add(Record{ID: fmt.Sprintf("E%05d", i)})
	}
	var ids []string
	for _, rec := range r.List() {
		ids = append(ids, rec.ID)
	}
	if got := strings.Join(ids, " "); got != "E00004 E00003 E00002" {
		t.Fatalf("List = %s", got)
	}
	if _, ok := r.Get("e00001"); ok {
		t.Fatal("evicted record still found")
	}
	if rec, ok := r.Get("e00003"); !ok || rec.ID != "E00003" {
		t.Fatalf("Get = %+v %v", rec, ok)
	}
}

func TestNewIDAndChain(t *testing.T) {
	id := NewID()
	if len(id) != 6 || id[0] != 'E' || strings.ContainsAny(id[1:], "ILOU") {
		t.Fatalf("id %q", id)
	}
	base := errors.New("exit status 1")
	err := fmt.Errorf("run agent: %w", errors.Join(base, errors.New("stderr: boom")))
	got := Chain(err)
	if len(got) != 4 || !strings.HasPrefix(got[0], "*fmt.wrapError: run agent") || got[2] != "*errors.errorString: exit status 1" {
		t.Fatalf("chain %q", got)
	}
}
