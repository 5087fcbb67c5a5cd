package messages

import (
	"fmt"
	"strconv"
)

// QueueFull is what a person reads when their message was refused because
// limit messages (busy.maxQueued, at least 1) already wait for the running
// request: queued, or handed to it and not yet taken.
func QueueFull(limit int) string {
	if limit == 1 {
		return "📥 A message is already waiting — wait for an answer, or send /stop to stop the request and drop it."
	}
	return fmt.Sprintf("📥 %d messages are already waiting — wait for an answer, or send /stop to stop the request and drop them.", limit)
}

// QueueBytesFull is what a person reads when their message was refused
// because, with it, the text waiting for the running request would pass
// budget bytes (busy.maxQueuedBytes).
func QueueBytesFull(budget int) string {
	return "📥 That message would bring the text waiting for the assistant over its limit of " + FormatBytes(budget) +
		" — wait for an answer and send it then, or send /stop to stop the request and drop what waits."
}

// FormatBytes is how a user-facing text shows a size: whole KiB or MiB when
// it is one (64 KiB, 1 MiB), else bytes with thousands separated
// (1,500 bytes; 1 byte).
func FormatBytes(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.Itoa(n>>20) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.Itoa(n>>10) + " KiB"
	case n == 1:
		return "1 byte"
	}
	return FormatCount(n) + " bytes"
}

// FormatCount is how a user-facing text shows a count: thousands separated
// by commas (100,000).
func FormatCount(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
