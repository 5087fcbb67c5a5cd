package demo

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/turnguard/turnguard/event"
)

// Step kinds. KindLLM and KindTool are reported to the callbacks as step
// kinds; KindSay and KindPause are not steps for the gateway (say streams
// reply text, pause brackets a wait with Pause/Resume).
const (
	KindLLM   = event.StepLLM  // "llm": an LLM call that streams Text over Dur
	KindTool  = event.StepTool // "tool": tool Name that runs for Dur
	KindSay   = "say"          // reply text, streamed at once
	KindPause = "pause"        // a wait for a human: Pause, wait Dur (or hang), Resume
	KindAsk   = "ask"          // an approval: asks whether tool Name may run, then runs it (0s) or not
)

// Limits of the /steps grammar.
const (
	MaxTokens    = 100            // tokens per script
	MaxDuration  = 24 * time.Hour // longest DUR and hb interval
	MinHeartbeat = 100 * time.Millisecond
	MaxNameLen   = 64 // longest tool name
)

// LLMName is the step name (the "model") of LLM steps.
const LLMName = "demo"

// LLMText is what a scripted llm step streams.
const LLMText = "Thinking about the next step."

// DefaultReply is said at the end of a script that has no say token.
const DefaultReply = "Done."

// Step is one parsed token of a /steps script.
//
// Exactly one of Dur (which may be 0), Hang and Stuck describes how long a
// timed step (llm, tool, pause) runs: Hang means until the turn's context is
// cancelled, Stuck means forever, ignoring cancellation (see
// Runner.Release). Heartbeat, when non-zero, is the interval at which an llm
// or tool step calls Heartbeat while it runs. Text is the reply text of a
// say step and the streamed text of an llm step.
type Step struct {
	Kind      string // KindLLM, KindTool, KindSay or KindPause
	Name      string // the tool name; LLMName for llm; "" for say and pause
	Dur       time.Duration
	Hang      bool
	Stuck     bool
	Heartbeat time.Duration
	Text      string
}

// String returns the token that parses back to s (for steps that Parse
// returned): "shell:2s:hb=500ms", "llm:1s", "say:All_done", "pause:hang".
func (s Step) String() string {
	var b strings.Builder
	switch s.Kind {
	case KindSay:
		return "say:" + strings.ReplaceAll(s.Text, " ", "_")
	case KindAsk:
		return "ask:" + s.Name
	case KindPause:
		b.WriteString("pause")
	case KindLLM:
		b.WriteString("llm")
	default:
		b.WriteString(s.Name)
	}
	b.WriteByte(':')
	switch {
	case s.Hang:
		b.WriteString("hang")
	case s.Stuck:
		b.WriteString("stuck")
	default:
		b.WriteString(s.Dur.String())
	}
	if s.Heartbeat > 0 {
		b.WriteString(":hb=")
		b.WriteString(s.Heartbeat.String())
	}
	return b.String()
}

// ParseError says which token of a /steps script is wrong and why. Its
// Error text is meant for the user as-is:
//
//	bad /steps script: token 2 "shell:abc": "abc" is not a duration (use 300ms, 2s, hang or stuck)
type ParseError struct {
	Index  int    // 1-based index of the bad token; 0 when the script as a whole is wrong
	Token  string // the bad token ("" when Index is 0)
	Reason string
}

func (e *ParseError) Error() string {
	if e.Index == 0 {
		return "bad /steps script: " + e.Reason
	}
	return fmt.Sprintf("bad /steps script: token %d %q: %s", e.Index, clip(e.Token, 40), e.Reason)
}

// Parse parses a /steps script (the text after "/steps"): whitespace-
// separated tokens, one Step per token, in order. It checks the whole script
// and reports the first bad token as a *ParseError. Parse does not add the
// default reply; Runner.Run says DefaultReply when no step is a say.
func Parse(script string) ([]Step, error) {
	tokens := strings.Fields(script)
	switch {
	case len(tokens) == 0:
		return nil, &ParseError{Reason: "the script is empty — try /steps web_search:1s llm:2s say:Found_it (see /help)"}
	case len(tokens) > MaxTokens:
		return nil, &ParseError{Reason: fmt.Sprintf("%d tokens, at most %d allowed", len(tokens), MaxTokens)}
	}
	steps := make([]Step, 0, len(tokens))
	for i, tok := range tokens {
		s, reason := parseToken(tok)
		if reason != "" {
			return nil, &ParseError{Index: i + 1, Token: tok, Reason: reason}
		}
		steps = append(steps, s)
	}
	return steps, nil
}

