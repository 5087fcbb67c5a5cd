package messages

import "testing"

func TestEnding(t *testing.T) {
	for _, tc := range []struct {
		name, reason, reply, message string
		final, notice                string
	}{
		{"reply", "stop", "Hello", "", "Hello", ""},
		{"empty reply", "stop", "  ", "", EmptyReply, ""},
		{"timeout with partial", "timeout", "Half", "⚠️ limit", "Half", "⚠️ limit"},
		{"timeout without partial", "step_timeout", "", "⚠️ stuck", "", "⚠️ stuck"},
		{"timeout without message", "max_turn_time", "", "", "", "⚠️ This request hit a time limit and was stopped."},
		{"user without message", "user", "", " ", "", "⏹️ Stopped."},
		{"shutdown without message", "shutdown", "", "", "", "⚠️ The gateway is shutting down, so your request was stopped. Please send it again in a minute."},
		{"error", "error", "", "❌ id E1", "", "❌ id E1"},
		{"unknown without message", "superseded", "", "", "", "⚠️ Something went wrong with this request."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			final, notice := Ending(tc.reason, tc.reply, tc.message)
			if final != tc.final || notice != tc.notice {
				t.Errorf("Ending(%q, %q, %q) = %q, %q; want %q, %q", tc.reason, tc.reply, tc.message, final, notice, tc.final, tc.notice)
			}
		})
	}
}
