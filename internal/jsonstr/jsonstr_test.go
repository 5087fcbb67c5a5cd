package jsonstr

import (
	"encoding/json"
	"testing"
)

// TestAppendMatchesEncodingJSON: what Append writes decodes to what
// encoding/json's encoding of the same string decodes to, invalid UTF-8
// included.
func TestAppendMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", "a\"b\\c", "line\nnext\r\ttab", "\x00\x01\x1f\x7f", "héllo ☃ 😀", "bad \xff\xfe utf8", "\u2028\u2029", "<&>"} {
		got := Append([]byte("x"), s)
		var back, want string
		if err := json.Unmarshal(got[1:], &back); err != nil {
			t.Errorf("%q: %s is not JSON: %v", s, got, err)
			continue
		}
		b, _ := json.Marshal(s)
		_ = json.Unmarshal(b, &want)
		if back != want || got[0] != 'x' {
			t.Errorf("%q: %s decodes to %q, want %q", s, got, back, want)
		}
	}
}
