package conv

import (
	"testing"

	"github.com/turnguard/turnguard/gateway/abort"
)

// conv reads a snapshot's state by name without importing the registry:
// the name must be the registry's.
func TestStateRunningIsTheRegistrysName(t *testing.T) {
	if got := abort.StateRunning.String(); got != stateRunning {
		t.Fatalf("abort.StateRunning is %q; conv compares snapshots with %q", got, stateRunning)
	}
}
