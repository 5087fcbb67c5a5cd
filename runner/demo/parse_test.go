package demo

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestParseTokens(t *testing.T) {
	tests := []struct {
		token string
		want  Step
		canon string // Step.String(); "" = token itself
	}{
		{"web_search:300ms", Step{Kind: KindTool, Name: "web_search", Dur: 300 * ms}, ""},
		{"shell:2s", Step{Kind: KindTool, Name: "shell", Dur: 2 * time.Second}, ""},
		{"build:1m30s", Step{Kind: KindTool, Name: "build", Dur: 90 * time.Second}, ""},
		{"x:1.5s", Step{Kind: KindTool, Name: "x", Dur: 1500 * ms}, ""},
		{"shell:0", Step{Kind: KindTool, Name: "shell"}, "shell:0s"},
		{"shell:24h", Step{Kind: KindTool, Name: "shell", Dur: 24 * time.Hour}, "shell:24h0m0s"},
		{"shell:hang", Step{Kind: KindTool, Name: "shell", Hang: true}, ""},
		{"shell:stuck", Step{Kind: KindTool, Name: "shell", Stuck: true}, ""},
		{"build:10m:hb=5s", Step{Kind: KindTool, Name: "build", Dur: 10 * time.Minute, Heartbeat: 5 * time.Second}, "build:10m0s:hb=5s"},
		{"build:hang:hb=100ms", Step{Kind: KindTool, Name: "build", Hang: true, Heartbeat: 100 * ms}, ""},
		{"build:stuck:hb=1s", Step{Kind: KindTool, Name: "build", Stuck: true, Heartbeat: time.Second}, ""},
		{"hang:1s", Step{Kind: KindTool, Name: "hang", Dur: time.Second}, ""},
		{"llm:2s", Step{Kind: KindLLM, Name: LLMName, Dur: 2 * time.Second, Text: LLMText}, ""},
		{"llm:hang", Step{Kind: KindLLM, Name: LLMName, Hang: true, Text: LLMText}, ""},
		{"llm:1s:hb=200ms", Step{Kind: KindLLM, Name: LLMName, Dur: time.Second, Heartbeat: 200 * ms, Text: LLMText}, ""},
		{"pause:30s", Step{Kind: KindPause, Dur: 30 * time.Second}, ""},
		{"pause:hang", Step{Kind: KindPause, Hang: true}, ""},
		{"say:All_done", Step{Kind: KindSay, Text: "All done"}, ""},
		{"say:a:b_c", Step{Kind: KindSay, Text: "a:b c"}, ""},
		{"say:2s", Step{Kind: KindSay, Text: "2s"}, ""},
		{"say:héllo_✓", Step{Kind: KindSay, Text: "héllo ✓"}, ""},
	}
	for _, tt := range tests {
		steps, err := Parse(tt.token)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.token, err)
			continue
		}
		if len(steps) != 1 || steps[0] != tt.want {
			t.Errorf("Parse(%q) = %+v, want [%+v]", tt.token, steps, tt.want)
			continue
		}
		canon := tt.canon
		if canon == "" {
			canon = tt.token
		}
		if got := steps[0].String(); got != canon {
			t.Errorf("Parse(%q)[0].String() = %q, want %q", tt.token, got, canon)
		}
	}
}

