package acp

import (
	"container/list"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
)

// Step kinds (the engine's event.StepLLM and event.StepTool).
const (
	stepLLM  = "llm"
	stepTool = "tool"
)

// turnState is one running turn as the agent's notifications see it: it
// maps session/update to the turn's Callbacks and keeps the reply text.
// Its methods are called from the agent's reader goroutine and the turn's
// own; mu guards it.
//
// Steps: the turn starts in an "llm" step named after the agent (so a
// silent agent is covered by the step timeout). A tool_call completes it
// and starts a "tool" step named by the call's title (else its kind),
// renamed when a tool_call_update brings a new title (see retitle); when
// the last open tool call completes (tool_call_update with status completed
// or failed), a new "llm" step starts. With several tool calls open at once
// the engine sees the newest as the current step; the completion of an
// older one only closes it here. When the turn ends the open step is
// completed. Each update costs O(1) whatever the number of open calls; at
// most maxOpenTools are open at once, and a tool_call past that is ignored
// (counted in ignoredTools) until one completes.
type turnState struct {
	runID string
	cb    runner.Callbacks
	perms chan permissionAsk

	// ctx is done when the turn ends (or its agent dies): the agent's fs
	// requests of the turn's session stop then. Nil when not set.
	ctx    context.Context
	cancel context.CancelFunc

	mu           sync.Mutex
	text         strings.Builder
	dropped      int                      // reply bytes over maxText, not kept
	llm          bool                     // an llm step is open
	open         *list.List               // names of the tool calls with an open step, oldest first
	calls        map[string]*list.Element // open tool calls by id, their elements of open
	agentName    string                   // the agent's name
	planStep     string                   // the agent's plan entry in progress, as the person reads it; "" for none
	ignoredTools int                      // tool_calls not followed (over maxOpenTools)
	ended        bool
}

// maxOpenTools bounds the tool calls a turn follows at once.
const maxOpenTools = 1000

// openCall is an element of turnState.open.
type openCall struct{ name string }

func newTurnState(runID string, cb runner.Callbacks) *turnState {
	return &turnState{runID: runID, cb: cb, perms: make(chan permissionAsk, 8), open: list.New(), calls: map[string]*list.Element{}}
}

// session/update payloads, as far as turnguard reads them.
type update struct {
	SessionUpdate string          `json:"sessionUpdate"`
	Content       json.RawMessage `json:"content"` // a content block in chunks, a list in tool calls
	ToolCallID    string          `json:"toolCallId"`
	Title         *string         `json:"title"`
	Kind          *string         `json:"kind"`
	Status        *string         `json:"status"`
	Entries       []planEntry     `json:"entries"` // a plan's
}

// planEntry is one entry of a plan update.
type planEntry struct {
	Content string `json:"content"`
	Status  string `json:"status"`
}

// begin opens the turn's first llm step.
func (t *turnState) begin(agentName string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.llm = true
	t.agentName = agentName
	t.cb.StepStarted(stepLLM, t.llmName())
}

// llmName is the name of the turn's llm step: the plan entry in progress
// when the agent has a plan, else the agent's name (mu held).
func (t *turnState) llmName() string {
	if t.planStep != "" {
		return t.planStep
	}
	return t.agentName
}

// update maps one session/update to the callbacks (see turnState).
// Thoughts (agent_thought_chunk) and plans are not reply text and are not
// steps (a plan names the llm steps: see plan): they are activity (runner.ActivityReporter, when the callbacks
// take it), which resets the liveness window only under livenessResetOn:
// activity. Other updates call nothing.
func (t *turnState) update(raw json.RawMessage) {
	var u update
	if json.Unmarshal(raw, &u) != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	switch u.SessionUpdate {
	case "agent_message_chunk":
		var c struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(u.Content, &c) != nil || c.Type != "text" || c.Text == "" {
			return
		}
		s := c.Text
		if room := maxText - t.text.Len(); len(s) > room {
			t.dropped += len(s) - max(room, 0)
			s = cut(s, max(room, 0))
			s = strings.TrimSuffix(s, "…")
		}
		if s != "" {
			t.text.WriteString(s)
			t.cb.Delta(s)
		}
	case "tool_call":
		if u.ToolCallID == "" || t.calls[u.ToolCallID] != nil {
			return
		}
		if !t.startTool(u.ToolCallID, toolName(u.Title, u.Kind)) {
			return
		}
		if u.Status != nil && finished(*u.Status) {
			t.complete(u.ToolCallID)
		}
	case "tool_call_update":
		t.retitle(u.ToolCallID, u.Title)
		if u.Status != nil && finished(*u.Status) {
			t.complete(u.ToolCallID)
		}
	case "plan":
		t.plan(u.Entries)
		if a, ok := t.cb.(runner.ActivityReporter); ok {
			a.Activity()
		}
	case "agent_thought_chunk":
		if a, ok := t.cb.(runner.ActivityReporter); ok {
			a.Activity()
		}
	}
}

