package store

import (
	"context"
	"time"

	"github.com/turnguard/turnguard/event"
)

// Bounds of TurnDetails: a history shows a finished turn's first
// MaxTurnSteps steps (the rest are counted in StepsOmitted) and its first
// MaxTurnApprovals settled approvals; one call reads at most MaxTurnDetailRuns
// runs (later ids are ignored) and MaxLimit journal rows.
const (
	MaxTurnSteps      = 20
	MaxTurnApprovals  = 10
	MaxTurnDetailRuns = 200
)

// TurnStep is one step of a finished turn as its history shows it.
type TurnStep struct {
	Kind string
	Name string
	Seq  uint32
	// Completed: the step's completion was recorded; a step that was
	// running when its turn ended was not.
	Completed bool
	Elapsed   time.Duration // the step's duration when Completed
}

// TurnDetail is what a finished turn's history shows besides its texts:
// its steps (in order, at most MaxTurnSteps; StepsOmitted more) and its
// settled approvals (oldest first, at most MaxTurnApprovals).
type TurnDetail struct {
	Steps        []TurnStep
	StepsOmitted int
	Approvals    []ApprovalRecord
}

// TurnDetails reads the steps and settled approvals of finished turns
// (issue 22: a reload shows them as the live page did). SQLite and the
// PostgreSQL store implement it (Backend); store/storetest checks both.
type TurnDetails interface {
	// TurnDetails returns the details of runIDs (the first
	// MaxTurnDetailRuns) that have any; a run with no recorded step and no
	// settled approval is absent from the map.
	TurnDetails(ctx context.Context, runIDs []string) (map[string]TurnDetail, error)
}

// TurnDetailRuns is runIDs without empty ids, cut to MaxTurnDetailRuns.
func TurnDetailRuns(runIDs []string) []string {
	out := make([]string, 0, min(len(runIDs), MaxTurnDetailRuns))
	for _, id := range runIDs {
		if id != "" && len(out) < MaxTurnDetailRuns {
			out = append(out, id)
		}
	}
	return out
}

// AssembleTurnDetails builds TurnDetails' answer from the runs' step
// journal entries (StepStarted, StepCompleted; oldest first) and settled
// approvals (oldest first), applying the bounds.
func AssembleTurnDetails(entries []JournalEntry, approvals []ApprovalRecord) map[string]TurnDetail {
	out := make(map[string]TurnDetail)
	type key struct {
		run string
		seq uint32
	}
	at := make(map[key]int) // a shown step's index in its run's Steps
	for _, e := range entries {
		d := out[e.RunID]
		k := key{e.RunID, e.Step.Seq}
		i, seen := at[k]
		switch {
		case seen && e.Kind == event.StepCompleted && i >= 0:
			d.Steps[i].Completed, d.Steps[i].Elapsed = true, e.Elapsed
		case seen: // a repeated start, or the completion of a step not shown
		case len(d.Steps) >= MaxTurnSteps:
			d.StepsOmitted++
			at[k] = -1
		default:
			at[k] = len(d.Steps)
			st := TurnStep{Kind: e.Step.Kind, Name: e.Step.Name, Seq: e.Step.Seq}
			if e.Kind == event.StepCompleted { // a completion without a recorded start
				st.Completed, st.Elapsed = true, e.Elapsed
			}
			d.Steps = append(d.Steps, st)
		}
		out[e.RunID] = d
	}
	for _, a := range approvals {
		if a.Pending() {
			continue
		}
		d := out[a.RunID]
		if len(d.Approvals) < MaxTurnApprovals {
			d.Approvals = append(d.Approvals, a)
		}
		out[a.RunID] = d
	}
	return out
}
