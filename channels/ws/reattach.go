package ws

import (
	"strconv"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
)

// Re-attach: turnguard's extension of chat.history (docs/protocol.md §6,
// "chat.history … turnguard"). A client that opens a session — the web chat
// on load, on a session switch, after a reconnect — learns from the history
// answer what is happening in the session now: its running turn (the step
// running, the last one completed, whether it is paused or stalled and the
// "⏳ Still working" notice it was shown) and the messages queued behind it.
// chat.history already makes the connection watch the session, so the run's
// next events follow; with this the client can draw the turn and its Stop at
// once instead of waiting for the next event. OpenClaw clients ignore the
// field.

// reattachInfo is the `turnguard` object of a chat.history answer.
type reattachInfo struct {
	ActiveRun *activeRunView `json:"activeRun,omitempty"`
	Queue     []queuedView   `json:"queue,omitempty"`
	// Approvals are the running turn's open questions (docs/approvals.md),
	// oldest first: a client that (re)opens the session shows them with
	// their buttons.
	Approvals []approvalView `json:"approvals,omitempty"`
}

// activeRunView is the session's running turn.
type activeRunView struct {
	RunID     string `json:"runId"`
	StartedAt int64  `json:"startedAt"` // unix ms
	ElapsedMs int64  `json:"elapsedMs"`
	// Stopping: the turn was stopped (a deadline, /stop) and waits for its
	// runner to return; its aborted event may already have been sent.
	Stopping    bool      `json:"stopping,omitempty"`
	CurrentStep *stepView `json:"currentStep,omitempty"` // the step running now
	LastStep    *stepView `json:"lastStep,omitempty"`    // the last step completed
	Paused      bool      `json:"paused"`                // waiting for a human (the no-progress clock stops)
	// Stalled: the current step has run past progressNotifyAfterSeconds;
	// ProgressText is then the notice the run's watchers were shown.
	Stalled      bool   `json:"stalled"`
	ProgressText string `json:"progressText,omitempty"`
	// Text is the reply streamed so far (the full text a chat delta
	// carries in message); cut to a quarter of the answer's budget.
	Text string `json:"text,omitempty"`
	// UserText is the user's message this turn answers (a collect turn:
	// the collected messages joined) — what Retry sends again, not a
	// message steered into the turn later; cut to an eighth of the answer's
	// budget. "" when unknown, and in a history answer whose last user
	// message is that text (the common case: no message was steered in).
	UserText string `json:"userText,omitempty"`
}

// stepView is one step as the run's agent events name it.
type stepView struct {
	// ToolCallID is the id of the step's tool events (`<runId>:<step
	// number>`); "" for an LLM call, which has no tool line.
	ToolCallID string `json:"toolCallId,omitempty"`
	Name       string `json:"name"`
	Kind       string `json:"kind,omitempty"`
	StartedAt  int64  `json:"startedAt,omitempty"` // unix ms
	ElapsedMs  int64  `json:"elapsedMs,omitempty"` // the current step: how long it has run
}

// queuedView is a message waiting behind the running turn.
type queuedView struct {
	RunID string `json:"runId"` // the message's own id (its chat.send idempotencyKey)
	// TurnRunID is the run id of the turn it will be answered in: its own
	// in busy mode queue; in collect mode the first collected message's,
	// shared by every message collected into that turn.
	TurnRunID string `json:"turnRunId"`
	Busy      string `json:"busy"` // queue | collect | steer | interrupt: how it waits
	Text      string `json:"text"`
	QueuedAt  int64  `json:"queuedAt"` // unix ms
	Ahead     int    `json:"ahead"`    // queued turns before its turn (the running one not counted)
}

// Bounds of the re-attach block inside a history answer: the reply so far
// takes at most a quarter of server.maxAnswerBytes and the queued texts
// share another quarter, each at least minQueuedText bytes (a longer text is
// cut and says so).
const (
	queueShare     = 4
	minQueuedText  = 256
	queuedOverhead = 120
	activeOverhead = 600
)

// reattach returns the session's running turn and queue for a history
// answer whose budget is budget bytes, and the bytes it takes (nil, 0 when
// the session is idle with nothing queued).
func (s *Server) reattach(st gateway.TurnStatus, budget int) (*reattachInfo, int) {
	if !st.Running && len(st.Queue) == 0 {
		return nil, 0
	}
	info := &reattachInfo{}
	used := 0
	if st.Running {
		info.ActiveRun = s.activeRun(st)
		if jsonLen(st.Text) > budget/queueShare {
			info.ActiveRun.Text = cutText(st.Text, budget/queueShare)
		}
		if jsonLen(info.ActiveRun.UserText) > budget/queueShare/2 {
			info.ActiveRun.UserText = cutText(info.ActiveRun.UserText, budget/queueShare/2)
		}
		used += activeOverhead + jsonLen(info.ActiveRun.ProgressText) + jsonLen(info.ActiveRun.Text) + jsonLen(info.ActiveRun.UserText)
		// Bounded by the engine (at most a few questions a turn, titles
		// and details of bounded length).
		info.Approvals = approvalViewsOf(st)
		for i := range info.Approvals {
			used += len(mustJSON(&info.Approvals[i]))
		}
	}
	if n := len(st.Queue); n > 0 {
		per := max(minQueuedText, budget/queueShare/n)
		info.Queue = s.queueViews(st.Queue)
		for i := range info.Queue {
			q := &info.Queue[i]
			if jsonLen(q.Text) > per {
				q.Text = cutText(q.Text, per)
			}
			used += queuedOverhead + jsonLen(q.Text) + jsonLen(q.RunID) + jsonLen(q.TurnRunID)
		}
	}
	return info, used
}