// plan takes the agent's plan (the whole list, each update replaces it):
// its entry in progress, counted among all entries
// (messages.AgentPlanStep: "📋 2/5: Run tests"), names the turn's llm
// steps from now on — the step the "⏳ Still working" notice, the web chat
// and the trace name. When the llm step is the current one it is restarted
// under the new name, which supersedes it without completing it (see
// retitle); while a tool runs, the tool keeps naming the step. A plan with
// no entry in progress names the steps after the agent again (mu held).
func (t *turnState) plan(entries []planEntry) {
	step := ""
	for i, e := range entries {
		if e.Status == "in_progress" {
			step = messages.AgentPlanStep(i+1, len(entries), cut(oneLine(e.Content), 200))
			break
		}
	}
	if step == t.planStep {
		return
	}
	t.planStep = step
	if t.llm {
		t.cb.StepStarted(stepLLM, t.llmName())
	}
}

// retitle renames the step of open call id when title names it anew (an
// agent may open a call as "bash" and name the real command later): the
// engine's current step — the newest call's — is restarted under the new
// name, which supersedes it without completing it, so the rename is no
// progress for the liveness window (mu held).
func (t *turnState) retitle(id string, title *string) {
	e := t.calls[id]
	if e == nil || title == nil || strings.TrimSpace(*title) == "" {
		return
	}
	name := toolName(title, nil)
	if name == e.Value.(openCall).name {
		return
	}
	e.Value = openCall{name: name}
	if e == t.open.Back() {
		t.cb.StepStarted(stepTool, name)
	}
}

// startTool opens the tool step of call id, named name; false when the turn
// follows maxOpenTools calls already (the call is counted in ignoredTools)
// (mu held).
func (t *turnState) startTool(id, name string) bool {
	if len(t.calls) >= maxOpenTools {
		t.ignoredTools++
		return false
	}
	if t.llm {
		t.llm = false
		t.cb.StepCompleted(stepLLM, t.llmName())
	}
	t.calls[id] = t.open.PushBack(openCall{name: name})
	t.cb.StepStarted(stepTool, name)
	return true
}

// complete ends the tool step of call id (mu held).
func (t *turnState) complete(id string) {
	e := t.calls[id]
	if e == nil {
		return
	}
	newest := e == t.open.Back()
	t.open.Remove(e)
	delete(t.calls, id)
	if !newest {
		return // superseded in the engine by a newer call: nothing to report
	}
	t.cb.StepCompleted(stepTool, e.Value.(openCall).name)
	if b := t.open.Back(); b != nil {
		t.cb.StepStarted(stepTool, b.Value.(openCall).name)
		return
	}
	t.llm = true
	t.cb.StepStarted(stepLLM, t.llmName())
}

// end completes the open step and stops all further callbacks; it returns
// the reply text.
func (t *turnState) end() (string, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.ended {
		t.ended = true
		if t.cancel != nil {
			t.cancel()
		}
		switch {
		case t.llm:
			t.cb.StepCompleted(stepLLM, t.llmName())
		case t.open.Len() > 0:
			t.cb.StepCompleted(stepTool, t.open.Back().Value.(openCall).name)
		}
	}
	return t.text.String(), t.dropped
}

// ignored counts the tool calls not followed (over maxOpenTools).
func (t *turnState) ignored() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ignoredTools
}

func finished(status string) bool { return status == "completed" || status == "failed" }

// toolName names a tool step: the call's title, else its kind.
func toolName(title, kind *string) string {
	if title != nil && strings.TrimSpace(*title) != "" {
		return cut(oneLine(*title), 200)
	}
	if kind != nil && *kind != "" {
		return cut(*kind, 50)
	}
	return "tool"
}

