// A run's streamed reply: AppendText adds a chunk under the reply cap
// (DefaultMaxReplyChars; CapReply and cutChars cut at a character
// boundary and end the text with the engine's marker), Text reads it.

package abort

import (
	"strings"
	"unicode/utf8"
)

// replyText is a run's streamed reply, allocated with its first chunk (the
// reply cap's bookkeeping costs a run nothing until it streams).
type replyText struct {
	b         strings.Builder
	chars     int  // characters in b (before the marker)
	truncated bool // b reached the cap and ends with the marker
}

// DefaultMaxReplyChars is the reply cap of a run registered without one.
const DefaultMaxReplyChars = 100_000

// AppendText adds streamed reply text and returns the full text so far and
// what this chunk added to it. The text is capped at maxChars characters
// (agents.defaults.maxReplyChars; ≤ 0 = DefaultMaxReplyChars): the part of a
// chunk beyond it is dropped, the text then ends with marker (part of added:
// the engine's words for the cut, from messages/), and later chunks are
// ignored (added is empty: there is nothing to stream). A run's callers pass
// the same maxChars and marker every time.
func (r *Run) AppendText(chunk string, maxChars int, marker string) (full, added string) {
	if maxChars <= 0 {
		maxChars = DefaultMaxReplyChars
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	side := r.sideLocked()
	if side.text == nil {
		side.text = new(replyText)
	}
	t := side.text
	if t.truncated {
		return t.b.String(), ""
	}
	added = chunk
	if keep, cut := cutChars(chunk, maxChars-t.chars); cut {
		added = keep + marker
		t.truncated = true
	} else {
		t.chars += utf8.RuneCountInString(chunk)
	}
	t.b.WriteString(added)
	return t.b.String(), added
}

// CapReply returns text cut at maxChars characters (≤ 0 =
// DefaultMaxReplyChars), ending with marker when it was cut: the engine
// applies it to a runner's final text.
func CapReply(text string, maxChars int, marker string) string {
	if maxChars <= 0 {
		maxChars = DefaultMaxReplyChars
	}
	if keep, cut := cutChars(text, maxChars); cut {
		return keep + marker
	}
	return text
}

// cutChars returns the first n characters of s, and whether s was longer.
func cutChars(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false // n bytes hold at least n characters
	}
	i := 0
	for c := 0; i < len(s); c++ {
		if c == n {
			return s[:i], true
		}
		_, w := utf8.DecodeRuneInString(s[i:])
		i += w
	}
	return s, false
}

// Text returns the reply text streamed so far (capped like AppendText).
func (r *Run) Text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.side == nil || r.side.text == nil {
		return ""
	}
	return r.side.text.b.String()
}