// queueViews names, for each waiting message (oldest first), the turn it
// will be answered in. The engine lists collected messages one by one; they
// are grouped here the way the engine groups them: a message queued in busy
// mode collect joins the turn of the collect message right before it, any
// other message is a turn of its own (its run id). The mode is the one
// configured now for the message's channel.
func (s *Server) queueViews(queue []gateway.QueuedMessage) []queuedView {
	cfg := s.cfg.Current()
	out := make([]queuedView, 0, len(queue))
	turns := 0
	for i, m := range queue {
		mode, _ := cfg.BusyFor(m.Channel)
		v := queuedView{RunID: m.RunID, TurnRunID: m.RunID, Busy: mode, Text: m.Text, QueuedAt: ms(m.QueuedAt)}
		if prev := len(out) - 1; i > 0 && mode == config.BusyCollect && out[prev].Busy == config.BusyCollect {
			v.TurnRunID = out[prev].TurnRunID
			turns-- // the same turn as the one before
		}
		v.Ahead = turns
		turns++
		out = append(out, v)
	}
	return out
}

func (s *Server) activeRun(st gateway.TurnStatus) *activeRunView {
	t := st.Turn
	v := &activeRunView{
		RunID: t.RunID, StartedAt: ms(t.StartedAt), ElapsedMs: t.Elapsed.Milliseconds(),
		Stopping: t.State != "running", Paused: t.Paused, Stalled: t.Stalled, Text: st.Text,
		UserText: s.userTextOf(t.RunID),
	}
	if !t.CurrentStep.IsZero() {
		v.CurrentStep = stepOf(t.RunID, t.CurrentStep)
		v.CurrentStep.ElapsedMs = t.StepElapsed.Milliseconds()
	}
	if !t.LastStep.IsZero() {
		v.LastStep = stepOf(t.RunID, t.LastStep)
	}
	if t.Stalled && !t.Paused {
		v.ProgressText = s.cfg.Current().MessageSet().Render(messages.Progress, messages.Fields{
			Elapsed: messages.Duration(t.StepElapsed), CurrentStep: t.CurrentStep.Label(),
			LastStep: t.LastStep.Label(), StepTimeout: messages.Duration(st.Limits.StepTimeout),
			Limit: messages.Duration(st.Limits.Timeout),
		})
	}
	return v
}

// reattachAfter is reattach for a history answer whose messages are msgs:
// activeRun.userText is left out when it is msgs' last user message.
func (s *Server) reattachAfter(st gateway.TurnStatus, budget int, msgs []gateway.Message) (*reattachInfo, int) {
	info, used := s.reattach(st, budget)
	if info == nil || info.ActiveRun == nil || info.ActiveRun.UserText == "" {
		return info, used
	}
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role != "user" {
			continue
		}
		if msgs[i].Text == s.userTextOf(info.ActiveRun.RunID) {
			used -= jsonLen(info.ActiveRun.UserText)
			info.ActiveRun.UserText = ""
		}
		break
	}
	return info, used
}

// userTextOf is the user's message the live run runID answers, as its
// TurnStarted event carried it ("" before that event or after its end).
func (s *Server) userTextOf(runID string) string {
	v, ok := s.runs.Load(runID)
	if !ok {
		return ""
	}
	rs := v.(*runState)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.userText
}

// startText is text as a turn's lifecycle start carries it: cut, like
// activeRun.userText, to an eighth of server.maxAnswerBytes.
func (s *Server) startText(text string) string {
	if b := s.answerBudget() / queueShare / 2; jsonLen(text) > b {
		return cutText(text, b)
	}
	return text
}

func stepOf(runID string, st event.Step) *stepView {
	v := &stepView{Name: st.Label(), Kind: st.Kind, StartedAt: ms(st.StartedAt)}
	if isTool(st) {
		v.ToolCallID = toolCallID(runID, st)
	}
	return v
}

// toolCallID is the id of a step's tool events: `<runId>:<step number>`.
func toolCallID(runID string, st event.Step) string {
	return runID + ":" + strconv.FormatUint(uint64(st.Seq), 10)
}
