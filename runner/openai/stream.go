package openai

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/turnguard/turnguard/messages"
)

// Wire types of the Chat Completions API (the subset used here).

type chatMessage struct {
	Role       string         `json:"role"`
	Content    *string        `json:"content"` // null for an assistant message with only tool calls
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type chatRequest struct {
	Model    string        `json:"model"`
	Messages []chatMessage `json:"messages"`
	Stream   bool          `json:"stream"`
	Tools    []toolDef     `json:"tools,omitempty"`
}

type toolDef struct {
	Type     string      `json:"type"`
	Function toolDefFunc `json:"function"`
}

type toolDefFunc struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Parameters  any    `json:"parameters"`
}

type wireToolCall struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type wireDelta struct {
	Content   string         `json:"content"`
	ToolCalls []wireToolCall `json:"tool_calls"`
}

// chunk is one streamed event, or (Message set) a whole non-streamed answer.
type chunk struct {
	Choices []struct {
		Delta        wireDelta  `json:"delta"`
		Message      *wireDelta `json:"message"`
		FinishReason *string    `json:"finish_reason"`
	} `json:"choices"`
	Error json.RawMessage `json:"error"`
}

// llmReply is the outcome of one LLM call.
type llmReply struct {
	text      string
	toolCalls []toolCall
	finish    string
}

type toolCall struct {
	id, name, args string
}

// errIdle is the cancellation cause of an attempt whose stream went silent.
var errIdle = errors.New("idle")

// idleError reports an attempt cancelled by the idle timer.
type idleError struct {
	gotData bool // the attempt had received stream data
	emitted bool // the attempt had streamed reply text to the user
}

func (e *idleError) Error() string { return "model stream idle" }

// retryableError is a 408/429/5xx answer.
type retryableError struct {
	status     *StatusError
	retryAfter time.Duration
	hasAfter   bool
}

func (e *retryableError) Error() string { return e.status.Error() }

const (
	maxErrorBody = 64 << 10
	maxLine      = 4 << 20  // longest SSE line accepted
	maxJSONBody  = 16 << 20 // longest non-streamed answer accepted
)

// complete makes one LLM call to provider p, with the idle and HTTP
// retries — unless canSwitch (the turn may move to a fallback provider):
// then a silent or 408/429/5xx attempt is not retried, the turn moves on.
func (r *Runner) complete(ctx context.Context, runID string, p *provider, msgs []chatMessage, st *turnState, canSwitch bool) (llmReply, error) {
	body, err := json.Marshal(chatRequest{Model: p.model, Messages: msgs, Stream: true, Tools: r.toolDefs})
	if err != nil {
		return llmReply{}, fmt.Errorf("openai: encode request: %w", err)
	}
	idleRetried := false
	statusRetries := 0
	for attempt := 1; ; attempt++ {
		reply, err := r.attempt(ctx, p, body, st)
		if err == nil {
			return reply, nil
		}
		if ctx.Err() != nil {
			return llmReply{}, ctx.Err()
		}
		var ie *idleError
		var re *retryableError
		var se *StatusError
		var fe *failure
		switch {
		case errors.As(err, &fe): // already explained for the user
			return llmReply{}, err
		case errors.As(err, &ie):
			streak := p.idleStreak.Load()
			if !ie.gotData {
				streak = p.idleStreak.Add(1)
			}
			idle := messages.Duration(r.idle)
			switch {
			case ie.emitted:
				r.log.Warn("openai: model stream idle after reply text; not retrying", "run_id", runID, "idle", r.idle)
				return llmReply{}, &failure{
					user:  fmt.Sprintf("The model provider stopped sending the reply (nothing for %s); the reply is incomplete.", idle),
					cause: ErrIdleTimeout,
				}
			case streak >= BreakerThreshold:
				r.log.Warn("openai: model stream idle; circuit breaker open, not retrying", "run_id", runID, "idle", r.idle, "streak", streak)
				return llmReply{}, &failure{
					user:  fmt.Sprintf("The model provider is not responding (%d silent attempts in a row, nothing for %s each); not retrying until it answers again.", streak, idle),
					cause: ErrBreakerOpen,
				}
			case canSwitch:
				r.log.Warn("openai: model stream idle; not retrying, a fallback provider is next", "run_id", runID, "idle", r.idle, "model", p.model)
				return llmReply{}, &failure{
					user:  fmt.Sprintf("The model provider stopped responding (nothing for %s).", idle),
					cause: ErrIdleTimeout,
				}
			case idleRetried:
				r.log.Warn("openai: model stream idle again; giving up", "run_id", runID, "idle", r.idle, "model", p.model)
				return llmReply{}, &failure{
					user:  fmt.Sprintf("The model provider stopped responding (nothing for %s, twice).", idle),
					cause: ErrIdleTimeout,
				}
			}
			idleRetried = true
			r.log.Warn("openai: model stream idle; retrying once", "run_id", runID, "idle", r.idle, "streak", streak)
		case errors.As(err, &re):
			re.status.Attempts = attempt
			if statusRetries >= r.retries || canSwitch {
				r.log.Warn("openai: provider error; giving up on it", "run_id", runID, "model", p.model, "status", re.status.StatusCode,
					"attempts", attempt, "fallback_next", canSwitch, "message", re.status.Message)
				return llmReply{}, statusFailure(re.status, p.key)
			}
			wait := min(time.Second<<statusRetries, r.retryMaxWait)
			if re.hasAfter {
				wait = re.retryAfter
			}
			if wait > r.retryMaxWait {
				r.log.Warn("openai: provider asks to wait too long; giving up", "run_id", runID, "status", re.status.StatusCode, "retry_after", wait)
				return llmReply{}, &failure{
					user:  fmt.Sprintf("The model provider is busy (HTTP %d) and asks to retry in %s; not waiting that long.", re.status.StatusCode, wait.Round(time.Second)),
					cause: re.status,
				}
			}
			statusRetries++
			r.log.Warn("openai: provider error; retrying", "run_id", runID, "status", re.status.StatusCode, "attempt", attempt, "wait", wait)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return llmReply{}, ctx.Err()
			case <-t.C:
			}
		case errors.As(err, &se):
			se.Attempts = attempt
			r.log.Warn("openai: provider rejected the request", "run_id", runID, "status", se.StatusCode, "message", se.Message)
			return llmReply{}, statusFailure(se, p.key)
		default:
			return llmReply{}, err
		}
	}
}

