// chat.history: the history messages and fitting an answer into the answer
// budget (fitHistory, cutText, jsonLen), which sessions.list shares.

package ws

import (
	"errors"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
)

type historyParams struct {
	SessionKey string `json:"sessionKey"`
	Limit      int    `json:"limit"`
}

// historyMessage is a chat.history message (and the message of chat
// events).
type historyMessage struct {
	Role       string         `json:"role"`
	Content    []contentBlock `json:"content"`
	Timestamp  int64          `json:"timestamp"`
	StopReason string         `json:"stopReason,omitempty"`
	// Turnguard: on a finished turn's first assistant message, its steps and
	// settled approvals (turndetails.go); chat.history only.
	Turnguard *turnView `json:"turnguard,omitempty"`
	// RunID is the turn the message belongs to ("" unknown); chat.history
	// only.
	RunID string `json:"runId,omitempty"`
	// Resumed marks the notice of an interrupted turn that was dispatched
	// again (agents.defaults.resume: its words say "resuming it"): a Retry
	// would run the request a second time, so a client offers none.
	// chat.history only.
	Resumed bool `json:"resumed,omitempty"`
}

type contentBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

func textMessage(role, text string, at time.Time, stop event.StopReason) *historyMessage {
	return &historyMessage{Role: role, Content: []contentBlock{{Type: "text", Text: text}}, Timestamp: ms(at), StopReason: string(stop)}
}

func chatHistory(c *conn, req request) (any, *rpcError) {
	var p historyParams
	if rerr := decodeParams(req.Method, req.Params, &p); rerr != nil {
		return nil, rerr
	}
	key, rerr := canonicalKey(req.Method, p.SessionKey)
	if rerr != nil {
		return nil, rerr
	}
	if p.Limit < 0 {
		return nil, invalid("invalid chat.history params: limit must be ≥ 0")
	}
	c.s.watch(c, key)
	id, msgs, err := c.s.eng.History(c.ctx, key, p.Limit)
	var unavail *gateway.HistoryUnavailableError
	if errors.As(err, &unavail) {
		// The store does not answer: an empty history would be a lie.
		return nil, &rpcError{Code: CodeUnavailable, Message: unavail.UserText(), Retryable: true, RetryAfterMs: 5000,
			Details: map[string]any{"code": "HISTORY_UNAVAILABLE"}}
	}
	// The running turn and queue after the history: a turn that ended in
	// between is in the history, not shown as running (see reattach.go).
	// In cluster mode they are asked of the replica that runs the turn
	// (one view from every replica); when it cannot be asked the history
	// is still answered, without them.
	budget := c.s.answerBudget()
	st, err := c.s.eng.StatusOf(c.ctx, key)
	if err != nil {
		c.s.log.Warn("chat.history: the session's running turn cannot be read", "conn", c.id, "session", key, "err", err)
	}
	live, used := c.s.reattachAfter(st, budget, msgs)
	turns, turnsUsed := c.s.finishedTurns(c.ctx, key, msgs, budget)
	out, omitted := fitHistory(msgs, budget-used-turnsUsed)
	attachTurns(out, turns)
	c.s.markResumed(c.ctx, out)
	res := map[string]any{
		"sessionKey": key, "sessionId": id, "messages": out, "thinkingLevel": "off", "verboseLevel": "on",
	}
	if omitted > 0 {
		res["truncated"], res["omitted"] = true, omitted
	}
	if live != nil {
		res["turnguard"] = live
	}
	return res, nil
}

// answerBudget is server.maxAnswerBytes, the largest chat.history or
// sessions.list answer.
func (s *Server) answerBudget() int {
	if b := s.cfg.Current().Server.MaxAnswerBytes; b > 0 {
		return b
	}
	return 1 << 20
}

// Per-item overhead of an answer's JSON beyond the texts (fields, escapes
// of a typical message); a bound used to fit answers in their budget.
const (
	historyOverhead = 160
	answerOverhead  = 512
)

// fitHistory returns the newest messages of msgs whose encoding fits in
// budget bytes, oldest first, and how many older ones it left out. When any
// are left out the answer starts with an assistant message saying so; a
// single message longer than the budget is cut and says so at its end. The
// texts are the engine's strings: nothing is copied but what is cut.
func fitHistory(msgs []gateway.Message, budget int) ([]*historyMessage, int) {
	budget -= answerOverhead
	used, first := 0, len(msgs)
	for first > 0 {
		n := jsonLen(msgs[first-1].Text) + historyOverhead
		if used+n > budget {
			break
		}
		used += n
		first--
	}
	var cut *historyMessage
	if first == len(msgs) && first > 0 {
		// Not even the newest message fits: send its beginning.
		first--
		m := msgs[first]
		cut = textMessage(m.Role, cutText(m.Text, budget-2*historyOverhead-200), m.Time, m.StopReason)
		cut.RunID = m.RunID
	}
	out := make([]*historyMessage, 0, len(msgs)-first+1)
	if first > 0 {
		out = append(out, textMessage("assistant", omittedText(first), msgs[first-1].Time, ""))
	}
	if cut != nil {
		return append(out, cut), first
	}
	for _, m := range msgs[first:] {
		hm := textMessage(m.Role, m.Text, m.Time, m.StopReason)
		hm.RunID = m.RunID
		out = append(out, hm)
	}
	return out, first
}

func omittedText(n int) string {
	if n == 1 {
		return "⋯ 1 earlier message is not shown: the history is too long to send at once."
	}
	return "⋯ " + strconv.Itoa(n) + " earlier messages are not shown: the history is too long to send at once."
}

// cutText returns the longest prefix of s (at a character boundary) whose
// JSON encoding with the cut notice fits in budget bytes, followed by the
// notice.
func cutText(s string, budget int) string {
	notice := "\n\n⋯ [cut: this message is " + strconv.Itoa(len(s)) + " bytes, too long to show here]"
	budget -= jsonLen(notice)
	n, end := 0, 0
	for end < len(s) {
		r, size := utf8.DecodeRuneInString(s[end:])
		if n += jsonRuneLen(r); n > budget {
			break
		}
		end += size
	}
	return s[:end] + notice
}

// jsonLen is the length of s encoded as a JSON string (jsonstr.Append,
// mustJSON: no HTML escapes).
func jsonLen(s string) int {
	n := 2
	for _, r := range s {
		n += jsonRuneLen(r)
	}
	return n
}

func jsonRuneLen(r rune) int {
	switch {
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20:
		return 6
	case r == '\u2028' || r == '\u2029' || r == utf8.RuneError:
		return 6
	}
	return utf8.RuneLen(r)
}
