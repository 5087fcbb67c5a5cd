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
// into): what was decided, in the past tense, and where or by whom —
// "✅ Allowed in the web chat: Run deploy", "🚫 Denied by @alice: Run
// deploy", "✅ Allowed by the operator: …".
func ApprovalSettled(a *event.Approval) string {
	switch a.Outcome {
	case event.ApprovalSelected:
		icon := "🚫 "
		if a.Allowed() {
			icon = "✅ "
		}
		return icon + ApprovalDecision(a) + ": " + a.Title
	case event.ApprovalTimeout:
		return "⌛ No answer within " + FormatDuration(a.ExpiresAt.Sub(a.CreatedAt)) + ", so it was denied: " + a.Title
	case event.ApprovalExpired:
		return "⌛ This question expired — a server problem interrupted the request before anyone answered: " + a.Title
	}
	return "⏹️ The request stopped before anyone answered: " + a.Title
}

// ApprovalDecision words a question's chosen option in the past tense and
// who chose it: "Allowed in the web chat", "Denied by @alice". An option of
// no known kind is quoted by its label ("“Skip” chosen by @alice").
func ApprovalDecision(a *event.Approval) string {
	return decision(a) + answeredBy(a.By)
}

func decision(a *event.Approval) string {
	switch a.OptionKind {
	case "allow_once":
		return "Allowed"
	case "allow_always":
		return "Always allowed"
	case "reject_once":
		return "Denied"
	case "reject_always":
		return "Always denied"
	}
	label := a.OptionID
	if o, ok := a.Option(a.OptionID); ok {
		label = o.Label
	}
	return "“" + label + "” chosen"
}

// answeredBy words who answered, as the channels name them (event.Approval.By):
// a place for the clients a person answers in ("in the web chat", "in the
// TUI"), a person or role otherwise ("by @alice", "by the operator").
func answeredBy(by string) string {
	switch by {
	case "":
		return ""
	case "web chat", "TUI":
		return " in the " + by
	case "operator":
		return " by the operator"
	case "WebSocket client":
		return " by a WebSocket client"
	}
	return " by " + by
}
