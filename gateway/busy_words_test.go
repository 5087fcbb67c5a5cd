package gateway

import "testing"

// TestQueueFullWords: the refusal reads right for every busy.maxQueued —
// no "1 messages", and no "0 messages are waiting" when nothing may wait.
func TestQueueFullWords(t *testing.T) {
	for _, tc := range []struct {
		limit int
		want  string
	}{
		{0, "⏳ I'm still working on your previous message — send /stop to cancel it, or wait for the answer."},
		{1, "📥 A message is already waiting — wait for an answer, or send /stop to stop the request and drop it."},
		{5, "📥 5 messages are already waiting — wait for an answer, or send /stop to stop the request and drop them."},
	} {
		if got := (&QueueFullError{SessionKey: "s", Limit: tc.limit}).UserText(); got != tc.want {
			t.Errorf("limit %d: %q, want %q", tc.limit, got, tc.want)
		}
	}
}
