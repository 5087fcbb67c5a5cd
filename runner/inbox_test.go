package runner

import (
	"slices"
	"testing"
)

// TestInboxNotes: the gateway's notes are kept apart from the person's
// messages, wake Noted, are bounded, and are dropped (never returned as
// messages) when the inbox closes; a NotesOnly inbox refuses messages.
func TestInboxNotes(t *testing.T) {
	for _, tt := range []struct {
		name      string
		in        *Inbox
		wantPut   bool
		wantTaken []string
	}{
		{"full inbox", &Inbox{}, true, []string{"hello"}},
		{"notes only", NotesOnly(), false, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.in
			if got := b.Put("hello"); got != tt.wantPut {
				t.Errorf("Put = %v, want %v", got, tt.wantPut)
			}
			if !b.Note("1 min left") {
				t.Fatal("Note refused on an open inbox")
			}
			select {
			case <-b.Noted():
			default:
				t.Fatal("Noted did not fire after a note")
			}
			if got := b.TakeNotes(); !slices.Equal(got, []string{"1 min left"}) {
				t.Errorf("TakeNotes = %q", got)
			}
			for range maxNotes {
				b.Note("n")
			}
			if b.Note("one too many") {
				t.Errorf("Note accepted past maxNotes (%d)", maxNotes)
			}
			if got := b.Close(); !slices.Equal(got, tt.wantTaken) {
				t.Errorf("Close = %q, want the messages only, %q", got, tt.wantTaken)
			}
			if b.Note("late") || len(b.TakeNotes()) != 0 {
				t.Error("a closed inbox took a note, or kept the untaken ones")
			}
		})
	}
}
