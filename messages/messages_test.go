package messages

import (
	"strings"
	"testing"
	"time"
)

// parseWithin runs Parse and fails the test if it does not return promptly:
// before the bounds, the range below ran for minutes and grew to 20 GB.
func parseWithin(t *testing.T, overrides map[string]string) (*Set, error) {
	t.Helper()
	type result struct {
		s   *Set
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := Parse(overrides)
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-time.After(10 * time.Second): // real time: guards against a template that never ends
		t.Fatalf("Parse(%q) did not return within 10s", overrides)
		return nil, nil
	}
}

// doublingTemplate is the reviewer's template: a 16-byte string doubled n
// times by reassignment, writing nothing (448 bytes for n = 21; before the
// fix Parse took ~1 s and each render 32 MB; 30 doublings need 16 GB).
func doublingTemplate(n int) string {
	return `{{$a := "0123456789abcdef"}}` + strings.Repeat(`{{$a = print $a $a}}`, n)
}

// chainedDoublingTemplate doubles through fresh declarations instead of
// reassignment ({{$a := print $a $a}} shadows $a), so only the bounded print
// stops it.
func chainedDoublingTemplate(n int) string {
	return `{{$a := "0123456789abcdef"}}` + strings.Repeat(`{{$a := print $a $a}}`, n) + `{{len $a}}`
}

// TestParseRefusesUnboundedTemplates: a template that could loop, recurse
// or allocate much is a configuration error naming the key, found quickly.
func TestParseRefusesUnboundedTemplates(t *testing.T) {
	tests := []struct {
		name, text, want string
	}{
		{"range over .Elapsed (issue 10)", `{{range $i := .Elapsed}}x{{end}}`,
			"messages.progress: progress:1:8: {{range}} is not allowed in a message"},
		{"range over a number", `{{range 1000000000}}x{{end}}`, "{{range}} is not allowed in a message"},
		{"range inside if", `{{if .CurrentStep}}{{range .Elapsed}}x{{end}}{{end}}`, "{{range}} is not allowed in a message"},
		{"range inside with else", `{{with .LastStep}}a{{else}}{{range .Limit}}x{{end}}{{end}}`, "{{range}} is not allowed in a message"},
		{"recursive template", `{{define "a"}}x{{template "a" .}}{{end}}{{template "a" .}}`,
			"{{template}} and {{block}} are not allowed in a message"},
		{"block", `{{block "b" .}}x{{end}}`, "{{template}} and {{block}} are not allowed in a message"},
		{"printf width", `{{printf "%0999999999d" 1}}`, "printf width or precision 999999999 is above 64"},
		{"printf precision", `{{printf "%.100000f" 1.0}}`, "printf width or precision 100000 is above 64"},
		{"printf width from an argument", `{{printf "%*d" .Elapsed 1}}`, "printf widths and precisions from arguments (*) are not allowed"},
		{"printf in a pipeline argument", `{{print (printf "%99999d" 1)}}`, "printf width or precision 99999 is above 64"},
		{"printf with a variable format", `{{printf .CurrentStep}}`, "printf needs a constant format string"},
		{"printf with a piped format", `{{"%0999999999d" | printf}}`, "printf needs a constant format string"},
		{"printf with a format in a variable", `{{$f := "%0999999999d"}}{{printf $f 1}}`, "printf needs a constant format string"},
		{"template text too long", strings.Repeat("x", MaxTemplateBytes+1), "messages.progress: must be at most 4096 bytes, got 4097"},
		{"output too long", strings.Repeat(`{{printf "%64s" ""}}`, 100), "the message is longer than 4096 bytes"},
		{"reassigned variable doubling without writing", doublingTemplate(21),
			"messages.progress: progress:1:30: assigning to a variable again ({{$a = …}}) is not allowed in a message"},
		{"declared variables doubling without writing", chainedDoublingTemplate(30),
			"print would give more than 4096 bytes"},
		{"js doubling in a pipeline", `{{"\\" | ` + strings.Repeat("js | ", 30) + `len}}`,
			"js would give more than 4096 bytes"},
		{"html growing in a pipeline", `{{"` + strings.Repeat("&", 1000) + `" | html | len}}`,
			"html would give more than 4096 bytes"},
		{"urlquery growing in a pipeline", `{{"` + strings.Repeat("%", 1500) + `" | urlquery | len}}`,
			"urlquery would give more than 4096 bytes"},
		{"println doubling", `{{$a := "0123456789abcdef"}}` + strings.Repeat(`{{$a := println $a $a}}`, 30) + `{{len $a}}`,
			"println would give more than 4096 bytes"},
		{"printf doubling", `{{$a := "0123456789abcdef"}}` + strings.Repeat(`{{$a := printf "%s%s" $a $a}}`, 30) + `{{len $a}}`,
			"printf would give more than 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseWithin(t, map[string]string{"progress": tt.text})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Parse = %v\nwant an error containing %q", err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "messages.progress: ") {
				t.Errorf("the error does not name the key: %v", err)
			}
		})
	}
}

