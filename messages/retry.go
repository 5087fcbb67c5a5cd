package messages

// The answers to a tapped Retry button (Telegram shows them briefly over
// the chat). Plain text. A refused tap starts nothing.
const (
	// RetrySending: the tap was taken; the message runs again.
	RetrySending = "🔁 Sending it again…"
	// RetryTooOld: the button is genuine, but its request is no longer kept.
	RetryTooOld = "⚠️ I no longer have that request — please send it again."
	// RetryElsewhere: the button belongs to another chat.
	RetryElsewhere = "⚠️ That button belongs to another chat."
	// RetryRunning: the run this button started is still queued or running.
	RetryRunning = "🔁 That request is already running again."
	// RetryNotOwner: only the person who sent the request may retry it.
	RetryNotOwner = "Only the person who sent that request can retry it."
	// RetryExpired: the button is not one this gateway offers now (a button
	// from before Retry buttons carried a token, or one it never made).
	RetryExpired = "⚠️ This button has expired — please send the message again."
	// RetryUsed: the button already sent its request again, and that run
	// has ended.
	RetryUsed = "⚠️ This button was already used — send the message again to run it once more."
)
