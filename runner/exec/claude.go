package exec

import (
	"encoding/json"
	"strings"

	"github.com/turnguard/turnguard/event"
)

// The claude-stream-json format: the lines the Claude Code CLI writes with
// `claude -p --output-format stream-json --verbose`, mapped to callbacks:
//
//   - assistant message, tool_use block → StepStarted("tool", name)
//   - user message, tool_result block → StepCompleted("tool", name of the
//     tool_use with that id)
//   - assistant message, text block → Delta (each message after the first
//     separated by a blank line)
//   - stream_event content_block_delta/text_delta (with
//     --include-partial-messages) → Delta; the full text blocks that follow
//     are then not streamed again
//   - lines of a sub-agent (parent_tool_use_id set) → Heartbeat only: the
//     sub-agent's work is progress of the Task step that runs it
//   - result → the final answer (its "result" text); with is_error or an
//     error_* subtype, the turn fails with that text for the user
//   - system and any other type → ignored (logged at debug level)
//
// Only a line that is not a JSON object is malformed.

type claudeState struct {
	tools    map[string]string // open tool_use id → name
	partials bool              // text arrives as stream_event deltas
}

type claudeLine struct {
	Type            string         `json:"type"`
	Subtype         string         `json:"subtype"`
	Message         *claudeMessage `json:"message"`
	ParentToolUseID *string        `json:"parent_tool_use_id"`
	Event           *struct {
		Type  string `json:"type"`
		Delta *struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"delta"`
	} `json:"event"`
	Result  *string `json:"result"`
	IsError bool    `json:"is_error"`
}

type claudeMessage struct {
	Content json.RawMessage `json:"content"` // a string or a list of blocks
}

type claudeBlock struct {
	Type      string `json:"type"`
	Text      string `json:"text"`
	ID        string `json:"id"`
	Name      string `json:"name"`
	ToolUseID string `json:"tool_use_id"`
}

func (m *claudeMessage) blocks() []claudeBlock {
	if m == nil {
		return nil
	}
	var bs []claudeBlock
	if json.Unmarshal(m.Content, &bs) != nil {
		return nil // plain string content: no blocks
	}
	return bs
}

func (s *state) claudeLine(b []byte) {
	var l claudeLine
	if err := json.Unmarshal(b, &l); err != nil {
		s.malformed("not a JSON object: "+err.Error(), b)
		return
	}
	if s.done(l.Type) {
		return
	}
	c := &s.claude
	if l.ParentToolUseID != nil && *l.ParentToolUseID != "" {
		switch l.Type {
		case "assistant", "user", "stream_event":
			s.cb.Heartbeat()
			return
		}
	}
	switch l.Type {
	case "assistant":
		textDone := false
		for _, bl := range l.Message.blocks() {
			switch bl.Type {
			case "text":
				if c.partials {
					continue
				}
				if !textDone {
					textDone = true
					s.sepPending = true
				}
				s.emit(bl.Text)
			case "tool_use":
				name := bl.Name
				if name == "" {
					name = "tool"
				}
				c.tools[bl.ID] = name
				s.cb.StepStarted(event.StepTool, name)
			}
		}
	case "user":
		for _, bl := range l.Message.blocks() {
			if bl.Type != "tool_result" {
				continue
			}
			name, ok := c.tools[bl.ToolUseID]
			if !ok {
				s.ignored("exec: tool_result for an unknown tool_use", "tool_use_id", bl.ToolUseID)
				continue
			}
			delete(c.tools, bl.ToolUseID)
			s.cb.StepCompleted(event.StepTool, name)
		}
	case "stream_event":
		if l.Event == nil {
			return
		}
		switch l.Event.Type {
		case "message_start":
			s.sepPending = true
		case "content_block_delta":
			if d := l.Event.Delta; d != nil && d.Type == "text_delta" {
				c.partials = true
				s.emit(d.Text)
			}
		}
	case "result":
		text := ""
		if l.Result != nil {
			text = *l.Result
		}
		if l.IsError || strings.HasPrefix(l.Subtype, "error") {
			if text == "" {
				text = "The agent failed (" + l.Subtype + ")."
			}
			s.setError(text)
			return
		}
		s.setFinal(text)
	default:
		s.ignored("exec: claude line ignored", "type", l.Type, "subtype", l.Subtype)
	}
}
