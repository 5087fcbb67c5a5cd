package event

import "time"

// TurnStep is one step of a finished turn as its history shows it.
type TurnStep struct {
	Kind string
	Name string
	Seq  uint32
	// Completed: the step's completion was recorded; a step still running
	// when its turn ended was not.
	Completed bool
	Elapsed   time.Duration // the step's duration when Completed
}

// TurnDetail is what a finished turn's history shows besides its texts
// (issue 22: a reload shows what the live page showed): its steps in order
// (bounded by the store; StepsOmitted more) and its settled approvals,
// oldest first, with their outcome and who answered (not their detail,
// which the history does not repeat). The store builds it
// (store.TurnDetails), the engine passes it on (gateway.Engine.TurnDetails)
// and the channels draw it.
type TurnDetail struct {
	Steps        []TurnStep
	StepsOmitted int
	Approvals    []Approval
}
