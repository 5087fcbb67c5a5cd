package acp

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"

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
// completed.
type turnState struct {
	runID string
	cb    runner.Callbacks
	perms chan permissionAsk

	mu      sync.Mutex
	text    strings.Builder
	dropped int      // reply bytes over maxText, not kept
	llm     bool     // an llm step is open
	open    []string // tool call ids with an open step, oldest first
	names   map[string]string
	ended   bool
}

func newTurnState(runID string, cb runner.Callbacks) *turnState {
	return &turnState{runID: runID, cb: cb, perms: make(chan permissionAsk, 8), names: map[string]string{}}
}

// session/update payloads, as far as turnguard reads them.
type update struct {
	SessionUpdate string          `json:"sessionUpdate"`
	Content       json.RawMessage `json:"content"` // a content block in chunks, a list in tool calls
	ToolCallID    string          `json:"toolCallId"`
	Title         *string         `json:"title"`
	Kind          *string         `json:"kind"`
	Status        *string         `json:"status"`
}

// begin opens the turn's first llm step.
func (t *turnState) begin(agentName string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.llm = true
	t.cb.StepStarted(stepLLM, agentName)
	t.names[""] = agentName
}

// update maps one session/update to the callbacks (see turnState).
// Thoughts (agent_thought_chunk) and plans are not reply text and are not
// steps: they are activity (runner.ActivityReporter, when the callbacks
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
		if u.ToolCallID == "" || slices.Contains(t.open, u.ToolCallID) {
			return
		}
		name := toolName(u.Title, u.Kind)
		if t.llm {
			t.llm = false
			t.cb.StepCompleted(stepLLM, t.names[""])
		}
		t.names[u.ToolCallID] = name
		t.open = append(t.open, u.ToolCallID)
		t.cb.StepStarted(stepTool, name)
		if u.Status != nil && finished(*u.Status) {
			t.complete(u.ToolCallID)
		}
	case "tool_call_update":
		t.retitle(u.ToolCallID, u.Title)
		if u.Status != nil && finished(*u.Status) {
			t.complete(u.ToolCallID)
		}
	case "agent_thought_chunk", "plan":
		if a, ok := t.cb.(runner.ActivityReporter); ok {
			a.Activity()
		}
	}
}

// retitle renames the step of open call id when title names it anew (an
// agent may open a call as "bash" and name the real command later): the
// engine's current step — the newest call's — is restarted under the new
// name, which supersedes it without completing it, so the rename is no
// progress for the liveness window (mu held).
func (t *turnState) retitle(id string, title *string) {
	i := slices.Index(t.open, id)
	if i < 0 || title == nil || strings.TrimSpace(*title) == "" {
		return
	}
	name := toolName(title, nil)
	if name == t.names[id] {
		return
	}
	t.names[id] = name
	if i == len(t.open)-1 {
		t.cb.StepStarted(stepTool, name)
	}
}

// complete ends the tool step of call id (mu held).
func (t *turnState) complete(id string) {
	i := slices.Index(t.open, id)
	if i < 0 {
		return
	}
	newest := i == len(t.open)-1
	t.open = slices.Delete(t.open, i, i+1)
	name := t.names[id]
	delete(t.names, id)
	if !newest {
		return // superseded in the engine by a newer call: nothing to report
	}
	t.cb.StepCompleted(stepTool, name)
	if n := len(t.open); n > 0 {
		t.cb.StepStarted(stepTool, t.names[t.open[n-1]])
		return
	}
	t.llm = true
	t.cb.StepStarted(stepLLM, t.names[""])
}

// end completes the open step and stops all further callbacks; it returns
// the reply text.
func (t *turnState) end() (string, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.ended {
		t.ended = true
		switch {
		case t.llm:
			t.cb.StepCompleted(stepLLM, t.names[""])
		case len(t.open) > 0:
			t.cb.StepCompleted(stepTool, t.names[t.open[len(t.open)-1]])
		}
	}
	return t.text.String(), t.dropped
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

// permissionAsk is a permission request handed to the turn that must answer
// it; done releases its in-flight slot.
type permissionAsk struct {
	id   json.RawMessage
	req  permissionRequest
	done func()
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
		q.Options = append(q.Options, runner.Option{ID: o.OptionID, Label: cut(label, 100), Kind: k})
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
