package store_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/turnguard/turnguard/store"
)

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
