package acp

import (
	"strings"
	"testing"
)

// TestAgentErrorIsCut: an agent's error message, logged as a Go error, is
// cut, whatever its length.
func TestAgentErrorIsCut(t *testing.T) {
	e := &rpcError{Code: 1, Message: strings.Repeat("x", 1<<20)}
	if n := len(e.Error()); n > 600 {
		t.Errorf("an agent error of 1 MiB is %d bytes as a Go error, want at most 600", n)
	}
}

// TestFSLimit: fs requests are taken while both the count and the bytes
// allow, and what is given back can be taken again.
func TestFSLimit(t *testing.T) {
	l := fsLimit{max: 2, maxBytes: 10}
	steps := []struct {
		take int64 // > 0: take that many bytes; < 0: give them back
		ok   bool
	}{
		{4, true}, {7, false}, {6, true}, {1, false}, {-6, false}, {7, false}, {6, true},
	}
	for i, st := range steps {
		if st.take < 0 {
			l.give(-st.take)
			continue
		}
		if got := l.take(st.take); got != st.ok {
			t.Errorf("step %d: take(%d) = %v, want %v (n %d, bytes %d)", i, st.take, got, st.ok, l.n, l.use)
		}
	}
}