func TestParseScript(t *testing.T) {
	steps, err := Parse("  web_search:300ms\tllm:1s \n shell:hang  ")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range steps {
		got = append(got, s.String())
	}
	if want := "web_search:300ms llm:1s shell:hang"; strings.Join(got, " ") != want {
		t.Errorf("Parse = %v, want %s", got, want)
	}
	if _, err := Parse(strings.Repeat("a:1s ", MaxTokens)); err != nil {
		t.Errorf("script of MaxTokens tokens: %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		script string
		index  int    // 1-based bad token, 0 = whole script
		want   string // substring of the error
	}{
		{"", 0, "the script is empty"},
		{" \t\n ", 0, "the script is empty"},
		{strings.Repeat("a:1s ", MaxTokens+1), 0, "101 tokens, at most 100 allowed"},
		{"shell", 1, `token 1 "shell": no ":" — use NAME:DUR`},
		{"a:1s shell:abc", 2, `token 2 "shell:abc": "abc" is not a duration (use 300ms, 2s, hang or stuck)`},
		{"shell:", 1, `missing duration after ":"`},
		{"shell:1", 1, `"1" is not a duration`},
		{"shell:-1s", 1, `duration "-1s" is negative`},
		{"shell:25h", 1, `duration "25h" is longer than the 24h cap`},
		{"shell:99999999999h", 1, `"99999999999h" is not a duration`},
		{"Shell:1s", 1, `"Shell" is not a tool name (use lowercase a-z and _ only)`},
		{"web-search:1s", 1, `"web-search" is not a tool name`},
		{"tool2:1s", 1, `"tool2" is not a tool name`},
		{"ünï:1s", 1, `"ünï" is not a tool name`},
		{":1s", 1, `tool name is missing before ":"`},
		{strings.Repeat("a", MaxNameLen+1) + ":1s", 1, "tool name is longer than 64 characters"},
		{"shell:1s:hb=1s:x", 1, `too many ":"`},
		{"shell:1s:every=1s", 1, `unknown option "every=1s" (use hb=EVERY`},
		{"shell:1s:hb=", 1, `heartbeat "" is not a duration`},
		{"shell:1s:hb=x", 1, `heartbeat "x" is not a duration`},
		{"shell:1s:hb=0s", 1, `heartbeat interval "0s" is shorter than 100ms`},
		{"shell:1s:hb=99ms", 1, `heartbeat interval "99ms" is shorter than 100ms`},
		{"shell:1s:hb=-1s", 1, `heartbeat interval "-1s" is negative`},
		{"shell:1s:hb=25h", 1, `heartbeat interval "25h" is longer than the 24h cap`},
		{"pause:stuck", 1, "pause takes DUR or hang, not stuck"},
		{"pause:1s:hb=1s", 1, "pause takes no options"},
		{"llm:soon", 1, `"soon" is not a duration`},
		{"say:", 1, "say needs text"},
		{"say:___", 1, "say needs text"},
		{"a:1s b:2s c:3 d:oops", 3, `token 3 "c:3"`},
		{"a:1s " + strings.Repeat("x", 100), 2, `token 2 "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…": no ":"`},
	}
	for _, tt := range tests {
		steps, err := Parse(tt.script)
		var pe *ParseError
		if !errors.As(err, &pe) {
			t.Errorf("Parse(%.40q) = %v, %v; want a *ParseError", tt.script, steps, err)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "bad /steps script: ") || !strings.Contains(msg, tt.want) {
			t.Errorf("Parse(%.40q) error\n got %s\nwant it to contain %s", tt.script, msg, tt.want)
		}
		if pe.Index != tt.index {
			t.Errorf("Parse(%.40q) error index = %d, want %d", tt.script, pe.Index, tt.index)
		}
		if tt.index > 0 && pe.Token != strings.Fields(tt.script)[tt.index-1] {
			t.Errorf("Parse(%.40q) error token = %q", tt.script, pe.Token)
		}
	}
}

var toolName = regexp.MustCompile(`^[a-z_]+$`)

// checkSteps checks the invariants of a script Parse accepted.
func checkSteps(t *testing.T, script string, steps []Step) {
	t.Helper()
	tokens := strings.Fields(script)
	if len(steps) == 0 || len(steps) != len(tokens) || len(steps) > MaxTokens {
		t.Fatalf("Parse(%q): %d steps from %d tokens", script, len(steps), len(tokens))
	}
	for i, s := range steps {
		if s.Dur < 0 || s.Dur > MaxDuration {
			t.Errorf("step %d %+v: duration out of range", i+1, s)
		}
		if s.Heartbeat != 0 && (s.Heartbeat < MinHeartbeat || s.Heartbeat > MaxDuration) {
			t.Errorf("step %d %+v: heartbeat out of range", i+1, s)
		}
		if s.Hang && s.Stuck || (s.Hang || s.Stuck) && s.Dur != 0 {
			t.Errorf("step %d %+v: more than one of Dur, Hang, Stuck", i+1, s)
		}
		switch s.Kind {
		case KindTool:
			if !toolName.MatchString(s.Name) || len(s.Name) > MaxNameLen {
				t.Errorf("step %d %+v: bad tool name", i+1, s)
			}
		case KindLLM:
			if s.Name != LLMName || s.Text != LLMText {
				t.Errorf("step %d %+v: bad llm step", i+1, s)
			}
		case KindSay:
			if strings.TrimSpace(s.Text) == "" || strings.Contains(s.Text, "_") || s.Dur != 0 || s.Hang || s.Stuck || s.Heartbeat != 0 {
				t.Errorf("step %d %+v: bad say step", i+1, s)
			}
		case KindPause:
			if s.Name != "" || s.Stuck || s.Heartbeat != 0 {
				t.Errorf("step %d %+v: bad pause step", i+1, s)
			}
		default:
			t.Errorf("step %d %+v: unknown kind", i+1, s)
		}
	}
	// Round trip: the canonical tokens parse to the same steps.
	canon := make([]string, len(steps))
	for i, s := range steps {
		canon[i] = s.String()
	}
	again, err := Parse(strings.Join(canon, " "))
	if err != nil {
		t.Fatalf("Parse(%q) ok, but its canonical form %q fails: %v", script, canon, err)
	}
	for i := range steps {
		if again[i] != steps[i] {
			t.Errorf("round trip of token %d: %+v -> %q -> %+v", i+1, steps[i], canon[i], again[i])
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"web_search:300ms shell:hang",
		"web_search:300ms llm:2s say:Found_it",
		"say:Building... build:10m:hb=5s say:Built",
		"pause:30s say:Approved",
		"shell:stuck:hb=1s llm:hang pause:hang",
		"shell:abc",
		"shell:1s:hb=1s:x",
		"say:a:b_c",
		"",
		"Shell:-1s",
		strings.Repeat("a:1s ", MaxTokens+1),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, script string) {
		steps, err := Parse(script)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Parse(%q): error %T, want *ParseError", script, err)
			}
			if steps != nil {
				t.Errorf("Parse(%q): steps with an error", script)
			}
			msg := pe.Error()
			if !strings.HasPrefix(msg, "bad /steps script: ") || pe.Reason == "" {
				t.Errorf("Parse(%q): error %q", script, msg)
			}
			tokens := strings.Fields(script)
			if pe.Index < 0 || pe.Index > len(tokens) {
				t.Fatalf("Parse(%q): error index %d of %d tokens", script, pe.Index, len(tokens))
			}
			if pe.Index > 0 && pe.Token != tokens[pe.Index-1] {
				t.Errorf("Parse(%q): error names token %q, token %d is %q", script, pe.Token, pe.Index, tokens[pe.Index-1])
			}
			if len(msg) > 1000 {
				t.Errorf("Parse(%q): error message of %d bytes", script, len(msg))
			}
			return
		}
		checkSteps(t, script, steps)
	})
}
