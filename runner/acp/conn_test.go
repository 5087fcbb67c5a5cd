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
