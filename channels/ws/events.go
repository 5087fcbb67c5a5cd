package ws

import (
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/messages"
)

// chatEvent is the payload of a `chat` event.
type chatEvent struct {
	RunID        string          `json:"runId"`
	SessionKey   string          `json:"sessionKey"`
	Seq          uint64          `json:"seq"`
	AgentID      string          `json:"agentId,omitempty"`
	State        string          `json:"state"` // delta | final | aborted | error
	DeltaText    string          `json:"deltaText,omitempty"`
	Message      *historyMessage `json:"message,omitempty"`
	StopReason   string          `json:"stopReason,omitempty"`
	ErrorMessage string          `json:"errorMessage,omitempty"`
	ErrorKind    string          `json:"errorKind,omitempty"`
	EndedAt      int64           `json:"endedAt,omitempty"` // unix ms of the run's end (terminal states)
}

// agentEvent is the payload of an `agent` event.
type agentEvent struct {
	RunID      string `json:"runId"`
	Seq        uint64 `json:"seq"`
	Stream     string `json:"stream"` // lifecycle | tool | item
	Ts         int64  `json:"ts"`
	SessionKey string `json:"sessionKey"`
	AgentID    string `json:"agentId,omitempty"`
	Data       any    `json:"data"`
}

type lifecycleData struct {
	Phase      string `json:"phase"` // start | running | warning | end | error
	StartedAt  int64  `json:"startedAt,omitempty"`
	EndedAt    int64  `json:"endedAt,omitempty"`
	StopReason string `json:"stopReason,omitempty"`
	Aborted    bool   `json:"aborted,omitempty"`
	Error      string `json:"error,omitempty"`
	ToolCallID string `json:"toolCallId,omitempty"` // running: the step that is running
	Name       string `json:"name,omitempty"`
	ElapsedMs  int64  `json:"elapsedMs,omitempty"`
	// UserText (start only; turnguard's extension): the user's message the
	// turn answers, so a client watching the session that did not send it
	// (another tab, a page on another replica) can draw it; cut to an
	// eighth of server.maxAnswerBytes, as in chat.history's activeRun.
	UserText string `json:"userText,omitempty"`
	// Message (warning only; turnguard's extension): the budget warning in
	// words, "⏳ Your request will be stopped in 1 min unless it finishes.";
	// DeadlineAt is when (unix ms).
	Message    string `json:"message,omitempty"`
	DeadlineAt int64  `json:"deadlineAt,omitempty"`
}

type toolData struct {
	Phase      string      `json:"phase"` // start | update | result
	ToolCallID string      `json:"toolCallId"`
	Name       string      `json:"name"`
	Args       *struct{}   `json:"args,omitempty"`
	Result     *toolResult `json:"result,omitempty"`
	IsError    bool        `json:"isError,omitempty"`
	Meta       *toolMeta   `json:"meta,omitempty"`
}

type toolResult struct {
	Content []contentBlock `json:"content"`
}

type toolMeta struct {
	DurationMs int64 `json:"durationMs"`
}

type itemData struct {
	ItemID       string `json:"itemId"`
	ToolCallID   string `json:"toolCallId"`
	Phase        string `json:"phase"` // update | end
	Kind         string `json:"kind"`
	Title        string `json:"title"`
	Status       string `json:"status"` // running | blocked | completed | failed
	Name         string `json:"name"`
	ProgressText string `json:"progressText,omitempty"`
}

