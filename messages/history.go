package messages

// HistoryUnavailable is what a client reads when a conversation's stored
// history cannot be read (the store does not answer): the history is not
// shown as empty, and the client may retry.
const HistoryUnavailable = "⚠️ This conversation's history can't be read right now because of a temporary problem on the server. Please try again shortly."
