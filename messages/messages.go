// Package messages owns the plain-words texts a user reads when a turn does
// not end normally (a timeout, a stop, a restart) or is slow (the "⏳ Still
// working" notice). Each text is a Go text/template configured under
// `messages:`; templates are parsed and test-executed once, at load, so a bad
// template is a configuration error and Render never fails at run time.
package messages

import (
	"fmt"
	"sort"
	"strings"
	"text/template"
	"time"
)

// Name identifies one message template; the names are the YAML keys under
// `messages:`.
type Name string

// The templates.
const (
	Timeout     Name = "timeout"
	StepTimeout Name = "stepTimeout"
	MaxTurnTime Name = "maxTurnTime"
	Progress    Name = "progress"
	Interrupted Name = "interrupted"
	Shutdown    Name = "shutdown"
	User        Name = "user"
	Error       Name = "error"
	Superseded  Name = "superseded"
)

// Defaults are the built-in texts.
var Defaults = map[Name]string{
	Timeout:     `⚠️ This request hit its time limit of {{.Limit}} after {{.Elapsed}}{{if .CurrentStep}} while {{.CurrentStep}} was running{{else if .LastStep}} — last action was {{.LastStep}}{{end}}. Try again, or ask for something smaller.`,
	StepTimeout: `⚠️ No progress for {{.StepTimeout}}{{if .CurrentStep}} — {{.CurrentStep}} never finished{{if .LastStep}} (last completed: {{.LastStep}}){{end}}{{else if .LastStep}} — last action was {{.LastStep}}{{end}}. The task may be stuck. Retry or ask for a simpler approach.`,
	MaxTurnTime: `⚠️ This request reached the maximum time of {{.Limit}}{{if .CurrentStep}} while {{.CurrentStep}} was running{{else if .LastStep}} — last action was {{.LastStep}}{{end}}. It was stopped; please split it into smaller requests.`,
	Progress:    `⏳ Still working — {{.CurrentStep}} has been running for {{.Elapsed}}…`,
	Interrupted: `⚠️ The gateway restarted while working on your request{{with or .CurrentStep .LastStep}} — last action was {{.}}{{end}}. Please send it again.`,
	Shutdown:    `⚠️ The gateway is shutting down, so your request was stopped after {{.Elapsed}}{{if .CurrentStep}} while {{.CurrentStep}} was running{{else if .LastStep}} — last action was {{.LastStep}}{{end}}. Please send it again in a minute.`,
	User:        `⏹️ Stopped{{if .CurrentStep}} while {{.CurrentStep}} was running{{end}} after {{.Elapsed}}.`,
	Superseded:  `⏭️ I stopped this request{{if .CurrentStep}} while {{.CurrentStep}} was running{{end}} because your newer message replaced it — working on that one now.`,
	Error:       `❌ Something went wrong on my side{{if .CurrentStep}} during {{.CurrentStep}}{{end}} (error id {{.ErrorID}}) — try again, or tell the operator this id.`,
}

// Fields are what a template can use. Durations render in human form
// (1m30s, not 90000).
type Fields struct {
	Elapsed     Duration // how long the turn (or, for Progress, the step) has run
	LastStep    string   // the last completed step's name, or ""
	CurrentStep string   // the running step's name, or ""
	StepTimeout Duration // the liveness window
	Limit       Duration // the limit that was hit (wall clock or ceiling)
	ErrorID     string   // for Error: the id under which the failure's details are logged and kept for operators
	// Error is the error id too (kept for templates written before ErrorID).
	// A template never sees the runner's error: it may hold stderr lines,
	// a stack or a secret, and goes to the log and the admin API only.
	Error string
}

// Duration renders as a rounded, human Go duration: 1m30s, 2s, 450ms (see
// FormatDuration). Every duration a template shows is a Duration.
type Duration time.Duration

// String is FormatDuration.
func (d Duration) String() string { return FormatDuration(time.Duration(d)) }

// FormatDuration is how every user-facing text shows a duration: rounded to
// a unit a person reads — whole seconds from a minute up (1m30s, 5m0s),
// tenths of a second from one second (2s, 1.5s), whole milliseconds below
// (120ms) — and never below a millisecond: anything shorter, and anything
// negative, is 0s (not 49.209µs).
func FormatDuration(t time.Duration) string {
	switch {
	case t >= time.Minute:
		t = t.Round(time.Second)
	case t >= time.Second:
		t = t.Round(100 * time.Millisecond)
	case t > 0:
		t = t.Round(time.Millisecond)
	default:
		t = 0
	}
	return t.String()
}

// Set is a parsed, validated set of templates. It is immutable and safe for
// concurrent use.
type Set struct {
	t map[Name]*template.Template
}

// Parse builds a Set from overrides (name → template text) on top of the
// defaults. An unknown name, a template that does not parse, or one that
// fails on sample fields is an error naming the key
// ("messages.stepTimeout: …"); so is one longer than MaxTemplateBytes or
// using a construct that could run long or allocate much (range, template
// calls, printf widths: see checkTree).
func Parse(overrides map[string]string) (*Set, error) {
	s := &Set{t: make(map[Name]*template.Template, len(Defaults))}
	keys := make([]string, 0, len(overrides))
	for k := range overrides {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, ok := Defaults[Name(k)]; !ok {
			return nil, fmt.Errorf("messages.%s: unknown message (known: %s)", k, knownNames())
		}
	}
	for name, def := range Defaults {
		text := def
		if o, ok := overrides[string(name)]; ok {
			text = o
		}
		if len(text) > MaxTemplateBytes {
			return nil, fmt.Errorf("messages.%s: must be at most %d bytes, got %d", name, MaxTemplateBytes, len(text))
		}
		t, err := newTemplate(string(name)).Option("missingkey=error").Parse(text)
		if err != nil {
			return nil, fmt.Errorf("messages.%s: %w", name, err)
		}
		if err := checkTree(t); err != nil {
			return nil, fmt.Errorf("messages.%s: %w", name, err)
		}
		sample := Fields{Elapsed: Duration(90 * time.Second), LastStep: "web_search", CurrentStep: "shell",
			StepTimeout: Duration(5 * time.Minute), Limit: Duration(30 * time.Minute), ErrorID: "E7K2QX", Error: "E7K2QX"}
		if _, err := execute(t, sample); err != nil {
			return nil, fmt.Errorf("messages.%s: %w", name, err)
		}
		s.t[name] = t
	}
	return s, nil
}

// MustDefault returns the Set of built-in texts.
func MustDefault() *Set {
	s, err := Parse(nil)
	if err != nil {
		panic(err)
	}
	return s
}

// Render executes template n with f, within MaxOutputBytes and MaxExecTime.
// Templates were checked at Parse, so an execution error can only come from a
// pathological value (a step name so long the text passes the byte cap);
// Render then falls back to the default text and, failing that, a plain
// sentence.
func (s *Set) Render(n Name, f Fields) string {
	if t, ok := s.t[n]; ok {
		if out, err := execute(t, f); err == nil {
			return strings.TrimSpace(out)
		}
	}
	if t, err := newTemplate("").Parse(Defaults[n]); err == nil {
		if out, err := execute(t, f); err == nil {
			return strings.TrimSpace(out)
		}
	}
	return fmt.Sprintf("The request stopped (%s) after %s.", n, f.Elapsed)
}

func knownNames() string {
	names := make([]string, 0, len(Defaults))
	for n := range Defaults {
		names = append(names, string(n))
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
