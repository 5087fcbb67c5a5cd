package messages

import "fmt"

// The texts of the model runner (runner/openai) about its providers.

// ProviderSwitched is what a user reads, at the point of the reply where it
// happened, when a turn's model call failed before any reply text or tool
// call and the turn moved to the next of agents.openai.fallbacks: from is
// the model that failed, to the one that answers from now on; timedOut
// says whether from sent nothing in time (else it failed outright). Said
// once per switch, so normally once per turn.
func ProviderSwitched(from, to string, timedOut bool) string {
	why := "failed"
	if timedOut {
		why = "did not answer in time"
	}
	return fmt.Sprintf("↪️ %s %s; switched to %s.", from, why, to)
}
