package messages

// The Telegram channel's words about how a running turn is shown
// (channels.telegram.streaming), for /help.

// TelegramProgress is /help's sentence on what a Telegram user sees while
// a turn works. streaming is channels.telegram.streaming ("draft", "edit",
// "off"); steps is channels.telegram.showSteps.
func TelegramProgress(streaming string, steps bool) string {
	switch streaming {
	case "off":
		return "While it works you see “typing…”."
	case "draft":
		s := "While it works you see its answer being written"
		if steps {
			s += ", a line for each tool it uses"
		}
		return s + " and a “⏳ Still working” note if one step takes long; Telegram's Stop button stops it as /stop does. " +
			"In groups the notes come as messages instead."
	}
	s := "While it works you see “typing…”"
	if steps {
		s += ", a line for each tool it uses"
	}
	return s + ", and a “⏳ Still working” note if one step takes long."
}
