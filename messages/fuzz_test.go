package messages

import (
	"testing"
	"time"
)

// FuzzTemplates: whatever an operator writes as a message template, Parse
// returns (an error or a set) without panicking, and a set it accepts
// renders, for any step names, a message within MaxOutputBytes — so a
// template can neither wedge -check or a reload nor flood a chat.
func FuzzTemplates(f *testing.F) {
	for _, seed := range []string{
		Defaults[Progress],
		`{{range $i := .Elapsed}}x{{end}}`,
		`{{$a := "0123456789abcdef"}}{{$a = print $a $a}}{{$a = print $a $a}}`,
		`{{"\\" | js | js | js | len}}`,
		`{{printf "%-10s|%5.2f|%v" .CurrentStep 1.5 .Elapsed}}`,
		`{{if .CurrentStep}}on {{.CurrentStep}}{{else if .LastStep}}after {{.LastStep}}{{end}}`,
		`{{define "a"}}x{{template "a" .}}{{end}}{{template "a" .}}`,
		`{{with $x := print .CurrentStep .CurrentStep}}{{print $x $x $x $x}}{{end}}`,
	} {
		f.Add(seed, "shell")
	}
	f.Fuzz(func(t *testing.T, text, step string) {
		start := time.Now()
		s, err := Parse(map[string]string{string(Progress): text})
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("Parse took %v", took)
		}
		if err != nil {
			return
		}
		out := s.Render(Progress, Fields{CurrentStep: step, LastStep: step, Elapsed: Duration(90 * time.Second)})
		if len(out) > MaxOutputBytes {
			t.Fatalf("rendered %d bytes, above %d", len(out), MaxOutputBytes)
		}
	})
}
