// Package messages owns the plain-words texts a user reads when a turn does
// not end normally (a timeout, a stop, a restart) or is slow (the "⏳ Still
// working" notice). Each text is a Go text/template configured under
// `messages:`; templates are parsed and test-executed once, at load, so a bad
// template is a configuration error and Render never fails at run time.
package messages

import (
	"fmt"
	"sort"
	"strconv"
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
	// BudgetWarning is the one notice before a turn reaches its time limit
	// (budgetWarningRatio); Left is the time left.
	BudgetWarning Name = "budgetWarning"
)

// Defaults are the built-in texts.
var Defaults = map[Name]string{
	Timeout:       `⚠️ This request was stopped at its time limit of {{.Limit}}{{if .CurrentStep}} while {{.CurrentStep}} was running{{else if .LastStep}} — last action was {{.LastStep}}{{end}}. Try again, or ask for something smaller.`,
	StepTimeout:   `⚠️ No progress for {{.StepTimeout}}{{if .CurrentStep}} — {{.CurrentStep}} never finished{{if .LastStep}} (last completed: {{.LastStep}}){{end}}{{else if .LastStep}} — last action was {{.LastStep}}{{end}}. The task may be stuck. Retry or ask for a simpler approach.`,
	MaxTurnTime:   `⚠️ This request reached the maximum time of {{.Limit}}{{if .CurrentStep}} while {{.CurrentStep}} was running{{else if .LastStep}} — last action was {{.LastStep}}{{end}}. It was stopped; please split it into smaller requests.`,
	Progress:      `⏳ Still working — {{.CurrentStep}} has been running for {{.Elapsed}}…`,
	Interrupted:   `⚠️ Your request was interrupted by a server problem{{with or .CurrentStep .LastStep}} — last action was {{.}}{{end}}. Please send it again.`,
	Shutdown:      `⚠️ The gateway is shutting down, so your request was stopped after {{.Elapsed}}{{if .CurrentStep}} while {{.CurrentStep}} was running{{else if .LastStep}} — last action was {{.LastStep}}{{end}}. Please send it again in a minute.`,
	User:          `⏹️ Stopped{{if .CurrentStep}} while {{.CurrentStep}} was running{{end}} after {{.Elapsed}}.`,
	Superseded:    `⏭️ I stopped this request{{if .CurrentStep}} while {{.CurrentStep}} was running{{end}} because your newer message replaced it — working on that one now.`,
	BudgetWarning: `⏳ Your request will be stopped in {{.Left}} unless it finishes.`,
	Error:         `❌ Something went wrong on my side{{if .Model}} while waiting for the model{{else if .CurrentStep}} during {{.CurrentStep}}{{end}} (error id {{.ErrorID}}) — try again, or tell the operator this id.`,
}

// Fields are what a template can use. Durations render as a person writes
// them (1 min 30 s, not 90000 or 1m30s).
type Fields struct {
	Elapsed     Duration // how long the turn (or, for Progress, the step) has run
	LastStep    string   // the last completed step's name, or ""
	CurrentStep string   // the running step's name, or ""
	StepTimeout Duration // the liveness window
	Limit       Duration // the limit that was hit (wall clock or ceiling)
	Left        Duration // for BudgetWarning: the time left before the turn is stopped
	Model       bool     // the running step is a call to the model (CurrentStep is then "the model")
	ErrorID     string   // for Error: the id under which the failure's details are logged and kept for operators
	// Error is the error id too (kept for templates written before ErrorID).
	// A template never sees the runner's error: it may hold stderr lines,
	// a stack or a secret, and goes to the log and the admin API only.
	Error string
}

// Duration renders as a person writes a duration: "5 min", "1 h 30 min",
// "45 s", "about 12 min" (see FormatDuration). Every duration a user text
// shows is a Duration (messages.Duration(d) in a fmt verb, or a template
// field), so there is one way durations read.
type Duration time.Duration

// String is FormatDuration.
func (d Duration) String() string { return FormatDuration(time.Duration(d)) }

// FormatDuration is how every user-facing text shows a duration — as a
// person writes it, never Go's 5m0s:
//
//   - below a second, whole milliseconds: "120 ms"; below half a
//     millisecond, and anything negative, "0 s" (not 49.209µs);
//   - below ten seconds, tenths: "1.4 s", "2 s";
//   - below a minute, whole seconds: "45 s";
//   - below ten minutes, minutes and seconds: "5 min", "4 min 59 s";
//   - below an hour, whole minutes: "12 min";
//   - from an hour, hours and minutes: "1 h", "1 h 30 min".
//
// A duration rounded by more than a second to its unit (ten minutes and
// up) reads "about …": "about 12 min" for 12 min 20 s.
func FormatDuration(t time.Duration) string {
	switch {
	case t < 500*time.Microsecond:
		return "0 s"
	case t < time.Second-500*time.Microsecond:
		return strconv.FormatInt(int64(t.Round(time.Millisecond)/time.Millisecond), 10) + " ms"
	case t < 10*time.Second-50*time.Millisecond:
		return strconv.FormatFloat(float64(t.Round(100*time.Millisecond))/float64(time.Second), 'f', -1, 64) + " s"
	case t < time.Minute-500*time.Millisecond:
		return strconv.FormatInt(int64(t.Round(time.Second)/time.Second), 10) + " s"
	case t < 10*time.Minute-500*time.Millisecond:
		s := int64(t.Round(time.Second) / time.Second)
		return joinUnits(s/60, "min", s%60, "s")
	}
	about := ""
	if r := t.Round(time.Minute); (r - t).Abs() >= time.Second {
		about = "about "
	}
	m := int64(t.Round(time.Minute) / time.Minute)
	if m < 60 {
		return about + strconv.FormatInt(m, 10) + " min"
	}
	return about + joinUnits(m/60, "h", m%60, "min")
}

// joinUnits writes "a unitA b unitB", leaving out a zero b.
func joinUnits(a int64, unitA string, b int64, unitB string) string {
	s := strconv.FormatInt(a, 10) + " " + unitA
	if b != 0 {
		s += " " + strconv.FormatInt(b, 10) + " " + unitB
	}
	return s
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
			StepTimeout: Duration(5 * time.Minute), Limit: Duration(30 * time.Minute), Left: Duration(time.Minute), ErrorID: "E7K2QX", Error: "E7K2QX"}
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
