package exec

import (
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/turnguard/turnguard/runner"
)

// FuzzAgentLine: whatever line an agent prints — jsonl or Claude's
// stream-json, well-formed or not — the parser never panics, and the
// reply it builds stays valid text when the input was.
//
//	go test -run '^$' -fuzz '^FuzzAgentLine$' -fuzztime 30s ./runner/exec/
func FuzzAgentLine(f *testing.F) {
	for _, seed := range []string{
		`{"type":"step_start","kind":"tool","name":"shell"}`,
		`{"type":"step_complete","kind":"tool","name":"shell"}`,
		`{"type":"delta","text":"hé"}`,
		`{"type":"final","text":"done"}`,
		`{"type":"error","message":"boom"}`,
		`{"type":"heartbeat"}`, `{"type":"pause","reason":"x"}`, `{"type":"resume"}`,
		`{"type":"permission","id":"p1","title":"Delete build/","options":[{"id":"y","kind":"allow_once"}]}`,
		`{"type":"permission","id":7,"title":"x","options":[{"id":"a","kind":"nope"}]}`,
		`{"type":"assistant","message":{"content":[{"type":"tool_use","id":"t1","name":"Bash"}]}}`,
		`{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1"}]}}`,
		`{"type":"result","result":"ok"}`,
		`{"type":`, `not json`, "\x00\xff", `{"type":"delta","text":null}`,
	} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	f.Fuzz(func(t *testing.T, line string, claude bool) {
		format := FormatJSONL
		if claude {
			format = FormatClaude
		}
		s := newState(runner.Nop{}, slog.New(slog.DiscardHandler), format)
		for range 2 { // a line seen twice: steps opened and closed again
			s.line([]byte(line))
		}
		if utf8.ValidString(line) && !utf8.ValidString(s.reply()) {
			t.Fatalf("reply %q from valid input %q is not valid UTF-8", s.reply(), line)
		}
	})
}

// FuzzPermission: a permission request is either refused with a reason or
// becomes a question a person can be shown: a title, bounded texts, at
// least one option, unique option ids of known kinds.
//
//	go test -run '^$' -fuzz '^FuzzPermission$' -fuzztime 30s ./runner/exec/
func FuzzPermission(f *testing.F) {
	for _, seed := range []string{
		`{"type":"permission","id":"p1","title":"Delete build/","detail":"rm -rf build","tool":"shell",` +
			`"options":[{"id":"y","label":"Yes","kind":"allow_once"},{"id":"n","label":"No","kind":"reject_once"}]}`,
		`{"type":"permission","id":1,"title":"x"}`,
		`{"type":"permission","id":"p","title":"` + strings.Repeat("é", 400) + `"}`,
		`{"type":"permission","id":"p","title":"x","options":[{"id":"a","kind":"allow_once"},{"id":"a","kind":"allow_once"}]}`,
		`{"type":"permission","id":{},"title":"x"}`, `{"type":"permission"}`, `[]`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		_, q, err := parsePermission([]byte(line))
		if err != nil {
			if err.Error() == "" {
				t.Fatal("a refusal without a reason")
			}
			return
		}
		if strings.TrimSpace(q.Title) == "" || len(q.Title) > maxTitle+len("…") || len(q.Detail) > maxDetail+len("…") ||
			len(q.Tool) > maxToolName+len("…") {
			t.Fatalf("question out of bounds: %+v", q)
		}
		if len(q.Options) == 0 || len(q.Options) > maxOptions {
			t.Fatalf("%d options", len(q.Options))
		}
		seen := map[string]bool{}
		for _, o := range q.Options {
			if o.ID == "" || seen[o.ID] || o.Label == "" || len(o.Label) > maxLabel+len("…") {
				t.Fatalf("option %+v of %+v", o, q.Options)
			}
			switch o.Kind {
			case runner.AllowOnce, runner.AllowAlways, runner.RejectOnce, runner.RejectAlways:
			default:
				t.Fatalf("option kind %q", o.Kind)
			}
			seen[o.ID] = true
		}
	})
}
