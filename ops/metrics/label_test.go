package metrics

import (
	"regexp"
	"strings"
	"testing"
)

// TestLabelMatchesIdentifierPattern checks that label, which avoids a
// regexp, bounds values exactly as ^[A-Za-z][A-Za-z0-9_]{0,39}$ would.
func TestLabelMatchesIdentifierPattern(t *testing.T) {
	pattern := regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,39}$`)
	cases := []string{"llm", "tool", "web_search", "A", "a1", "a_", "_a", "1a", "a-b", "a b", "tool\n",
		"é", "aé", strings.Repeat("a", 40), strings.Repeat("a", 41), "Z9_z", "a\x00", "[", "`", "{", "@", "a/b"}
	for _, s := range cases {
		want := "other"
		if pattern.MatchString(s) {
			want = s
		}
		if got := label(s); got != want {
			t.Errorf("label(%q) = %q, want %q", s, got, want)
		}
	}
	if got := label(""); got != "none" {
		t.Errorf(`label("") = %q, want "none"`, got)
	}
}
