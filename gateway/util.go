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

func toRunnerHistory(h []Message) []runner.Message {
	out := make([]runner.Message, 0, len(h))
	for _, m := range h {
		if m.StopReason != "" && m.StopReason != "stop" {
			continue // notices are for the user, not the model
		}
		out = append(out, runner.Message{Role: m.Role, Text: m.Text})
	}
	return out
}

func sortSessions(s []SessionInfo) {
	slices.SortFunc(s, func(a, b SessionInfo) int { return b.Updated.Compare(a.Updated) })
}

func sortSnapshots(s []abort.Snapshot) {
	slices.SortFunc(s, func(a, b abort.Snapshot) int { return a.StartedAt.Compare(b.StartedAt) })
}