// runState is the protocol's view of one live turn: its payload seq, the
// open tool block and progress notice, and the keepalive timer. Its mutex
// orders the run's frames, whether they come from the bus or the timer.
type runState struct {
	// Hot: what every event of the run reads or writes, kept together (with
	// many live runs each cache line of the state an event touches is a miss).
	mu         sync.Mutex
	s          *Server
	done       bool
	watched    bool       // the current event has watchers: encode frames
	keyWatched bool       // the watcher check's cache (see hasWatchers): a connection watches key by name,
	watchGen   uint64     // as of the server's watchGen
	frames     []outFrame // scratch
	sent       int        // streaming (see onDelta): how much of full the last delta carried
	full       string     // the reply so far
	last       time.Time  // when watchers last got a frame that resets the TUI's 30 s watchdog
	tool       event.Step // the open tool block (zero: none)

	id    string
	key   string
	agent string

	started  time.Time // the TurnStarted event's time
	userText string    // the TurnStarted event's text: the user's message the turn answers (under mu)

	seq    uint64
	notice event.Step                 // the step whose progress notice is shown (zero: none)
	asks   map[string]*event.Approval // the run's open questions, by id
	timer  *time.Timer

	// Streaming (see onDelta): when the newest text came, when the last
	// delta was sent, and the timer that sends the rest.
	fullAt    time.Time
	lastDelta time.Time
	deltaT    *time.Timer
}

func (s *Server) newRun(ev event.Event, timer bool) *runState {
	rs := &runState{s: s, id: ev.RunID, key: ev.SessionKey, agent: agentOf(ev.SessionKey), last: time.Now(), started: ev.Time}
	if timer {
		rs.timer = time.AfterFunc(s.opts.Keepalive, rs.keepalive)
	}
	return rs
}

func (rs *runState) stop() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.done = true
	if rs.timer != nil {
		rs.timer.Stop()
	}
	if rs.deltaT != nil {
		rs.deltaT.Stop()
	}
}

// runSlot is where a run's state is kept in the run's event.Locals, so an
// event reaches it without a lookup by run id.
var runSlot = event.NewLocal[runState]()

// onEvent is the bus handler: it turns one engine event into protocol
// frames, encoded once, and hands them to every connection watching the
// session. It runs on the publisher's goroutine (in the run's order) and
// never blocks.
func (s *Server) onEvent(ev event.Event) {
	if ev.Kind == event.ForceFinalized || ev.RunID == "" {
		return // the run already ended for its users; or not a run's event (a session reset)
	}
	rs := s.runFor(ev)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.done {
		return
	}
	rs.watched = rs.hasWatchers()
	rs.frames = rs.frames[:0]
	rs.apply(ev)
	if len(rs.frames) > 0 {
		s.fanout(rs.key, rs.frames)
		clear(rs.frames)
	}
	if ev.Kind.Terminal() {
		rs.done = true
		if rs.timer != nil {
			rs.timer.Stop()
		}
		if rs.deltaT != nil {
			rs.deltaT.Stop()
		}
		s.endAgentWaiters(rs.outcome(ev))
	}
}

// runFor returns the state of ev's run, creating it at the run's first
// event. No server-wide lock and, for the gateway's events, no lookup: the
// state is kept in the run's event.Locals (one run's events come in its
// order, on its publisher), and in s.runs only so that Shutdown can stop its
// timers — stored at the run's first event, deleted at its terminal one. The
// state of an ended run stays in the slot, done, so a late event of the run
// is ignored. Events without Locals (published by hand, as tests do) and a
// second server on the same bus use s.runs by run id.
func (s *Server) runFor(ev event.Event) *runState {
	terminal := ev.Kind.Terminal()
	if rs := runSlot.Get(ev); rs != nil && rs.s == s {
		if terminal {
			s.runs.Delete(ev.RunID)
		}
		return rs
	}
	if terminal {
		if v, ok := s.runs.LoadAndDelete(ev.RunID); ok {
			return v.(*runState)
		}
		return s.newRun(ev, false) // a run that started before the server
	}
	if v, ok := s.runs.Load(ev.RunID); ok {
		return v.(*runState)
	}
	rs := s.newRun(ev, true)
	s.runs.Store(ev.RunID, rs)
	if runSlot.Get(ev) == nil {
		runSlot.Set(ev, rs)
	}
	return rs
}

// hasWatchers reports whether any connection would receive the run's
// events. It takes no lock and, unless watchers changed since the run last
// asked, hashes nothing: called with rs.mu held, for every event.
func (rs *runState) hasWatchers() bool {
	s := rs.s
	if s.watchAllN.Load() > 0 {
		return true
	}
	if s.watchedN.Load() == 0 {
		return false
	}
	if g := s.watchGen.Load(); g != rs.watchGen {
		_, rs.keyWatched = s.watchedKeys.Load(rs.key)
		rs.watchGen = g
	}
	return rs.keyWatched
}

