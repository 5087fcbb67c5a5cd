package messages

import "strings"

// ReplyTruncated is what a reply cut at maxChars characters
// (agents.defaults.maxReplyChars) ends with, streamed and final alike.
func ReplyTruncated(maxChars int) string {
	return "\n\n[… reply truncated at " + FormatCount(maxChars) + " characters]"
}

// EmptyReply is what a user reads when a turn finished normally without any
// reply text.
const EmptyReply = "✅ Done (the assistant sent no text)."

// Ending returns the texts a user reads when a turn ends, for a channel that
// delivers them as messages: final is the reply (or the partial reply of a
// turn that did not end normally; "" when there is none) and notice the
// stop, timeout, shutdown or error notice ("" for a turn that finished
// normally). reason is the turn's stop reason ("stop" for a normal end),
// reply its reply text so far and message the notice the engine rendered
// for it. A turn that finished normally always has a final text (EmptyReply
// when the reply is blank); one that did not always has a notice (a plain
// fallback sentence when message is blank).
//
// It is the one place these texts are decided: the store writes them to the
// outbox in the transaction that ends the turn, and channels send exactly
// what it wrote.
func Ending(reason, reply, message string) (final, notice string) {
	if reason == "stop" {
		if strings.TrimSpace(reply) == "" {
			return EmptyReply, ""
		}
		return reply, ""
	}
	if strings.TrimSpace(reply) != "" {
		final = reply
	}
	notice = message
	if strings.TrimSpace(notice) == "" {
		notice = fallbackNotice(reason)
	}
	return final, notice
}

// fallbackNotice is the notice of a turn whose ending carries no rendered
// message.
func fallbackNotice(reason string) string {
	switch reason {
	case "timeout", "step_timeout", "max_turn_time":
		return "⚠️ This request hit a time limit and was stopped."
	case "shutdown":
		return "⚠️ The gateway is shutting down, so your request was stopped. Please send it again in a minute."
	case "user":
		return "⏹️ Stopped."
	}
	return "⚠️ Something went wrong with this request."
}