// attempt makes one HTTP request to p and reads its answer, streaming text
// to st.
func (r *Runner) attempt(ctx context.Context, p *provider, body []byte, st *turnState) (reply llmReply, err error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := time.AfterFunc(r.idle, func() { cancel(errIdle) })
	defer timer.Stop()

	var gotData, emitted bool
	defer func() {
		if err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), errIdle) {
			err = &idleError{gotData: gotData, emitted: emitted}
		}
	}()

	req, err := http.NewRequestWithContext(actx, http.MethodPost, p.endpoint, bytes.NewReader(body))
	if err != nil {
		return llmReply{}, fmt.Errorf("openai: build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if p.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+p.apiKey)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, whose query may hold a secret
		}
		return llmReply{}, fmt.Errorf("openai: request to %s: %s", p.endpointSafe, redact(err.Error(), p.apiKey))
	}
	defer resp.Body.Close()

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		se := &StatusError{StatusCode: resp.StatusCode, Message: shorten(redact(providerMessage(raw), p.apiKey), maxProviderMessage)}
		if c := resp.StatusCode; c == http.StatusTooManyRequests || c == http.StatusRequestTimeout || c >= 500 {
			d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
			return llmReply{}, &retryableError{status: se, retryAfter: d, hasAfter: ok}
		}
		return llmReply{}, se
	}
	timer.Reset(r.idle)

	acc := newReplyAcc(func(s string) {
		emitted = true
		st.emit(s)
	})
	data := func() {
		if !gotData {
			gotData = true
			p.idleStreak.Store(0)
		}
	}

	if ct := resp.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/json") {
		// The server ignored stream:true and sent the whole answer.
		raw, err := io.ReadAll(io.LimitReader(resp.Body, maxJSONBody))
		if err != nil {
			return llmReply{}, fmt.Errorf("openai: read answer: %w", err)
		}
		data()
		if err := acc.add(raw, p.apiKey); err != nil {
			return llmReply{}, err
		}
		return acc.reply(), nil
	}

	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var event [][]byte
	dispatch := func() (done bool, err error) {
		if len(event) == 0 {
			return false, nil
		}
		payload := bytes.Join(event, []byte("\n"))
		event = event[:0]
		if string(bytes.TrimSpace(payload)) == "[DONE]" {
			return true, nil
		}
		data()
		return false, acc.add(payload, p.apiKey)
	}
	for {
		line, rerr := readLine(br)
		if len(line) > 0 || rerr == nil {
			timer.Reset(r.idle)
		}
		if rerr == nil || (rerr == io.EOF && len(line) > 0) {
			switch {
			case len(line) == 0:
				if done, err := dispatch(); err != nil || done {
					return acc.reply(), err
				}
			case line[0] == ':': // comment / keep-alive
			default:
				field, value, _ := bytes.Cut(line, []byte(":"))
				value = bytes.TrimPrefix(value, []byte(" "))
				if string(field) == "data" {
					event = append(event, append([]byte(nil), value...))
				}
			}
		}
		if rerr == io.EOF {
			if done, err := dispatch(); err != nil || done {
				return acc.reply(), err
			}
			if acc.finish == "" {
				return llmReply{}, errors.New("openai: the model provider closed the stream before the answer was complete")
			}
			return acc.reply(), nil
		}
		if rerr != nil {
			if errors.Is(rerr, errLineTooLong) {
				return llmReply{}, fmt.Errorf("openai: stream line longer than %d bytes", maxLine)
			}
			return llmReply{}, fmt.Errorf("openai: read stream: %s", redact(rerr.Error(), p.apiKey))
		}
	}
}

