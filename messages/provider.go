package messages

import (
	"fmt"
	"strings"
)

// The texts of the model runner (runner/openai) about its providers.

// ProviderSwitched is what a user reads, at the point of the reply where it
// happened, when a turn's model call failed before any reply text or tool
// call and the turn moved to the next of agents.openai.fallbacks: from is
// the model that failed, to the one that answers from now on; timedOut
// says whether from sent nothing in time (else it failed outright). Said
// once per switch, so normally once per turn. It is the first line of the
// reply, which Telegram and the web chat render as Markdown: the model
// names are code spans, shown as code whatever characters they hold (a
// `*` is no emphasis), apart from the sentence around them (a plain
// client shows the backticks).
func ProviderSwitched(from, to string, timedOut bool) string {
	why := "failed"
	if timedOut {
		why = "did not answer in time"
	}
	return fmt.Sprintf("↪️ The model %s %s; switched to %s.", codeSpan(from), why, codeSpan(to))
}

// codeSpan is s as a Markdown code span: a backtick in s (no model name
// has one) becomes a quote, so the span cannot end early.
func codeSpan(s string) string {
	return "`" + strings.ReplaceAll(s, "`", "'") + "`"
}
