package messages

import (
	"strings"

	"github.com/turnguard/turnguard/event"
)

// ApprovalAsked is the text of a question a runner asks the person (the
// ApprovalRequested event's Message). Channels show it with a button per
// option; a channel without buttons lists the options after it.
func ApprovalAsked(a *event.Approval) string {
	var b strings.Builder
	b.WriteString("🔐 Approval needed: ")
	b.WriteString(a.Title)
	if a.Detail != "" {
		b.WriteString("\n")
		b.WriteString(a.Detail)
	}
	if d := a.ExpiresAt.Sub(a.CreatedAt); d > 0 {
		b.WriteString("\nAnswer within ")
		b.WriteString(FormatDuration(d))
		b.WriteString(", or it will be denied.")
	}
	return b.String()
}

// ApprovalSettled is the text of how a question was settled (the
// ApprovalResolved event's Message, and what a channel edits the question
// into).
func ApprovalSettled(a *event.Approval) string {
	label := a.OptionID
	if o, ok := a.Option(a.OptionID); ok {
		label = o.Label
	}
	by := ""
	if a.By != "" {
		by = " by " + a.By
	}
	switch a.Outcome {
	case event.ApprovalSelected:
		if a.Allowed() {
			return "✅ " + label + by + ": " + a.Title
		}
		return "🚫 " + label + by + ": " + a.Title
	case event.ApprovalTimeout:
		return "⌛ No answer within " + FormatDuration(a.ExpiresAt.Sub(a.CreatedAt)) + ", so it was denied: " + a.Title
	case event.ApprovalExpired:
		return "⌛ This question expired — the gateway restarted before anyone answered: " + a.Title
	}
	return "⏹️ The request stopped before anyone answered: " + a.Title
}
