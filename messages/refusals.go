package messages

// The sentences a person reads when the gateway refuses or cannot carry out
// a message (the engine's error types return them from UserText, and the
// cluster's endings carry them). They never name an internal cause.
const (
	// HistoryUnavailable: a conversation's stored history cannot be read
	// (the store does not answer): the history is not shown as empty, and
	// the client may retry.
	HistoryUnavailable = "⚠️ This conversation's history can't be read right now because of a temporary problem on the server. Please try again shortly."
	// RunnerStuck: the runner has too many runs that ignored cancellation.
	RunnerStuck = "⚠️ I can't take new requests right now: earlier ones are stuck and still being cleaned up. The operator has been alerted — please try again later."
	// Unavailable: new turns are refused for now (the store cannot write).
	Unavailable = "⚠️ I can't start new requests right now because of a temporary problem on the server. Please try again shortly."
	// Busy: the session runs a turn (busy mode reject).
	Busy = "⏳ I'm still working on your previous message — send /stop to cancel it, or wait for the answer."
	// BusyStopping: the session's turn was aborted and is still stopping.
	BusyStopping = "⏳ Still stopping your previous request — try again in a few seconds."
	// NotStarted: a cluster claim was taken but its turn could not start.
	NotStarted = "This message could not be started. Please send it again."
	// NotClaimed: a queued message's cluster claim failed for now.
	NotClaimed = "This message could not be started: the gateway's cluster cannot take it right now. Please send it again in a moment."
	// OvertakenInCluster: another message of the conversation started
	// first on another replica, so a queued one did not run.
	OvertakenInCluster = "Another message in this conversation started first, so this one did not run. Send it again when that reply is done."
)