// TestParseAcceptsOrdinaryTemplates: the bounds do not refuse what a
// message needs: conditions, with, variables, small printf widths.
func TestParseAcceptsOrdinaryTemplates(t *testing.T) {
	for _, text := range []string{
		`{{if .CurrentStep}}on {{.CurrentStep}}{{else if .LastStep}}after {{.LastStep}}{{end}}`,
		`{{with or .CurrentStep .LastStep}}{{.}}{{end}} {{$e := .Elapsed}}{{$e}}`,
		`{{printf "%-10s|%5.2f|%v" .CurrentStep 1.5 .Elapsed}} {{len .LastStep}} {{.Limit | print}}`,
		`{{/* a comment */}}{{if and .CurrentStep (ne .LastStep "x")}}y{{end}}`,
	} {
		if _, err := parseWithin(t, map[string]string{"user": text}); err != nil {
			t.Errorf("Parse(%q) = %v", text, err)
		}
	}
}

// TestRenderIsBounded: a value that makes the text pass MaxOutputBytes falls
// back to a short sentence instead of a huge message.
func TestRenderIsBounded(t *testing.T) {
	s, err := Parse(map[string]string{"progress": `{{.CurrentStep}} {{.CurrentStep}}`})
	if err != nil {
		t.Fatal(err)
	}
	got := s.Render(Progress, Fields{CurrentStep: strings.Repeat("y", MaxOutputBytes), Elapsed: Duration(2 * time.Second)})
	if len(got) > MaxOutputBytes {
		t.Fatalf("Render gave %d bytes, more than %d", len(got), MaxOutputBytes)
	}
	if got != "The request stopped (progress) after 2 s." {
		t.Errorf("Render = %q, want the plain fallback sentence", got)
	}
}

// TestFormatDuration: what a user reads for a duration.
func TestFormatDuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, "0 s"},
		{49209 * time.Nanosecond, "0 s"}, // issue 9: was "49.209µs"
		{499 * time.Microsecond, "0 s"},
		{500 * time.Microsecond, "1 ms"},
		{-3 * time.Second, "0 s"},
		{120*time.Millisecond + 400*time.Microsecond, "120 ms"},
		{999 * time.Millisecond, "999 ms"},
		{999*time.Millisecond + 600*time.Microsecond, "1 s"},
		{time.Second + 449*time.Millisecond, "1.4 s"},
		{2*time.Second + 30*time.Millisecond, "2 s"},
		{3900 * time.Millisecond, "3.9 s"},
		{9960 * time.Millisecond, "10 s"},
		{15 * time.Second, "15 s"},
		{45*time.Second + 400*time.Millisecond, "45 s"},
		{59*time.Second + 960*time.Millisecond, "1 min"},
		{90*time.Second + 400*time.Millisecond, "1 min 30 s"},
		{4*time.Minute + 59*time.Second, "4 min 59 s"}, // issue 22: was "4m59s"
		{5 * time.Minute, "5 min"},                     // issue 22: was "5m0s"
		{10 * time.Minute, "10 min"},
		{12*time.Minute + 20*time.Second, "about 12 min"},
		{30*time.Minute + 400*time.Millisecond, "30 min"},
		{time.Hour + 499*time.Millisecond, "1 h"}, // issue 22: was "1h0m0s"
		{90 * time.Minute, "1 h 30 min"},
		{2*time.Hour + 5*time.Minute + 10*time.Second, "about 2 h 5 min"},
		{25 * time.Hour, "25 h"},
	}
	for _, tt := range tests {
		if got := FormatDuration(tt.d); got != tt.want {
			t.Errorf("FormatDuration(%v) = %q, want %q", tt.d, got, tt.want)
		}
		if got := Duration(tt.d).String(); got != tt.want {
			t.Errorf("Duration(%v).String() = %q, want %q", tt.d, got, tt.want)
		}
	}
	// Through a template, as a user sees it.
	s := MustDefault()
	if got := s.Render(User, Fields{Elapsed: Duration(49209 * time.Nanosecond)}); got != "⏹️ Stopped after 0 s." {
		t.Errorf("user message = %q", got)
	}
}
