package store

import (
	"context"

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

// TurnDetails reads the steps and settled approvals of finished turns
// (event.TurnDetail: its steps in order, at most MaxTurnSteps, StepsOmitted
// more; its settled approvals oldest first, at most MaxTurnApprovals; issue
// 22: a reload shows them as the live page did). SQLite and the
// PostgreSQL store implement it (Backend); store/storetest checks both.
type TurnDetails interface {
	// TurnDetails returns the details of runIDs (the first
	// MaxTurnDetailRuns) that have any; a run with no recorded step and no
	// settled approval is absent from the map.
	TurnDetails(ctx context.Context, runIDs []string) (map[string]event.TurnDetail, error)
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
func AssembleTurnDetails(entries []JournalEntry, approvals []ApprovalRecord) map[string]event.TurnDetail {
	out := make(map[string]event.TurnDetail)
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
			st := event.TurnStep{Kind: e.Step.Kind, Name: e.Step.Name, Seq: e.Step.Seq}
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
			d.Approvals = append(d.Approvals, settled(a))
		}
		out[a.RunID] = d
	}
	return out
}

// settled is a settled approval as a history shows it: the question without
// its detail, the outcome and who answered.
func settled(a ApprovalRecord) event.Approval {
	return event.Approval{ID: a.ID, Title: a.Title, Tool: a.Tool, Options: a.Options,
		CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt, Outcome: a.Status, OptionID: a.OptionID,
		OptionKind: a.OptionKind, By: a.AnsweredBy, ResolvedAt: a.ResolvedAt}
}
