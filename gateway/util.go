// Small helpers on histories and listings (bounded appends, runner
// history, sorting).

package gateway

import (
	"slices"
	"strings"
	"unicode"

	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/runner"
)

func hasNonSpace(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return !unicode.IsSpace(r) }) >= 0
}

// appendBounded appends m, keeping at most limit messages (0 = unbounded).
func appendBounded(h []Message, m Message, limit int) []Message {
	h = append(h, m)
	if limit > 0 && len(h) > limit {
		h = append(h[:0:0], h[len(h)-limit:]...)
	}
	return h
}

// toRunnerHistory is the history a runner is given: the conversation
// without notices and without the partial replies of stopped turns (the
// model never sees what the user was told about a stop, nor a reply that
// was cut off; TestLifecycleModel checks it).
func toRunnerHistory(h []Message) []runner.Message {
	out := make([]runner.Message, 0, len(h))
	for i, m := range h {
		if notice(m) {
			continue // notices are for the user, not the model
		}
		if m.Role == "assistant" && i+1 < len(h) && notice(h[i+1]) {
			continue // the partial reply of a stopped turn (recordOutcome puts its notice right after it)
		}
		out = append(out, runner.Message{Role: m.Role, Text: m.Text})
	}
	return out
}

// notice reports whether m is a turn's notice (a stop other than a normal
// end): words for the user, never for the model.
func notice(m Message) bool { return m.StopReason != "" && m.StopReason != "stop" }

func sortSessions(s []SessionInfo) {
	slices.SortFunc(s, func(a, b SessionInfo) int { return b.Updated.Compare(a.Updated) })
}

func sortSnapshots(s []abort.Snapshot) {
	slices.SortFunc(s, func(a, b abort.Snapshot) int { return a.StartedAt.Compare(b.StartedAt) })
}
