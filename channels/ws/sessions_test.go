package ws

import (
	"strings"
	"testing"
)

// TestSessionKeysAllowEmojiSequences: U+FE0F (emoji presentation), U+200D
// joining two pictographs and the tag characters of subdivision flags are
// parts of ordinary emoji; they were refused as invisible characters.
// Elsewhere — alone, between letters, trailing — they could make two keys
// look alike, and are still refused, as are bidi controls, zero-width
// spaces and the BOM.
func TestSessionKeysAllowEmojiSequences(t *testing.T) {
	tests := []struct {
		name, key string
		ok        bool
	}{
		{"red heart with VS16", "agent:main:❤️", true},
		{"family ZWJ sequence", "agent:main:👨‍👩‍👧", true},
		{"skin tone then ZWJ", "agent:main:👩🏽‍💻", true},
		{"heart on fire (VS16 then ZWJ)", "agent:main:❤️‍🔥", true},
		{"rainbow flag", "🏳️‍🌈", true},
		{"Scotland flag (tags)", "agent:main:🏴\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F", true},
		{"keycap", "agent:main:#️⃣", true},
		{"country flag", "agent:main:🇫🇷", true},
		{"plain emoji", "agent:main:👍", true},

		{"ZWJ between letters", "ma\u200din", false},
		{"ZWJ leading", "\u200d👍", false},
		{"ZWJ trailing after emoji", "main👍\u200d", false},
		{"ZWJ emoji to letter", "👍\u200dx", false},
		{"two ZWJ", "👨\u200d\u200d👩", false},
		{"VS16 after a letter", "main\ufe0f", false},
		{"VS16 alone", "\ufe0f", false},
		{"VS16 twice", "❤\ufe0f\ufe0f", false},
		{"VS15", "❤\ufe0e", false},
		{"tag after a letter", "main\U000E0067\U000E007F", false},
		{"tags without cancel", "🏴\U000E0067\U000E0062", false},
		{"cancel tag alone", "🏴\U000E007F", false},
		{"cancel tag after letter", "x\U000E007F", false},
		{"bidi override", "main\u202e", false},
		{"zero-width space", "ma\u200bin", false},
		{"BOM", "\ufeffmain", false},
		{"soft hyphen", "ma\u00adin", false},
		{"replacement char", "main\ufffd", false},
	}
	for _, tc := range tests {
		_, rerr := canonicalKey("chat.history", tc.key)
		if ok := rerr == nil; ok != tc.ok {
			t.Errorf("%s %+q: accepted=%v, want %v (%v)", tc.name, tc.key, ok, tc.ok, rerr)
		}
		if !tc.ok && rerr != nil && !strings.Contains(rerr.Message, "invisible or direction-changing") {
			t.Errorf("%s: %s", tc.name, rerr.Message)
		}
	}
}