// permissionRequest is session/request_permission's params.
type permissionRequest struct {
	SessionID string `json:"sessionId"`
	ToolCall  struct {
		ToolCallID string          `json:"toolCallId"`
		Title      *string         `json:"title"`
		Kind       *string         `json:"kind"`
		RawInput   json.RawMessage `json:"rawInput"`
	} `json:"toolCall"`
	Options []struct {
		OptionID string `json:"optionId"`
		Name     string `json:"name"`
		Kind     string `json:"kind"`
	} `json:"options"`
}

// Bounds of a permission request's options (as in runner/exec): a request
// past them is answered with a JSON-RPC error and nobody is asked.
const (
	maxOptions  = 10  // options of one request
	maxOptionID = 128 // bytes of an option id (it is echoed, so never cut)
	maxLabel    = 100 // bytes of an option's name shown; longer is cut
)

// checkOptions reports why req's options cannot be asked: too many, or an
// id that is empty, too long or not unique (an answer could not say which
// option the person chose).
func checkOptions(req permissionRequest) error {
	if len(req.Options) > maxOptions {
		return fmt.Errorf("%d options, at most %d", len(req.Options), maxOptions)
	}
	seen := make(map[string]bool, len(req.Options))
	for i, o := range req.Options {
		switch {
		case o.OptionID == "":
			return fmt.Errorf("options[%d].optionId is required", i)
		case len(o.OptionID) > maxOptionID:
			return fmt.Errorf("options[%d].optionId is longer than %d bytes", i, maxOptionID)
		case seen[o.OptionID]:
			return fmt.Errorf("options[%d].optionId %q is not unique", i, o.OptionID)
		}
		seen[o.OptionID] = true
	}
	return nil
}

// permissionAsk is a permission request handed to the turn that must answer
// it; done releases its in-flight slot.
type permissionAsk struct {
	id     json.RawMessage
	req    permissionRequest
	elicit *elicitRequest // set for an elicitation/create instead of a permission
	done   func()
}

// cancelled is the answer to the agent when nobody could be asked.
func (a permissionAsk) cancelled() any {
	if a.elicit != nil {
		return elicitCancelled()
	}
	return permissionCancelled()
}

// askPermission hands a request to the turn; false when the turn cannot
// take it (ended, or too many open), and the caller answers cancelled.
func (t *turnState) askPermission(a permissionAsk) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return false
	}
	select {
	case t.perms <- a:
		return true
	default:
		return false
	}
}

// question turns a permission request into the person's question: the
// tool call's title (else kind), its raw input when short, and the agent's
// options (an unknown option kind counts as a reject).
func question(req permissionRequest) runner.Question {
	q := runner.Question{Title: toolName(req.ToolCall.Title, req.ToolCall.Kind)}
	if q.Title == "tool" {
		q.Title = "Run a tool"
	}
	q.Tool = q.Title
	if req.ToolCall.Kind != nil && *req.ToolCall.Kind != "" {
		q.Tool = *req.ToolCall.Kind
	}
	if in := strings.TrimSpace(string(req.ToolCall.RawInput)); in != "" && in != "null" && in != "{}" && len(in) <= 500 {
		q.Detail = in
	}
	for _, o := range req.Options {
		k := runner.OptionKind(o.Kind)
		switch k {
		case runner.AllowOnce, runner.AllowAlways, runner.RejectOnce, runner.RejectAlways:
		default:
			k = runner.RejectOnce
		}
		label := o.Name
		if label == "" {
			label = o.OptionID
		}
		q.Options = append(q.Options, runner.Option{ID: o.OptionID, Label: cut(label, maxLabel), Kind: k})
	}
	return q
}

type permissionOutcome struct {
	Outcome  string `json:"outcome"`
	OptionID string `json:"optionId,omitempty"`
}

type permissionResponse struct {
	Outcome permissionOutcome `json:"outcome"`
}

func permissionCancelled() permissionResponse {
	return permissionResponse{Outcome: permissionOutcome{Outcome: "cancelled"}}
}

// permissionAnswer is the reply to the agent for the person's answer: the
// chosen option (a timeout chooses the reject option it carries), or
// cancelled when there is none or the turn was stopped (err).
func permissionAnswer(a runner.Answer, err error) permissionResponse {
	if err != nil || a.OptionID == "" {
		return permissionCancelled()
	}
	return permissionResponse{Outcome: permissionOutcome{Outcome: "selected", OptionID: a.OptionID}}
}