// parseToken parses one token; a non-empty reason means it is bad.
func parseToken(tok string) (Step, string) {
	name, rest, ok := strings.Cut(tok, ":")
	if !ok {
		return Step{}, `no ":" — use NAME:DUR, NAME:hang, NAME:stuck, llm:DUR, pause:DUR, ask:NAME or say:TEXT`
	}
	if name == "say" {
		text := strings.ReplaceAll(rest, "_", " ")
		if strings.TrimSpace(text) == "" {
			return Step{}, "say needs text, e.g. say:All_done"
		}
		return Step{Kind: KindSay, Text: text}, ""
	}
	if name == "ask" {
		if reason := checkName(rest); reason != "" || rest == "" || strings.Contains(rest, ":") {
			return Step{}, "ask needs a tool name, e.g. ask:deploy"
		}
		return Step{Kind: KindAsk, Name: rest}, ""
	}
	if reason := checkName(name); reason != "" {
		return Step{}, reason
	}
	parts := strings.Split(rest, ":")
	if len(parts) > 2 {
		return Step{}, `too many ":" — use NAME:DUR or NAME:DUR:hb=EVERY`
	}
	var s Step
	switch name {
	case "llm":
		s = Step{Kind: KindLLM, Name: LLMName, Text: LLMText}
	case "pause":
		s = Step{Kind: KindPause}
	default:
		s = Step{Kind: KindTool, Name: name}
	}
	switch spec := parts[0]; spec {
	case "hang":
		s.Hang = true
	case "stuck":
		if s.Kind == KindPause {
			return Step{}, "pause takes DUR or hang, not stuck"
		}
		s.Stuck = true
	case "":
		return Step{}, `missing duration after ":" (use 300ms, 2s, hang or stuck)`
	default:
		d, reason := parseDur(spec)
		if reason != "" {
			if reason == notADuration {
				return Step{}, fmt.Sprintf("%q is not a duration (use 300ms, 2s, hang or stuck)", clip(spec, 20))
			}
			return Step{}, "duration " + reason
		}
		s.Dur = d
	}
	if len(parts) == 2 {
		if s.Kind == KindPause {
			return Step{}, "pause takes no options"
		}
		opt := parts[1]
		every, ok := strings.CutPrefix(opt, "hb=")
		if !ok {
			return Step{}, fmt.Sprintf("unknown option %q (use hb=EVERY, e.g. hb=1s)", clip(opt, 20))
		}
		d, reason := parseDur(every)
		switch {
		case reason == notADuration:
			return Step{}, fmt.Sprintf("heartbeat %q is not a duration (use e.g. hb=1s)", clip(every, 20))
		case reason != "":
			return Step{}, "heartbeat interval " + reason
		case d < MinHeartbeat:
			return Step{}, fmt.Sprintf("heartbeat interval %q is shorter than %v", clip(every, 20), MinHeartbeat)
		}
		s.Heartbeat = d
	}
	return s, ""
}

const notADuration = "not a duration"

// parseDur parses a non-negative Go duration up to MaxDuration.
func parseDur(v string) (time.Duration, string) {
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return 0, notADuration
	case d < 0:
		return 0, fmt.Sprintf("%q is negative", v)
	case d > MaxDuration:
		return 0, fmt.Sprintf("%q is longer than the 24h cap", clip(v, 20))
	}
	return d, ""
}

// checkName reports why name is not a tool name ("" when it is one).
func checkName(name string) string {
	if name == "" {
		return `tool name is missing before ":"`
	}
	if len(name) > MaxNameLen {
		return fmt.Sprintf("tool name is longer than %d characters", MaxNameLen)
	}
	for _, c := range name {
		if (c < 'a' || c > 'z') && c != '_' {
			return fmt.Sprintf("%q is not a tool name (use lowercase a-z and _ only)", clip(name, 20))
		}
	}
	return ""
}

// clip shortens s to at most n runes, marking a cut with "…".
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}
