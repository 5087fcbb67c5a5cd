package messages

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// The words of the queue controls (issue 23): what a person reads when a
// message was dropped because too many waited (busy.overflow), when a
// queued message was cancelled (Telegram's Cancel button, the web chat's,
// chat.abort of its run id), and the answers of /queue. Plain text.

// quoted is a message's text as the queue words quote it: on one line, at
// most 60 characters.
func quoted(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > 60 {
		s = string([]rune(s)[:59]) + "…"
	}
	return "“" + s + "”"
}

// QueueDroppedOldest is added to the answer of a queued message when
// busy.overflow drop-old dropped the oldest waiting messages (their texts)
// to make room for it.
func QueueDroppedOldest(texts []string) string {
	if len(texts) == 1 {
		return "To make room I dropped the oldest waiting message: " + quoted(texts[0]) + "."
	}
	return fmt.Sprintf("To make room I dropped the %d oldest waiting messages, the first: %s.", len(texts), quoted(texts[0]))
}

// QueueDroppedNew is the answer to a message dropped because limit
// messages already waited (busy.overflow drop-new).
func QueueDroppedNew(limit int, text string) string {
	waiting := "A message is already waiting"
	if limit != 1 {
		waiting = fmt.Sprintf("%d messages are already waiting", limit)
	}
	if limit == 0 {
		waiting = "Nothing may wait while I work"
	}
	return "🗑️ " + waiting + ", so I dropped this one: " + quoted(text) + ". Send it again once I've answered."
}

// QueueCancelled is what a person reads when their queued message was
// cancelled (its text) before it ran.
func QueueCancelled(text string) string {
	return "🗑️ Cancelled — this queued message will not run: " + quoted(text) + "."
}

// The answers to a Cancel button or chat.abort of a queued message that
// could not be cancelled, and the button's label.
const (
	// QueueCancelLabel is the label of the Cancel button on a queued
	// message's acknowledgement.
	QueueCancelLabel = "✖️ Cancel"
	// QueueNotWaiting: the message has started, was dropped or cancelled.
	QueueNotWaiting = "That message is no longer waiting — it has started, or was dropped."
	// QueueCancelNotOwner: only its sender (or an operator) may cancel it.
	QueueCancelNotOwner = "Only the person who sent that message can cancel it."
	// QueueCancelFailed: the cancellation failed for a reason of the
	// gateway's.
	QueueCancelFailed = "⚠️ Sorry — I couldn't cancel that message. Please try again."
)

// BusyModes are the busy modes /queue accepts, in the order it lists them,
// and BusyModeDefault the word that goes back to the configured one.
var BusyModes = []string{"queue", "collect", "steer", "interrupt", "reject"}

// BusyModeDefault is /queue's word for the channel's configured busy mode.
const BusyModeDefault = "default"

// busyModeMeaning says what a busy mode does, after "Busy mode: <mode> — ".
var busyModeMeaning = map[string]string{
	"queue":     "a message sent while I work waits and runs as its own request",
	"collect":   "messages sent while I work are answered together in one request",
	"steer":     "a message sent while I work is passed to the running request",
	"interrupt": "a message sent while I work stops the running request and runs instead",
	"reject":    "a message sent while I work is refused",
}

// overflowMeaning says what busy.overflow does when maxQueued wait.
var overflowMeaning = map[string]string{
	"reject":   "one more is refused",
	"drop-old": "the oldest waiting message is dropped to make room",
	"drop-new": "one more is dropped",
}

// QueueView is the answer to /queue: the busy mode in force (own: set for
// this chat with /queue, not the configured one), the overflow rule at
// maxQueued, the merging window (debounce, already in words; "" when
// off), and the texts waiting, oldest first.
func QueueView(mode string, own bool, overflow string, maxQueued int, debounce string, waiting []string) string {
	var b strings.Builder
	b.WriteString("📥 Busy mode: " + mode)
	if own {
		b.WriteString(" (set for this chat)")
	}
	if m := busyModeMeaning[mode]; m != "" {
		b.WriteString(" — " + m)
	}
	b.WriteString(".")
	if maxQueued == 0 {
		b.WriteString("\nNothing may wait while I work.")
	} else if m := overflowMeaning[overflow]; m != "" {
		fmt.Fprintf(&b, "\nWhen %d wait, %s.", maxQueued, m)
	}
	if debounce != "" {
		b.WriteString("\nMessages sent within " + debounce + " of each other are answered together.")
	}
	switch n := len(waiting); n {
	case 0:
		b.WriteString("\nNothing is waiting.")
	default:
		if n == 1 {
			b.WriteString("\n1 message waiting:")
		} else {
			fmt.Fprintf(&b, "\n%d messages waiting:", n)
		}
		for i, t := range waiting[:min(n, 5)] {
			fmt.Fprintf(&b, "\n%d. %s", i+1, quoted(t))
		}
		if n > 5 {
			fmt.Fprintf(&b, "\n… and %d more", n-5)
		}
	}
	b.WriteString("\nChange it with /queue <mode>: " + strings.Join(BusyModes, ", ") + " (or /queue " + BusyModeDefault + ").")
	return b.String()
}

// QueueModeSet is the answer to /queue <mode>.
func QueueModeSet(mode string) string {
	return "✅ Busy mode for this chat: " + mode + " — " + busyModeMeaning[mode] + "."
}

// QueueModeDefault is the answer to /queue default (configured: the mode
// in force now).
func QueueModeDefault(configured string) string {
	return "✅ This chat uses the configured busy mode again: " + configured + " — " + busyModeMeaning[configured] + "."
}

// QueueModeUnknown is the answer to /queue with a word that is not a mode.
func QueueModeUnknown(word string) string {
	return "❓ " + quoted(word) + " is not a busy mode. Choose one of " + strings.Join(BusyModes, ", ") + " (or " + BusyModeDefault + ")."
}

// QueueModeFailed: the mode could not be stored; nothing changed.
const QueueModeFailed = "⚠️ Sorry — I couldn't change the busy mode. Please try again."
