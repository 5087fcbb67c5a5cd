package ws

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// The hand-written encoders produce what encoding/json would for the same
// values: same fields, same values, valid JSON.
func TestEncodersMatchEncodingJSON(t *testing.T) {
	msg := textMessage("assistant", "line\n\"quoted\" \\ tab\t \x01 é 🙂 \u2028", timeAt(1795343267026), "")
	chats := []*chatEvent{
		{RunID: "r", SessionKey: "agent:main:main", Seq: 3, AgentID: "main", State: "delta", DeltaText: "chunk", Message: msg},
		{RunID: "r", SessionKey: "k", Seq: 9, State: "aborted", StopReason: "step_timeout", ErrorMessage: "⚠️ No progress", EndedAt: 5},
		{RunID: "r", SessionKey: "k", State: "final", StopReason: "stop", Message: textMessage("assistant", "", timeAt(0), "stop")},
		{RunID: "bad\xffutf8", SessionKey: "k", State: "error", ErrorMessage: "x", ErrorKind: "unknown"},
	}
	for _, p := range chats {
		compare(t, encodeChat(p), p)
	}
	agents := []agentEvent{
		{RunID: "r", Seq: 1, Stream: "lifecycle", Ts: 7, SessionKey: "k", AgentID: "main", Data: lifecycleData{Phase: "start", StartedAt: 7, UserText: "hi \"there\""}},
		{RunID: "r", Seq: 2, Stream: "lifecycle", Ts: 7, SessionKey: "k", Data: lifecycleData{Phase: "end", EndedAt: 9, StopReason: "user", Aborted: true, Error: "e", ToolCallID: "r:1", Name: "shell", ElapsedMs: 3}},
		{RunID: "r", Seq: 3, Stream: "lifecycle", Ts: 8, SessionKey: "k", Data: lifecycleData{Phase: "warning", Message: "⏳ \"soon\"", DeadlineAt: 10, ElapsedMs: 8}},
		{RunID: "r", Seq: 3, Stream: "tool", Ts: 7, SessionKey: "k", Data: toolData{Phase: "start", ToolCallID: "r:1", Name: "shell", Args: &struct{}{}}},
		{RunID: "r", Seq: 4, Stream: "tool", Ts: 7, SessionKey: "k", Data: toolData{Phase: "result", ToolCallID: "r:1", Name: "shell",
			Result: &toolResult{Content: []contentBlock{{Type: "text", Text: "out"}, {Type: "text", Text: "more"}}}, IsError: true, Meta: &toolMeta{DurationMs: 12}}},
		{RunID: "r", Seq: 5, Stream: "item", Ts: 7, SessionKey: "k", Data: itemData{ItemID: "i", ToolCallID: "r:1", Phase: "update", Kind: "tool",
			Title: "⏳ Still working — shell has been running for 30 s…", Status: "running", Name: "shell", ProgressText: "p"}},
	}
	for _, p := range agents {
		compare(t, encodeAgent(&p), p)
	}
}

func compare(t *testing.T, head []byte, payload any) {
	t.Helper()
	frame := string(head) + "1}"
	if !utf8.ValidString(frame) || !json.Valid([]byte(frame)) {
		t.Fatalf("invalid frame %s", frame)
	}
	var got struct{ Payload any }
	json.Unmarshal([]byte(frame), &got)
	var want any
	json.Unmarshal(mustJSON(payload), &want)
	if !reflect.DeepEqual(got.Payload, want) {
		t.Fatalf("hand-encoded %s\nencoding/json %s", frame, mustJSON(payload))
	}
	if !strings.HasPrefix(frame, `{"type":"event","event":"`) {
		t.Fatalf("frame %s", frame)
	}
}

func timeAt(ms int64) time.Time { return time.UnixMilli(ms) }
