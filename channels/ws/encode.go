package ws

import (
	"strconv"

	"github.com/turnguard/turnguard/internal/jsonstr"
)

// The run events are the hot path (every turn produces about ten frames),
// so their payloads are appended by hand instead of going through
// encoding/json's reflection: one allocation per frame, the frame prefix
// and the payload in one buffer. The field names and shapes are those of
// the chatEvent, agentEvent, lifecycleData, toolData and itemData types;
// encode_test.go checks the output against encoding/json.

// jw appends one JSON object.
type jw struct {
	b     []byte
	comma bool
}

func newFrame(event string, size int) *jw {
	w := &jw{b: make([]byte, 0, size+len(event)+64)}
	w.b = append(w.b, `{"type":"event","event":"`...)
	w.b = append(w.b, event...)
	w.b = append(w.b, `","payload":`...)
	return w
}

// head ends the payload and returns the frame up to its seq value.
func (w *jw) head() []byte { return append(w.b, `,"seq":`...) }

func (w *jw) open() *jw {
	w.b = append(w.b, '{')
	w.comma = false
	return w
}

func (w *jw) close() *jw {
	w.b = append(w.b, '}')
	w.comma = true
	return w
}

func (w *jw) key(k string) {
	if w.comma {
		w.b = append(w.b, ',')
	}
	w.b = append(w.b, '"')
	w.b = append(w.b, k...)
	w.b = append(w.b, '"', ':')
	w.comma = true
}

func (w *jw) str(k, v string) *jw {
	w.key(k)
	w.b = jsonstr.Append(w.b, v)
	return w
}

func (w *jw) strOmit(k, v string) *jw {
	if v != "" {
		w.str(k, v)
	}
	return w
}

func (w *jw) int(k string, v int64) *jw {
	w.key(k)
	w.b = strconv.AppendInt(w.b, v, 10)
	return w
}

func (w *jw) intOmit(k string, v int64) *jw {
	if v != 0 {
		w.int(k, v)
	}
	return w
}

func (w *jw) boolOmit(k string, v bool) *jw {
	if v {
		w.key(k)
		w.b = append(w.b, "true"...)
	}
	return w
}

func (w *jw) raw(k, v string) *jw {
	w.key(k)
	w.b = append(w.b, v...)
	return w
}

// obj starts an object-valued field.
func (w *jw) obj(k string) *jw {
	w.key(k)
	return w.open()
}

// message appends a text message: {"role","content":[{"type":"text","text"}],"timestamp","stopReason"?}.
func (w *jw) message(k string, m *historyMessage) *jw {
	w.obj(k).str("role", m.Role)
	w.key("content")
	w.b = append(w.b, '[')
	for i, c := range m.Content {
		if i > 0 {
			w.b = append(w.b, ',')
		}
		w.open().str("type", c.Type).str("text", c.Text).close()
	}
	w.b = append(w.b, ']')
	return w.int("timestamp", m.Timestamp).strOmit("stopReason", m.StopReason).close()
}

// encodeChat returns the frame head of a chat event.
func encodeChat(p *chatEvent) []byte {
	size := 160 + len(p.DeltaText) + len(p.ErrorMessage)
	if p.Message != nil {
		for _, c := range p.Message.Content {
			size += len(c.Text) + 40
		}
	}
	w := newFrame("chat", size).open()
	w.str("runId", p.RunID).str("sessionKey", p.SessionKey).int("seq", int64(p.Seq)).strOmit("agentId", p.AgentID).
		str("state", p.State).strOmit("deltaText", p.DeltaText)
	if p.Message != nil {
		w.message("message", p.Message)
	}
	w.strOmit("stopReason", p.StopReason).strOmit("errorMessage", p.ErrorMessage).strOmit("errorKind", p.ErrorKind).
		intOmit("endedAt", p.EndedAt)
	return w.close().head()
}

// encodeAgent returns the frame head of an agent event; data is one of
// lifecycleData, toolData, itemData.
func encodeAgent(p *agentEvent) []byte {
	w := newFrame("agent", 256).open()
	w.str("runId", p.RunID).int("seq", int64(p.Seq)).str("stream", p.Stream).int("ts", p.Ts).
		str("sessionKey", p.SessionKey).strOmit("agentId", p.AgentID)
	switch d := p.Data.(type) {
	case lifecycleData:
		w.obj("data").str("phase", d.Phase).intOmit("startedAt", d.StartedAt).intOmit("endedAt", d.EndedAt).
			strOmit("stopReason", d.StopReason).boolOmit("aborted", d.Aborted).strOmit("error", d.Error).
			strOmit("toolCallId", d.ToolCallID).strOmit("name", d.Name).intOmit("elapsedMs", d.ElapsedMs).
			strOmit("userText", d.UserText).strOmit("message", d.Message).intOmit("deadlineAt", d.DeadlineAt).close()
	case toolData:
		w.obj("data").str("phase", d.Phase).str("toolCallId", d.ToolCallID).str("name", d.Name)
		if d.Args != nil {
			w.raw("args", "{}")
		}
		if d.Result != nil {
			w.obj("result").key("content")
			w.b = append(w.b, '[')
			for i, c := range d.Result.Content {
				if i > 0 {
					w.b = append(w.b, ',')
				}
				w.open().str("type", c.Type).str("text", c.Text).close()
			}
			w.b = append(w.b, ']')
			w.close()
		}
		w.boolOmit("isError", d.IsError)
		if d.Meta != nil {
			w.obj("meta").int("durationMs", d.Meta.DurationMs).close()
		}
		w.close()
	case itemData:
		w.obj("data").str("itemId", d.ItemID).str("toolCallId", d.ToolCallID).str("phase", d.Phase).str("kind", d.Kind).
			str("title", d.Title).str("status", d.Status).str("name", d.Name).strOmit("progressText", d.ProgressText).close()
	default:
		w.raw("data", string(mustJSON(d)))
	}
	return w.close().head()
}
