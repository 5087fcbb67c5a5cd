package ws

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
)

// Finished turns in chat.history (turnguard's extension, docs/protocol.md
// §6 "chat.history … finished turns"; issue 22): a finished turn's first
// assistant message carries `turnguard` — the turn's step lines and its
// settled approval cards, as the live page drew them — so that a reload
// still shows what ran and who allowed it. OpenClaw clients ignore it.

// turnView is a finished turn's `turnguard` field.
type turnView struct {
	RunID        string        `json:"runId"`
	Steps        []stepLine    `json:"steps,omitempty"`
	StepsOmitted int           `json:"stepsOmitted,omitempty"` // steps after the last shown
	Approvals    []settledView `json:"approvals,omitempty"`
}

// stepLine is one step line: the tool id the live events used, the
// step's name, how it ended (completed, failed, stopped) and how long it
// took when that was recorded.
type stepLine struct {
	ToolCallID string `json:"toolCallId"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	Status     string `json:"status"`
	DurationMs int64  `json:"durationMs,omitempty"`
}

// settledView is a settled approval card: the question (its detail is not
// repeated), its outcome and who answered, and the settled text the live
// page showed (messages.ApprovalSettled).
type settledView struct {
	event.Approval
	Text string `json:"text"`
}

// turnsShare is the part of server.maxAnswerBytes a history's finished
// turns may take; the messages take the rest.
const turnsShare = 4

// finishedTurns reads the steps and settled approvals of the turns that
// end in msgs (newest first, while their encoding fits in a quarter of
// budget) and returns their views by run id and the bytes they take. A
// store that does not answer leaves the history without them (logged).
func (s *Server) finishedTurns(ctx context.Context, key string, msgs []gateway.Message, budget int) (map[string]*turnView, int) {
	ending := make(map[string]event.StopReason)
	var ids []string // newest first
	for _, m := range slices.Backward(msgs) {
		if _, seen := ending[m.RunID]; m.RunID == "" || m.Role != "assistant" || seen {
			continue
		}
		ending[m.RunID] = m.StopReason // the newest: the turn's ending
		ids = append(ids, m.RunID)
	}
	details, err := s.eng.TurnDetails(ctx, ids)
	if err != nil {
		s.log.Warn("chat.history without the turns' steps and approvals", "session", key, "err", err)
		return nil, 0
	}
	if len(details) == 0 {
		return nil, 0
	}
	views, used := make(map[string]*turnView), 0
	for _, id := range ids {
		d, ok := details[id]
		if !ok {
			continue
		}
		v := newTurnView(id, d, ending[id])
		if v == nil {
			continue
		}
		b, err := json.Marshal(v)
		if err != nil || used+len(b)+historyOverhead > budget/turnsShare {
			break
		}
		views[id], used = v, used+len(b)+historyOverhead
	}
	return views, used
}

// newTurnView is the view of run id's details; the turn ended with stop.
// nil when there is nothing to show (its steps were LLM calls only, which
// the live page does not draw).
func newTurnView(id string, d event.TurnDetail, stop event.StopReason) *turnView {
	v := &turnView{RunID: id, StepsOmitted: d.StepsOmitted}
	for _, st := range d.Steps {
		step := event.Step{Kind: st.Kind, Name: st.Name, Seq: st.Seq}
		if !isTool(step) {
			continue
		}
		sv := stepLine{ToolCallID: toolCallID(id, step), Kind: st.Kind, Name: step.Label(), Status: unfinishedStep(stop)}
		if st.Completed {
			sv.Status, sv.DurationMs = "completed", st.Elapsed.Milliseconds()
		}
		v.Steps = append(v.Steps, sv)
	}
	for _, a := range d.Approvals {
		v.Approvals = append(v.Approvals, settledView{Approval: a, Text: messages.ApprovalSettled(&a)})
	}
	if len(v.Steps) == 0 && len(v.Approvals) == 0 && v.StepsOmitted == 0 {
		return nil
	}
	return v
}

// unfinishedStep is how a step still running at its turn's end is shown,
// as the live events closed it: completed when the turn finished, failed
// when it failed, stopped when it was stopped.
func unfinishedStep(stop event.StopReason) string {
	switch stop {
	case event.ReasonStop, "":
		return "completed"
	case event.ReasonError:
		return "failed"
	}
	return "stopped"
}

// attachTurns sets each view on the first assistant message of its run in
// out (its reply, or its partial reply before the notice): a page draws the
// turn's steps and cards above it, where they were live.
func attachTurns(out []*historyMessage, views map[string]*turnView) {
	for _, m := range out {
		if v, ok := views[m.RunID]; ok && m.Role == "assistant" {
			m.Turnguard = v
			delete(views, m.RunID)
		}
	}
}

// maxResumedLookups bounds the store lookups of one chat.history answer
// (markResumed): the newest interrupted turns are asked about, older ones
// keep their Retry as before resume.
const maxResumedLookups = 32

// markResumed sets Resumed on the notices in out of interrupted turns that
// were dispatched again (Options.Resumed), newest first, at most
// maxResumedLookups turns. A lookup that fails leaves the notice with its
// Retry (logged), as Telegram does.
func (s *Server) markResumed(ctx context.Context, out []*historyMessage) {
	if s.opts.Resumed == nil {
		return
	}
	asked := make(map[string]bool)
	for _, m := range slices.Backward(out) {
		if m.Role != "assistant" || m.RunID == "" || m.StopReason != string(event.ReasonInterrupted) {
			continue
		}
		yes, seen := asked[m.RunID]
		if !seen {
			if len(asked) == maxResumedLookups {
				return
			}
			var err error
			if yes, err = s.opts.Resumed(ctx, m.RunID); err != nil {
				s.log.Warn("chat.history: cannot tell whether an interrupted turn was resumed", "run", m.RunID, "err", err)
			}
			asked[m.RunID] = yes
		}
		m.Resumed = yes
	}
}