// outcome is the engine's Outcome of a terminal event.
func (rs *runState) outcome(ev event.Event) gateway.Outcome {
	out := gateway.Outcome{RunID: rs.id, SessionKey: rs.key, StopReason: ev.StopReason, Text: ev.FullText,
		Message: ev.Message, StartedAt: rs.started, EndedAt: ev.Time}
	switch {
	case ev.Kind == event.Aborted:
		out.Status = gateway.StatusAborted
	case ev.StopReason == event.ReasonError:
		out.Status = gateway.StatusError
	default:
		out.Status = gateway.StatusOK
	}
	return out
}

func (rs *runState) toolCallID(st event.Step) string {
	return toolCallID(rs.id, st)
}

func isTool(st event.Step) bool { return !st.IsZero() && st.Kind != event.StepLLM }

// apply updates the run's state for ev and appends its frames.
func (rs *runState) apply(ev event.Event) {
	t := ev.Time
	if ev.Kind != event.Delta && rs.sent < len(rs.full) {
		// Streamed text not sent yet goes out before anything else of the
		// run (a tool line, the final), so the order is the runner's.
		rs.emitDelta()
	}
	switch ev.Kind {
	case event.TurnStarted:
		rs.userText = ev.Text
		d := lifecycleData{Phase: "start", StartedAt: ms(t)}
		if rs.watched {
			d.UserText = rs.s.startText(ev.Text)
		}
		rs.lifecycle(t, d)

	case event.StepStarted:
		if !rs.tool.IsZero() {
			rs.toolResult(t, rs.tool, false) // superseded
		}
		if isTool(ev.Step) {
			rs.tool = ev.Step
			if rs.quiet(t, true) {
				break
			}
			rs.agentEvent(t, "tool", true, true, toolData{Phase: "start", ToolCallID: rs.toolCallID(ev.Step), Name: ev.Step.Label()})
		}

	case event.StepCompleted:
		switch {
		case !rs.tool.IsZero() && rs.tool.Seq == ev.Step.Seq:
			rs.toolResult(t, rs.tool, false)
		case isTool(ev.Step) && rs.quiet(t, true):
		case isTool(ev.Step): // a completion without a start: show it as a finished tool
			rs.agentEvent(t, "tool", true, true, toolData{Phase: "start", ToolCallID: rs.toolCallID(ev.Step), Name: ev.Step.Label()})
			rs.toolResult(t, ev.Step, false)
		}

	case event.Delta:
		rs.onDelta(ev)

	case event.Paused:
		if !rs.tool.IsZero() {
			rs.item(t, rs.tool, "update", "⏸️ "+rs.tool.Label()+" — "+ev.Text, "blocked", "")
		}

	case event.Resumed:
		if !rs.tool.IsZero() {
			rs.item(t, rs.tool, "update", rs.tool.Label(), "running", "")
		}

	case event.Progress:
		// The notice goes on the step's own tool line. An LLM call has no
		// tool line (its progress is the streamed text): an item would open a
		// block in the middle of the reply, so it gets only the lifecycle
		// "running" below, which keeps the TUI's own watchdog quiet.
		if ev.Step.Kind != event.StepLLM {
			rs.notice = ev.Step
			rs.item(t, ev.Step, "update", ev.Message, "running", ev.Message)
		}
		lc := lifecycleData{Phase: "running", Name: ev.Step.Label(), ElapsedMs: ev.Elapsed.Milliseconds()}
		if !ev.Step.IsZero() {
			lc.ToolCallID = rs.toolCallID(ev.Step)
		}
		rs.lifecycle(t, lc)

	case event.BudgetWarning:
		rs.lifecycle(t, lifecycleData{Phase: "warning", Message: ev.Message, DeadlineAt: ms(ev.Deadline),
			ElapsedMs: ev.Elapsed.Milliseconds()})

	case event.Recovered:
		if !rs.notice.IsZero() {
			rs.item(t, rs.notice, "end", rs.notice.Label(), "completed", "")
			rs.notice = event.Step{}
		}

	case event.ApprovalRequested, event.ApprovalResolved:
		rs.onApproval(ev)

	case event.Aborted:
		rs.closeApprovals(t)
		rs.closeSteps(t, true)
		p := &chatEvent{RunID: rs.id, SessionKey: rs.key, AgentID: rs.agent, State: "aborted",
			StopReason: string(ev.StopReason), ErrorMessage: ev.Message, EndedAt: ms(t)}
		if ev.FullText != "" {
			p.Message = textMessage("assistant", ev.FullText, t, ev.StopReason)
		}
		rs.chat(p)
		rs.lifecycle(t, lifecycleData{Phase: "end", EndedAt: ms(t), StopReason: string(ev.StopReason), Aborted: true})

	case event.Finished:
		rs.closeApprovals(t)
		if ev.StopReason == event.ReasonError {
			rs.closeSteps(t, true)
			rs.chat(&chatEvent{RunID: rs.id, SessionKey: rs.key, AgentID: rs.agent, State: "error",
				ErrorMessage: ev.Message, ErrorKind: "unknown", StopReason: string(ev.StopReason), EndedAt: ms(t)})
			rs.lifecycle(t, lifecycleData{Phase: "error", Error: ev.Message, EndedAt: ms(t)})
			return
		}
		rs.closeSteps(t, false)
		rs.chat(&chatEvent{RunID: rs.id, SessionKey: rs.key, AgentID: rs.agent, State: "final",
			StopReason: string(event.ReasonStop), Message: textMessage("assistant", ev.FullText, t, ""), EndedAt: ms(t)})
		rs.lifecycle(t, lifecycleData{Phase: "end", EndedAt: ms(t), StopReason: string(event.ReasonStop)})
	}
}