var errLineTooLong = errors.New("line too long")

// readLine returns the next line without its line ending (LF or CRLF).
func readLine(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		part, err := br.ReadSlice('\n')
		if len(buf)+len(part) > maxLine {
			return nil, errLineTooLong
		}
		buf = append(buf, part...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		buf = bytes.TrimSuffix(buf, []byte("\n"))
		buf = bytes.TrimSuffix(buf, []byte("\r"))
		return buf, err
	}
}

// replyAcc assembles the text and tool calls of one LLM call.
type replyAcc struct {
	emit   func(string)
	text   strings.Builder
	calls  []*callAcc
	byIdx  map[int]*callAcc
	finish string
}

type callAcc struct {
	index int
	id    string
	name  string
	args  strings.Builder
}

func newReplyAcc(emit func(string)) *replyAcc {
	return &replyAcc{emit: emit, byIdx: map[int]*callAcc{}}
}

// add applies one chunk (or a whole answer).
func (a *replyAcc) add(payload []byte, key string) error {
	var c chunk
	if err := json.Unmarshal(payload, &c); err != nil {
		return fmt.Errorf("openai: malformed stream data from the model provider: %w", err)
	}
	if len(c.Error) > 0 && string(c.Error) != "null" {
		msg := shorten(redact(providerMessage(payload), key), maxProviderMessage)
		return &failure{user: "The model provider reported an error: " + msg, cause: &StatusError{StatusCode: http.StatusOK, Message: msg}}
	}
	if len(c.Choices) == 0 {
		return nil // e.g. a usage-only chunk
	}
	ch := c.Choices[0]
	d := ch.Delta
	if ch.Message != nil {
		d = *ch.Message
	}
	if d.Content != "" {
		a.text.WriteString(d.Content)
		a.emit(d.Content)
	}
	for _, tc := range d.ToolCalls {
		var acc *callAcc
		switch {
		case tc.Index != nil:
			acc = a.byIdx[*tc.Index]
			if acc == nil {
				acc = a.newCall(*tc.Index)
			}
		case len(a.calls) > 0 && (tc.ID == "" || tc.ID == a.calls[len(a.calls)-1].id):
			acc = a.calls[len(a.calls)-1]
		default: // no index: a new id starts a new call, after the indexed ones
			acc = a.newCall(1<<30 + len(a.calls))
		}
		if tc.ID != "" {
			acc.id = tc.ID
		}
		if acc.name == "" {
			acc.name = tc.Function.Name
		}
		acc.args.WriteString(tc.Function.Arguments)
	}
	if ch.FinishReason != nil && *ch.FinishReason != "" {
		a.finish = *ch.FinishReason
	}
	return nil
}

func (a *replyAcc) newCall(index int) *callAcc {
	c := &callAcc{index: index}
	a.calls = append(a.calls, c)
	a.byIdx[index] = c
	return c
}

func (a *replyAcc) reply() llmReply {
	calls := append([]*callAcc(nil), a.calls...)
	sort.SliceStable(calls, func(i, j int) bool { return calls[i].index < calls[j].index })
	out := llmReply{text: a.text.String(), finish: a.finish}
	for i, c := range calls {
		id := c.id
		if id == "" {
			id = "call_" + strconv.Itoa(i+1)
		}
		out.toolCalls = append(out.toolCalls, toolCall{id: id, name: c.name, args: c.args.String()})
	}
	return out
}

// providerMessage extracts the human explanation from an error body:
// {"error":{"message":…}}, {"error":"…"}, {"message":…}, or the raw text.
func providerMessage(raw []byte) string {
	var e struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  string          `json:"detail"`
	}
	if json.Unmarshal(raw, &e) == nil {
		var obj struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case json.Unmarshal(e.Error, &obj) == nil && obj.Message != "":
			return obj.Message
		case json.Unmarshal(e.Error, &s) == nil && s != "":
			return s
		case e.Message != "":
			return e.Message
		case e.Detail != "":
			return e.Detail
		}
	}
	return strings.Join(strings.Fields(string(raw)), " ")
}

// parseRetryAfter reads a Retry-After header: delay seconds or an HTTP date.
func parseRetryAfter(h string, now time.Time) (time.Duration, bool) {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(h, 10, 64); err == nil {
		if n < 0 {
			n = 0
		}
		if n > int64(24*time.Hour/time.Second) {
			n = int64(24 * time.Hour / time.Second)
		}
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(h); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
