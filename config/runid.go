package config

import "strings"

// TelegramRunIDPrefix begins every run id the Telegram channel makes
// ("tg-<chat>-<message>", and "tg-<chat>-<message>-r…" for a Retry). The
// namespace is Telegram's alone (RunIDReserved): a run id is also the
// idempotency key of its message, so a WebSocket client that picked
// "tg-1001-950" as its idempotencyKey would otherwise take Telegram
// message 950's run, and that message would never run (issue 19).
const TelegramRunIDPrefix = "tg-"

// RunIDReserved reports whether runID lies in the namespace of a channel
// other than channel, so a message of channel must not use it. Only
// Telegram's run ids have a namespace of their own: the WebSocket
// protocol's runId is the client's idempotencyKey itself.
func RunIDReserved(channel, runID string) bool {
	return channel != ChannelTelegram && strings.HasPrefix(runID, TelegramRunIDPrefix)
}