// closeSteps ends the open tool block and progress notice at the end of
// the run.
func (rs *runState) closeSteps(t time.Time, failed bool) {
	if !rs.tool.IsZero() {
		rs.toolResult(t, rs.tool, failed)
	}
	if !rs.notice.IsZero() {
		status := "completed"
		if failed {
			status = "failed"
		}
		rs.item(t, rs.notice, "end", rs.notice.Label(), status, "")
		rs.notice = event.Step{}
	}
}

func (rs *runState) toolResult(t time.Time, st event.Step, failed bool) {
	if rs.quiet(t, true) {
		if rs.tool.Seq == st.Seq {
			rs.tool = event.Step{}
		}
		return
	}
	d := toolData{Phase: "result", ToolCallID: rs.toolCallID(st), Name: st.Label(),
		Result: &toolResult{Content: []contentBlock{}}, IsError: failed}
	if !st.StartedAt.IsZero() {
		d.Meta = &toolMeta{DurationMs: t.Sub(st.StartedAt).Milliseconds()}
	}
	rs.agentEvent(t, "tool", true, true, d)
	if rs.tool.Seq == st.Seq {
		rs.tool = event.Step{}
	}
}

func (rs *runState) item(t time.Time, st event.Step, phase, title, status, progress string) {
	if rs.quiet(t, false) {
		return
	}
	id := rs.toolCallID(st)
	rs.agentEvent(t, "item", true, false, itemData{ItemID: id + ":status", ToolCallID: id, Phase: phase, Kind: "tool",
		Title: title, Status: status, Name: st.Label(), ProgressText: progress})
}

func (rs *runState) lifecycle(t time.Time, d lifecycleData) {
	rs.agentEvent(t, "lifecycle", false, true, d)
}

// quiet reports that the current event (of time t) has no watchers, so no
// frame is built; it still records, when resets, that the run made progress
// at t (what agentEvent would have recorded). An unwatched event reads no
// clock: t is the event's.
func (rs *runState) quiet(t time.Time, resets bool) bool {
	if rs.watched {
		return false
	}
	if resets {
		rs.last = t
	}
	return true
}

