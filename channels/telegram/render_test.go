package telegram

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/runner"
)

func TestSplitText(t *testing.T) {
	cases := []struct {
		name  string
		text  string
		limit int
		want  []string
	}{
		{"fits", "hello world", 20, []string{"hello world"}},
		{"empty", "", 10, nil},
		{"blank", " \n\n ", 10, nil},
		{"paragraph first", "aaaa bbb\ncc\n\ndddd", 14, []string{"aaaa bbb\ncc", "dddd"}},
		{"then line", "aaaa bbbb\ncccc dddd", 12, []string{"aaaa bbbb", "cccc dddd"}},
		{"then space", "aaaa bbbb cccc", 10, []string{"aaaa bbbb", "cccc"}},
		{"hard cut", "abcdefghij", 4, []string{"abcd", "efgh", "ij"}},
		{"no tiny pieces", "a\nbbbbbbbbbbbbbbbbbbb", 10, []string{"a\nbbbbbbbb", "bbbbbbbbbb", "b"}},
		{"utf-16 units", "😀😀😀", 4, []string{"😀😀", "😀"}},
		{"no cut inside a rune", "ééééé", 3, []string{"ééé", "éé"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := splitText(tc.text, tc.limit)
			if !slices.Equal(got, tc.want) {
				t.Errorf("splitText(%q, %d) = %q, want %q", tc.text, tc.limit, got, tc.want)
			}
		})
	}
}

func TestToHTML(t *testing.T) {
	cases := []struct{ md, want string }{
		{"a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"},
		{"**bold** text", "<b>bold</b> text"},
		{"use `x<y` here", "use <code>x&lt;y</code> here"},
		{"**a `b` c**", "<b>a <code>b</code> c</b>"},
		{"```go\nif a<b {\n}\n```", `<pre><code class="language-go">if a&lt;b {` + "\n}</code></pre>"},
		{"```\nplain\n```\nafter", "<pre>plain</pre>\nafter"},
		{"```\nunclosed <x>", "<pre>unclosed &lt;x&gt;</pre>"},
		{"```weird lang!\nx\n```", "<pre>x</pre>"},
		{"2 * 3 * 4", "2 * 3 * 4"},
		{"** not bold", "** not bold"},
		{"****", "****"},
		{"`unpaired <", "`unpaired &lt;"},
		{"snake_case_name", "snake_case_name"},
		{"<script>alert(1)</script>", "&lt;script&gt;alert(1)&lt;/script&gt;"},
		{"&amp; stays text", "&amp;amp; stays text"},
		// The provider switch (messages.ProviderSwitched): its model names as code.
		{"↪️ The model `my_model_v2` did not answer in time; switched to `llama3.2`.",
			"↪️ The model <code>my_model_v2</code> did not answer in time; switched to <code>llama3.2</code>."},
	}
	for _, tc := range cases {
		if got := toHTML(tc.md); got != tc.want {
			t.Errorf("toHTML(%q) = %q, want %q", tc.md, got, tc.want)
		}
		if _, err := parseHTML(toHTML(tc.md)); err != nil {
			t.Errorf("toHTML(%q) does not parse: %v", tc.md, err)
		}
	}
}

// TestSplitReplyCodeBlock: a code block cut by a split is closed in one
// chunk and reopened, with its language, in the next.
func TestSplitReplyCodeBlock(t *testing.T) {
	var b strings.Builder
	b.WriteString("Here is the script:\n\n```python\n")
	for i := range 400 {
		fmt.Fprintf(&b, "print(%d)  # a<b & c>d\n", i)
	}
	b.WriteString("```\nThat's all.")
	chunks := splitReply(b.String())
	if len(chunks) < 2 {
		t.Fatalf("%d chunks, want a split", len(chunks))
	}
	if !strings.HasSuffix(chunks[0], "\n```") || !strings.HasPrefix(chunks[1], "```python\n") {
		t.Errorf("the code block is not closed and reopened:\n…%s\n---\n%s…", chunks[0][len(chunks[0])-40:], chunks[1][:40])
	}
	for i, c := range chunks {
		vis, err := parseHTML(toHTML(c))
		if err != nil {
			t.Errorf("chunk %d: %v", i, err)
		}
		if textLen(c) > MaxMessageLen || textLen(vis) > MaxMessageLen {
			t.Errorf("chunk %d too long: %d units plain, %d rendered", i, textLen(c), textLen(vis))
		}
	}
}

// FuzzRender: for any text, every chunk fits a message as plain text and
// as HTML, the HTML always parses, and no visible character is lost.
func FuzzRender(f *testing.F) {
	for _, s := range []string{"a < b", "**x**", "```go\nx\n```", strings.Repeat("word ", 2000),
		strings.Repeat("😀", 3000), "`a` **b `c` d** &", "```\n" + strings.Repeat("<>&\n", 3000)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var visible strings.Builder
		for _, c := range splitReply(s) {
			if textLen(c) > MaxMessageLen {
				t.Fatalf("chunk of %d units", textLen(c))
			}
			v, err := parseHTML(toHTML(c))
			if err != nil {
				t.Fatalf("toHTML(%q) = %q: %v", c, toHTML(c), err)
			}
			if textLen(v) > MaxMessageLen {
				t.Fatalf("rendered chunk of %d units", textLen(v))
			}
			visible.WriteString(v)
		}
		// Every character that is not whitespace, a backtick or an asterisk
		// (markup) is shown, in order.
		strip := func(s string) string {
			return strings.Map(func(r rune) rune {
				if r == '`' || r == '*' || r == ' ' || r == '\n' || r == '\t' || r == '\r' {
					return -1
				}
				return r
			}, s) // an invalid byte is one U+FFFD on both sides

		}
		if got, want := strip(visible.String()), strip(s); got != want && !strings.Contains(s, "```") {
			t.Fatalf("visible text %q, want %q", got, want)
		}
	})
}

// TestLongReplySplitAndEscaped: a long reply full of characters HTML must
// escape, with a code block across the cut, reaches the user as several
// well-formed messages that together show every line.
func TestLongReplySplitAndEscaped(t *testing.T) {
	var b strings.Builder
	for i := range 120 {
		fmt.Fprintf(&b, "Line %d: if a < b && c > d then **bold** & `x<y`.\n", i)
		if i%10 == 9 {
			b.WriteString("\n")
		}
	}
	b.WriteString("```sh\n")
	for i := range 150 {
		fmt.Fprintf(&b, "echo %d > /tmp/f && cat </tmp/f\n", i)
	}
	b.WriteString("```\nThe end.")
	reply := b.String()
	rn := runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		return runner.Result{Text: reply}, nil
	})
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{runner: rn})
		h.say(alice, "write a lot")
		h.advance(10 * time.Second)
		shown := h.screen(alice)
		if len(shown) < 3 {
			t.Fatalf("%d messages, want the reply split", len(shown))
		}
		for _, c := range h.api.callsTo("sendMessage", alice) {
			if c.Fault != "" || c.ParseMode != "HTML" {
				t.Errorf("a chunk was refused or sent unformatted: %s", callLine(c))
			}
		}
		var want []string
		for line := range strings.SplitSeq(reply, "\n") {
			if strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "```") {
				want = append(want, strings.NewReplacer("**", "", "`", "").Replace(line))
			}
		}
		var got []string
		for _, m := range shown {
			for line := range strings.SplitSeq(m, "\n") {
				if strings.TrimSpace(line) != "" {
					got = append(got, line)
				}
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("the messages show %d lines, want the reply's %d lines in order", len(got), len(want))
		}
	})
}
