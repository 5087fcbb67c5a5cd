package telegram

import (
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxMessageLen is Telegram's limit on the text of one message, in UTF-16
// code units after entity parsing (the unit Telegram counts in).
const MaxMessageLen = 4096

// fenceReserve is kept free in each chunk of a reply for the "```" lines
// that close a code block cut by a split and reopen it in the next chunk.
const fenceReserve = 40

// maxFenceLang is the longest code-block language kept in a reopened fence
// and in the HTML class; longer ones are dropped.
const maxFenceLang = 24

// textLen is the length of s as Telegram counts it: UTF-16 code units.
func textLen(s string) int {
	n := 0
	for _, r := range s { // an invalid byte is one U+FFFD: one unit
		n += utf16.RuneLen(r)
	}
	return n
}

// prefixWithin returns the byte length of the longest prefix of s, on a
// rune boundary, whose textLen is at most limit.
func prefixWithin(s string, limit int) int {
	n := 0
	for i, r := range s {
		w := utf16.RuneLen(r)
		if n+w > limit {
			return i
		}
		n += w
	}
	return len(s)
}

// splitText cuts text into pieces of at most limit UTF-16 units each,
// preferring, in order, a paragraph break (blank line), a line break and a
// space, provided the cut keeps at least a quarter of the window (so no
// piece is needlessly tiny); otherwise it cuts hard at a rune boundary. The
// separator at a cut is dropped; pieces that would be only whitespace are
// left out. An empty or blank text gives no pieces.
func splitText(text string, limit int) []string {
	if limit < 1 {
		limit = 1
	}
	var out []string
	add := func(s string) {
		if strings.TrimSpace(s) != "" {
			out = append(out, s)
		}
	}
	for {
		w := prefixWithin(text, limit) // scans at most limit units: linear overall
		if w == len(text) {
			break
		}
		window := text[:w]
		floor := len(window) / 4
		cut, skip := -1, 0
		for _, sep := range []string{"\n\n", "\n", " "} {
			if i := strings.LastIndex(window, sep); i > floor {
				cut, skip = i, len(sep)
				break
			}
		}
		if cut < 0 {
			if w == 0 { // a single rune wider than limit: cannot happen for limit ≥ 2
				w = len(string([]rune(text)[0]))
			}
			add(text[:w])
			text = text[w:]
			continue
		}
		add(strings.TrimRight(text[:cut], " \t\n"))
		text = strings.TrimLeft(text[cut+skip:], "\n")
	}
	add(text)
	return out
}

// splitReply cuts a reply into message-sized chunks (see splitText) and
// repairs code blocks cut in two: a chunk that ends inside a ``` block gets
// a closing ``` and the next chunk reopens it with the same language, so
// each chunk renders on its own. Every chunk is at most MaxMessageLen units
// both as plain text and as rendered HTML.
func splitReply(text string) []string { return splitReplyWithin(text, MaxMessageLen-fenceReserve) }

// splitReplyWithin is splitReply with chunks of at most limit units before
// the fences it adds (at most fenceReserve more).
func splitReplyWithin(text string, limit int) []string {
	chunks := splitText(text, limit)
	open, lang := false, ""
	for i, c := range chunks {
		if open {
			c = "```" + lang + "\n" + c
		}
		open, lang = fenceState(c)
		if open {
			c += "\n```"
		}
		chunks[i] = c
	}
	return chunks
}

// fenceState reports whether s ends inside a ``` code block, and the
// block's language.
func fenceState(s string) (open bool, lang string) {
	for line := range strings.SplitSeq(s, "\n") {
		t := strings.TrimSpace(line)
		if !strings.HasPrefix(t, "```") {
			continue
		}
		if open {
			open, lang = false, ""
		} else {
			open, lang = true, fenceLang(t[3:])
		}
	}
	return open, lang
}

// fenceLang returns the language of a fence opener if it is a plain word
// (letters, digits, _ + - . #), else "".
func fenceLang(s string) string {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > maxFenceLang {
		return ""
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9',
			r == '_', r == '+', r == '-', r == '.', r == '#':
		default:
			return ""
		}
	}
	return s
}

// escapeHTML escapes the three characters Telegram's HTML parse mode
// requires: &, < and >.
func escapeHTML(s string) string {
	if !strings.ContainsAny(s, "&<>") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for _, r := range s {
		switch r {
		case '&':
			b.WriteString("&amp;")
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// toHTML renders the small, unambiguous part of Markdown that assistants
// write into Telegram HTML: ``` fenced code blocks (with an optional
// language), `inline code` and **bold**. Everything else is text, escaped,
// so the result always parses: tags are only ever emitted in balanced
// pairs. An unclosed fence runs to the end; an unpaired ` or ** is literal.
// The visible text is never longer than the source.
func toHTML(md string) string {
	var b strings.Builder
	b.Grow(len(md) + 32)
	var code []string
	inFence, lang := false, ""
	first := true
	emit := func(s string) {
		if !first {
			b.WriteByte('\n')
		}
		first = false
		b.WriteString(s)
	}
	flush := func() {
		open := "<pre>"
		if lang != "" {
			open = `<pre><code class="language-` + escapeHTML(lang) + `">`
		}
		body := escapeHTML(strings.Join(code, "\n"))
		if lang != "" {
			emit(open + body + "</code></pre>")
		} else {
			emit(open + body + "</pre>")
		}
		code, inFence, lang = nil, false, ""
	}
	for line := range strings.SplitSeq(md, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "```") {
			if inFence {
				flush()
			} else {
				inFence, lang, code = true, fenceLang(t[3:]), nil
			}
			continue
		}
		if inFence {
			code = append(code, line)
			continue
		}
		emit(inlineHTML(line))
	}
	if inFence {
		flush()
	}
	return b.String()
}

// inlineHTML renders `code` and **bold** within one line.
func inlineHTML(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		switch {
		case s[0] == '`':
			if j := strings.IndexByte(s[1:], '`'); j > 0 {
				b.WriteString("<code>" + escapeHTML(s[1:1+j]) + "</code>")
				s = s[j+2:]
				continue
			}
		case strings.HasPrefix(s, "**"):
			if j := strings.Index(s[2:], "**"); j > 0 && strings.TrimSpace(s[2:2+j]) != "" {
				b.WriteString("<b>" + inlineHTML(s[2:2+j]) + "</b>")
				s = s[j+4:]
				continue
			}
			b.WriteString("**")
			s = s[2:]
			continue
		}
		i := strings.IndexAny(s[1:], "`*")
		if i < 0 {
			b.WriteString(escapeHTML(s))
			break
		}
		b.WriteString(escapeHTML(s[:i+1]))
		s = s[i+1:]
	}
	return b.String()
}

// clip shortens s to at most n runes, ending with "…" when cut.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