// agentEvent appends an agent event. toolOnly frames go only to clients with
// the tool-events cap; resets says the frame resets the TUI's watchdog.
func (rs *runState) agentEvent(t time.Time, stream string, toolOnly, resets bool, data any) {
	if rs.quiet(t, resets) {
		return
	}
	if resets {
		rs.last = time.Now()
	}
	rs.seq++
	p := agentEvent{RunID: rs.id, Seq: rs.seq, Stream: stream, Ts: ms(t), SessionKey: rs.key, AgentID: rs.agent, Data: data}
	rs.frames = append(rs.frames, outFrame{data: encodeAgent(&p), seq: true, toolOnly: toolOnly, runID: rs.id})
}

// chat appends a terminal chat event.
func (rs *runState) chat(p *chatEvent) {
	if !rs.watched {
		return
	}
	rs.seq++
	p.Seq = rs.seq
	rs.frames = append(rs.frames, outFrame{data: encodeChat(p), seq: true, runID: rs.id, terminal: true})
}

// keepalive runs on the run's timer: after Keepalive of silence towards the
// watchers it sends a lifecycle "running" event (naming the running tool, if
// any), so the TUI's own "taking longer than expected" line never appears
// while a step is legitimately long.
func (rs *runState) keepalive() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.done {
		return
	}
	every := rs.s.opts.Keepalive
	// rs.last may be an event's own time (see quiet): one from the future
	// (a clock step) counts as long ago, so a frame goes now.
	if since := time.Since(rs.last); since >= 0 && since < every {
		rs.timer.Reset(every - since)
		return
	}
	now := time.Now()
	rs.watched = rs.hasWatchers()
	rs.frames = rs.frames[:0]
	lc := lifecycleData{Phase: "running"}
	if !rs.tool.IsZero() {
		lc.ToolCallID, lc.Name = rs.toolCallID(rs.tool), rs.tool.Label()
		lc.ElapsedMs = now.Sub(rs.tool.StartedAt).Milliseconds()
	}
	rs.lifecycle(now, lc)
	if len(rs.frames) > 0 {
		rs.s.fanout(rs.key, rs.frames)
		clear(rs.frames)
	}
	rs.timer.Reset(every)
}

// onGap is told (cluster mode) that events of sessionKey's turns, run by
// another replica, were lost on their way here. Every connection watching
// the session — by name or all sessions — is closed with 1012 (service
// restart): the client reconnects and reloads the history, so what it
// shows is never silently missing a step or the ending. The session's run
// states are dropped with their timers.
func (s *Server) onGap(sessionKey string) {
	s.runs.Range(func(k, v any) bool {
		if rs := v.(*runState); rs.key == sessionKey {
			rs.stop()
			s.runs.Delete(k)
		}
		return true
	})
	s.watchMu.RLock()
	var victims []*conn
	for c := range s.watchers[sessionKey] {
		victims = append(victims, c)
	}
	for c := range s.watchAll {
		victims = append(victims, c)
	}
	s.watchMu.RUnlock()
	if len(victims) > 0 {
		s.log.Warn("events of a session run by another replica were lost; its watchers reconnect and reload",
			"session", sessionKey, "connections", len(victims))
	}
	for _, c := range victims {
		c.closeWith(websocket.CloseServiceRestart, "events were lost; reload the history", true)
	}
}

// queuePayload is the payload of a "queue" event (turnguard's extension):
// a message queued behind a session's running turn left the queue without
// running. State is "cancelled"; Text says so in words
// (messages.QueueCancelled).
type queuePayload struct {
	SessionKey string `json:"sessionKey"`
	RunID      string `json:"runId"` // the message's own run id (its idempotencyKey)
	State      string `json:"state"`
	Text       string `json:"text"`
}

// onQueueCancel is the engine's OnQueueCancel function: every connection
// watching the session — the web chat's other tabs, the canceller too —
// learns at once that the queued message qc will not run. It never blocks.
func (s *Server) onQueueCancel(qc gateway.QueueCancel) {
	p := queuePayload{SessionKey: qc.SessionKey, RunID: qc.RunID, State: "cancelled", Text: messages.QueueCancelled(qc.Text)}
	s.fanout(qc.SessionKey, []outFrame{{data: eventHead("queue", mustJSON(p)), seq: true}})
}
