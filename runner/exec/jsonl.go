package exec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
)

// state is what one turn's stdout parser has seen. Its fields are written by
// the stdout goroutine and read by Run after that goroutine ended.
type state struct {
	cb     runner.Callbacks
	log    *slog.Logger
	format string

	text           strings.Builder // streamed deltas
	sepPending     bool            // the next delta starts a new message
	final          *string
	errMsg         *string
	malformedCount int
	ignoredCount   int  // lines ignored (logged at debug level)
	lineTooLong    bool // a line over maxLine ended the turn
	textDropped    int  // streamed bytes dropped over maxText

	terminal     chan struct{} // closed at the first final or error event
	terminalOnce sync.Once

	claude claudeState

	// ask asks the person permission requests (agents.exec.permissions);
	// nil when they are off. Set before the stdout goroutine starts.
	ask           *asker
	permOffLogged bool // the warning about permissions being off was logged
}

func newState(cb runner.Callbacks, log *slog.Logger, format string) *state {
	return &state{cb: cb, log: log, format: format, terminal: make(chan struct{}),
		claude: claudeState{tools: map[string]string{}}}
}

// reply is the turn's text: the final text, or else the streamed deltas.
func (s *state) reply() string {
	if s.final != nil && *s.final != "" {
		return *s.final
	}
	return s.text.String()
}

func (s *state) line(b []byte) {
	if len(bytes.TrimSpace(b)) == 0 {
		return
	}
	if s.format == FormatClaude {
		s.claudeLine(b)
		return
	}
	s.jsonlLine(b)
}

// done reports (and logs) an event arriving after the final or error event.
func (s *state) done(typ string) bool {
	if s.final == nil && s.errMsg == nil {
		return false
	}
	s.ignored("exec: event after the final answer ignored", "type", typ)
	return true
}

// ignored logs, at debug level, a line that is ignored: the first
// maxLoggedLines of a turn (Run summarises the rest), each string value cut
// to maxLoggedField bytes (the agent wrote it).
func (s *state) ignored(msg string, args ...any) {
	if s.ignoredCount++; s.ignoredCount <= maxLoggedLines {
		for i, a := range args {
			if v, ok := a.(string); ok {
				args[i] = cut(v, maxLoggedField)
			}
		}
		s.log.Debug(msg, args...)
	}
}

// malformed counts a line that cannot be understood and logs the first
// maxLoggedLines of a turn (Run summarises the rest).
func (s *state) malformed(why string, line []byte) {
	if s.malformedCount++; s.malformedCount <= maxLoggedLines {
		s.log.Warn("exec: malformed output line", "why", cut(why, maxLoggedField), "line", cut(string(line), maxLoggedField))
	}
}

// tooLong ends the turn on a stdout line longer than maxLine: the user is
// told in words, and Run stops the agent at once.
func (s *state) tooLong() {
	if s.final != nil || s.errMsg != nil {
		s.ignored("exec: line too long after the final answer ignored")
		return
	}
	s.log.Warn("exec: output line too long; stopping the agent", "limit_bytes", maxLine)
	s.lineTooLong = true
	s.setError(fmt.Sprintf("The agent wrote an output line longer than %d MiB, more than turnguard accepts, so it was stopped.", maxLine>>20))
}

// emit streams reply text; a new message is separated from earlier text by
// a blank line.
func (s *state) emit(text string) {
	if text == "" {
		return
	}
	if s.sepPending {
		s.sepPending = false
		if s.text.Len() > 0 && !strings.HasSuffix(s.text.String(), "\n") {
			text = "\n\n" + text
		}
	}
	if room := maxText - s.text.Len(); len(text) > room {
		s.textDropped += len(text) - max(room, 0)
		if room <= 0 {
			return
		}
		text = cut(text, room)
		text = strings.TrimSuffix(text, "…") // cut marks the cut; the engine's cap says so
	}
	s.text.WriteString(text)
	s.cb.Delta(text)
}

func (s *state) setFinal(text string) {
	s.final = &text
	s.terminalOnce.Do(func() { close(s.terminal) })
}

func (s *state) setError(msg string) {
	s.errMsg = &msg
	s.terminalOnce.Do(func() { close(s.terminal) })
}

// jsonlEvent is one line of the jsonl protocol.
type jsonlEvent struct {
	Type    string `json:"type"`
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Text    string `json:"text"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

func (s *state) jsonlLine(b []byte) {
	var ev jsonlEvent
	if err := json.Unmarshal(b, &ev); err != nil {
		// A permission request with a field of the wrong type still gets
		// its (refusing) answer: the agent may be waiting for it.
		var head struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(b, &head) == nil && head.Type == "permission" && !s.done(head.Type) {
			s.permission(b)
			return
		}
		s.malformed("not a JSON event object: "+err.Error(), b)
		return
	}
	if s.done(ev.Type) {
		return
	}
	switch ev.Type {
	case "step_start", "step_complete":
		if ev.Kind == "" {
			ev.Kind = event.StepTool
		}
		if ev.Name == "" && ev.Kind == event.StepTool {
			s.malformed(ev.Type+" without a name", b)
			return
		}
		if ev.Type == "step_start" {
			s.cb.StepStarted(ev.Kind, ev.Name)
		} else {
			s.cb.StepCompleted(ev.Kind, ev.Name)
		}
	case "delta":
		s.emit(ev.Text)
	case "heartbeat":
		s.cb.Heartbeat()
	case "pause":
		s.cb.Pause(ev.Reason)
	case "resume":
		s.cb.Resume()
	case "final":
		s.setFinal(ev.Text)
	case "error":
		if ev.Message == "" {
			ev.Message = "The agent reported an error."
		}
		s.setError(ev.Message)
	case "permission":
		s.permission(b)
	case "":
		s.malformed(`no "type"`, b)
	default:
		s.malformed(fmt.Sprintf("unknown type %q", ev.Type), b)
	}
}

// permission handles a permission request: asked in the background, or
// refused at once when it is malformed. With permissions off it is only
// logged: the agent's stdin is already at its end.
func (s *state) permission(b []byte) {
	if s.ask == nil {
		if !s.permOffLogged {
			s.permOffLogged = true
			s.log.Warn("exec: the agent asks for permission but agents.exec.permissions is off; not asked (its stdin is at its end)")
		}
		s.ignored("exec: permission request ignored: agents.exec.permissions is off")
		return
	}
	id, q, err := parsePermission(b)
	if err != nil {
		s.malformed("permission request: "+err.Error(), b)
		s.ask.refuse(id, err.Error())
		return
	}
	s.ask.ask(id, q)
}

// cut shortens s to at most n bytes at a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
