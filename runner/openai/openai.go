// Package openai owns the runner that talks to an OpenAI-compatible Chat
// Completions API (OpenAI, Ollama, vLLM, llama.cpp's server, LM Studio, …)
// with streaming, and the built-in tools it can offer the model
// (current_time, http_get and command tools declared in YAML).
//
// One turn is an agent loop: an LLM call, then the tool calls the model asked
// for, then another LLM call with the results, and so on until the model
// answers without calling a tool or maxSteps LLM calls have been made.
//
// What the runner reports through runner.Callbacks:
//
//   - StepStarted/StepCompleted("llm", model) around each LLM call (retries
//     of one call stay inside one step) and ("tool", name) around each tool
//     call. Tool calls run one after another, in the order the model gave.
//     A step that fails or is interrupted is not reported complete.
//   - Tools marked requireApproval are asked of the person (Turn.Ask:
//     "Run tool <name>", the arguments as detail) before each call. The wait
//     is not a step: the tool step starts once the call is allowed. A call
//     not allowed does not run and has no step; the model gets DeniedResult
//     or TimedOutResult as its result and the turn goes on.
//   - Delta for every streamed piece of reply text. When a later LLM call
//     streams text after earlier text, a blank line ("\n\n") is streamed
//     first, so Result.Text is always exactly the concatenation of the deltas.
//
// Failure behaviour:
//
//   - Idle stream: if no byte arrives for llmIdleTimeoutSeconds (default 120)
//     — while waiting for response headers or in the middle of a stream — the
//     request is cancelled and made once more. A second silent attempt fails
//     the turn with ErrIdleTimeout. No retry is made when the silent attempt
//     had already streamed reply text to the user (the retry would repeat it).
//   - Circuit breaker: idle timeouts of attempts that produced no stream data
//     are counted across turns; after BreakerThreshold in a row the runner
//     stops retrying idle attempts (each LLM call gets one attempt and fails
//     with ErrBreakerOpen) until an attempt produces data again. A dead
//     provider thus costs one request per LLM call, not two.
//   - HTTP 408, 429 and 5xx: retried up to 3 times (WithRetries), waiting
//     what Retry-After says (seconds or an HTTP date) or 1s, 2s, 4s; a wait
//     longer than the cap (60s by default) is not made and the turn fails.
//   - Fallback providers (agents.openai.fallbacks): a model call that fails
//     in any way above, while the turn has streamed no reply text and run
//     no tool (replay-safe), is not retried: the turn moves to the next
//     provider at once, with one notice to the person
//     (messages.ProviderSwitched, as reply text), a heartbeat (a fresh
//     liveness window) and runner.FallbackReporter when cb implements it.
//     Later calls of the turn stay on that provider; the next turn starts
//     with the main one. After reply text or a tool run, a failure stops
//     the turn as without fallbacks.
//   - Other 4xx: the turn fails at once with a *StatusError whose message is
//     meant for the user; the API key never appears in any error or log, even
//     when the provider echoes it.
//
// Steering (busy mode steer): the runner is a runner.Steerer. Messages the
// person sends while a turn runs are added as user messages before the
// turn's next model call; one that arrives during the final answer gets one
// more call while maxSteps allows (otherwise the engine queues it).
//
// Errors meant for the user also satisfy runner.AsUserError; errors.Is and
// errors.As reach the typed cause (ErrIdleTimeout, ErrBreakerOpen,
// ErrMaxSteps, *StatusError). After ctx is cancelled Run returns promptly with
// the text streamed so far and ctx.Err(); a running command tool's process
// group is killed.
package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
)

// Defaults applied by New.
const (
	DefaultBaseURL            = "https://api.openai.com/v1"
	DefaultMaxSteps           = 8
	DefaultLLMIdleTimeout     = 120 * time.Second
	DefaultRetries            = 3
	DefaultRetryMaxWait       = 60 * time.Second
	DefaultHTTPGetMaxBytes    = 1 << 20
	DefaultHTTPGetTimeout     = 20 * time.Second
	DefaultCommandTimeout     = 30 * time.Second
	DefaultCommandOutputBytes = 64 << 10

	// BreakerThreshold is how many idle timeouts in a row, without any
	// stream data in between, open the circuit breaker.
	BreakerThreshold = 5
)

// Runner runs turns against an OpenAI-compatible Chat Completions API. It is
// safe for concurrent use by many turns.
type Runner struct {
	*provider                // agents.openai: the main provider
	fallbacks    []*provider // agents.openai.fallbacks, in order
	systemPrompt string
	maxSteps     int
	idle         time.Duration
	retries      int
	retryMaxWait time.Duration
	client       *http.Client
	log          *slog.Logger
	toolByName   map[string]tool
	toolDefs     []toolDef

	toolClient *http.Client // for http_get; nil = a default client
}

// provider is one OpenAI-compatible endpoint with its key and model.
type provider struct {
	key          string // its configuration: agents.openai, agents.openai.fallbacks[0], …
	endpoint     string // …/chat/completions
	endpointSafe string // endpoint without its query, for messages
	apiKey       string
	model        string

	idleStreak atomic.Int32 // consecutive idle timeouts without stream data
}

// newProvider checks and builds one provider; key names its configuration
// ("agents.openai", "agents.openai.fallbacks[0]") in errors, which never
// contain the URL (its query may hold a secret) nor the API key.
func newProvider(key, baseURL, apiKey, model string) (*provider, error) {
	p := &provider{key: key, apiKey: apiKey, model: strings.TrimSpace(model)}
	base := strings.TrimSpace(baseURL)
	if base == "" {
		if key != "agents.openai" {
			return nil, fmt.Errorf("%s.baseURL: required (e.g. http://127.0.0.1:11434/v1)", key)
		}
		base = DefaultBaseURL
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s.baseURL: not an http(s) URL (e.g. https://api.openai.com/v1 or http://127.0.0.1:11434/v1)", key)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%s.baseURL: must not contain credentials; use %s.apiKey", key, key)
	}
	u.Fragment, u.RawFragment = "", ""
	u.Path = strings.TrimRight(u.Path, "/") + "/chat/completions"
	u.RawPath = ""
	p.endpoint = u.String()
	p.endpointSafe = (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
	if p.model == "" {
		return nil, fmt.Errorf("%s.model: required (e.g. gpt-4o-mini, or llama3.2 on Ollama)", key)
	}
	return p, nil
}

var _ runner.Runner = (*Runner)(nil)
var _ runner.Prober = (*Runner)(nil)

// Probe asks the provider for its models (GET …/models, the API key sent as
// for a turn) and reports whether it can work: nil for any answer but a
// refused key (an endpoint without /models still answered), an error naming
// the endpoint (without its query) when nothing answers within ctx or the
// key is refused (HTTP 401 or 403).
func (r *Runner) Probe(ctx context.Context) error {
	models := strings.TrimSuffix(r.endpoint, "/chat/completions")
	if u, err := url.Parse(r.endpoint); err == nil {
		u.Path = strings.TrimSuffix(u.Path, "/chat/completions") + "/models"
		models = u.String()
	}
	where := strings.TrimSuffix(r.endpointSafe, "/chat/completions")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, models, nil)
	if err != nil {
		return fmt.Errorf("the model provider at %s: %w", where, err)
	}
	if r.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.apiKey)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return fmt.Errorf("the model provider at %s does not answer: %s", where, probeCause(err))
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return fmt.Errorf("the model provider at %s refuses the API key (HTTP %d); check agents.openai.apiKey", where, resp.StatusCode)
	}
	return nil
}

// probeCause words why a probe got no answer, without the URL Go's error
// repeats (its query may hold a secret).
func probeCause(err error) string {
	var op *net.OpError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "no answer in time"
	case errors.As(err, &op) && op.Err != nil:
		return op.Err.Error()
	}
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err.Error()
	}
	return err.Error()
}

// Option configures a Runner.
type Option func(*Runner)

// WithHTTPClient sets the client used to call the provider (default: a
// client with no overall timeout; the idle timeout bounds each request).
func WithHTTPClient(c *http.Client) Option { return func(r *Runner) { r.client = c } }

// WithToolHTTPClient sets the client the http_get tool uses. Its
// CheckRedirect is replaced by the allowlist check.
func WithToolHTTPClient(c *http.Client) Option { return func(r *Runner) { r.toolClient = c } }

// WithLogger sets the logger (default: discard). The API key is never logged.
func WithLogger(l *slog.Logger) Option { return func(r *Runner) { r.log = l } }

// WithRetries sets how many times a 408/429/5xx answer is retried (default 3;
// negative means 0) and the longest wait between attempts the runner accepts
// (default 60s; ≤ 0 keeps the default).
func WithRetries(n int, maxWait time.Duration) Option {
	return func(r *Runner) {
		r.retries = max(n, 0)
		if maxWait > 0 {
			r.retryMaxWait = maxWait
		}
	}
}

// New validates cfg and returns a runner. Unset keys take their defaults:
// baseURL https://api.openai.com/v1, maxSteps 8, llmIdleTimeoutSeconds 120.
// model is required; apiKey is optional (local servers need none). Errors
// name the offending key (agents.openai.…) and never contain the API key.
func New(cfg config.OpenAI, opts ...Option) (*Runner, error) {
	r := &Runner{
		systemPrompt: cfg.SystemPrompt,
		maxSteps:     cfg.MaxSteps,
		retries:      DefaultRetries,
		retryMaxWait: DefaultRetryMaxWait,
	}
	for _, o := range opts {
		o(r)
	}
	if r.client == nil {
		r.client = &http.Client{}
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}

	var err error
	if r.provider, err = newProvider("agents.openai", cfg.BaseURL, cfg.APIKey, cfg.Model); err != nil {
		return nil, err
	}
	if len(cfg.Fallbacks) > config.MaxOpenAIFallbacks {
		return nil, fmt.Errorf("agents.openai.fallbacks: lists %d providers; at most %d are tried", len(cfg.Fallbacks), config.MaxOpenAIFallbacks)
	}
	for i, f := range cfg.Fallbacks {
		p, err := newProvider(fmt.Sprintf("agents.openai.fallbacks[%d]", i), f.BaseURL, f.APIKey, f.Model)
		if err != nil {
			return nil, err
		}
		r.fallbacks = append(r.fallbacks, p)
	}
	switch {
	case r.maxSteps == 0:
		r.maxSteps = DefaultMaxSteps
	case r.maxSteps < 0:
		return nil, fmt.Errorf("agents.openai.maxSteps: must be ≥ 1, got %d", r.maxSteps)
	}
	switch s := cfg.LLMIdleTimeoutSeconds; {
	case math.IsNaN(s) || math.IsInf(s, 0) || s < 0:
		return nil, fmt.Errorf("agents.openai.llmIdleTimeoutSeconds: must be a number ≥ 0, got %v", s)
	case s == 0:
		r.idle = DefaultLLMIdleTimeout
	default:
		r.idle = max(time.Duration(s*float64(time.Second)), 100*time.Millisecond)
	}
	if err := r.buildTools(cfg.Tools); err != nil {
		return nil, err
	}
	return r, nil
}

// Model returns the configured model name (the name of "llm" steps).
func (r *Runner) Model() string { return r.model }

// BreakerOpen reports whether the idle circuit breaker is open.
func (r *Runner) BreakerOpen() bool { return r.idleStreak.Load() >= BreakerThreshold }

// turnState is what one Run accumulates.
type turnState struct {
	cb        runner.Callbacks
	text      strings.Builder
	stepStart bool // no delta yet in the current LLM step
	spoke     bool // a model's reply text has been streamed
	toolRan   bool // a tool call has run
}

// replaySafe reports whether the turn could start over on another provider:
// the person has seen no reply text and no tool has run.
func (t *turnState) replaySafe() bool { return !t.spoke && !t.toolRan }

// notice streams a line of the runner's own to the person, before the
// reply text (it ends with a blank line, so no separator follows).
func (t *turnState) notice(s string) {
	s += "\n\n"
	t.text.WriteString(s)
	t.cb.Delta(s)
}

// emit streams reply text, separating the text of successive LLM calls.
func (t *turnState) emit(s string) {
	if s == "" {
		return
	}
	if t.stepStart {
		t.stepStart = false
		if t.text.Len() > 0 && !strings.HasSuffix(t.text.String(), "\n") {
			s = "\n\n" + s
		}
	}
	t.spoke = true
	t.text.WriteString(s)
	t.cb.Delta(s)
}

// Steers reports true: messages steered into a turn (runner.Turn.Inbox)
// reach the model as user messages before its next call — also after a
// final answer, which then gets one more call while maxSteps allows. The
// gateway's notes (a budget warning) reach it as system messages before its
// next call.
func (r *Runner) Steers() bool { return true }

var _ runner.Steerer = (*Runner)(nil)

// Run does one turn. See the package documentation for what it reports.
func (r *Runner) Run(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
	if cb == nil {
		cb = runner.Nop{}
	}
	st := &turnState{cb: cb}
	result := func(err error) (runner.Result, error) {
		if ctx.Err() != nil {
			return runner.Result{Text: st.text.String()}, ctx.Err()
		}
		return runner.Result{Text: st.text.String()}, err
	}

	msgs := make([]chatMessage, 0, len(turn.History)+2)
	if r.systemPrompt != "" {
		msgs = append(msgs, chatMessage{Role: "system", Content: ptr(r.systemPrompt)})
	}
	for _, m := range turn.History {
		role := m.Role
		if role != "assistant" {
			role = "user"
		}
		msgs = append(msgs, chatMessage{Role: role, Content: ptr(m.Text)})
	}
	msgs = append(msgs, chatMessage{Role: "user", Content: ptr(turn.Message)})

	// steered adds the messages the person sent meanwhile (busy mode
	// steer) as user messages; it reports whether there were any.
	steered := func() bool {
		if turn.Inbox == nil {
			return false
		}
		more := turn.Inbox.Take()
		for _, m := range more {
			msgs = append(msgs, chatMessage{Role: "user", Content: ptr(m)})
		}
		return len(more) > 0
	}

	// notes adds the gateway's notes (a budget warning: "N left, wrap
	// up") as system messages; unlike a steered message a note never asks
	// for one more call.
	notes := func() {
		if turn.Inbox == nil {
			return
		}
		for _, n := range turn.Inbox.TakeNotes() {
			msgs = append(msgs, chatMessage{Role: "system", Content: ptr(n)})
		}
	}

	p, next := r.provider, r.fallbacks // the turn's provider, and those left
	for step := 1; step <= r.maxSteps; step++ {
		steered()
		notes()
		cb.StepStarted(event.StepLLM, p.model)
		st.stepStart = true
		reply, err := r.complete(ctx, turn.RunID, p, msgs, st, len(next) > 0 && st.replaySafe())
		for err != nil && ctx.Err() == nil && len(next) > 0 && st.replaySafe() {
			p, next = r.switchProvider(turn.RunID, st, p, next[0], err), next[1:]
			cb.StepStarted(event.StepLLM, p.model)
			st.stepStart = true
			reply, err = r.complete(ctx, turn.RunID, p, msgs, st, len(next) > 0)
		}
		if err != nil {
			return result(err)
		}
		cb.StepCompleted(event.StepLLM, p.model)
		if len(reply.toolCalls) == 0 {
			// A message steered in during the final answer gets one more
			// call (when the budget allows; otherwise the engine queues it).
			if step < r.maxSteps {
				msgs = append(msgs, chatMessage{Role: "assistant", Content: ptr(reply.text)})
				if steered() {
					continue
				}
			}
			return result(nil)
		}
		if step == r.maxSteps {
			break
		}
		calls := make([]chatToolCall, len(reply.toolCalls))
		for i, c := range reply.toolCalls {
			calls[i] = chatToolCall{ID: c.id, Type: "function", Function: chatFunction{Name: c.name, Arguments: c.args}}
		}
		am := chatMessage{Role: "assistant", ToolCalls: calls}
		if reply.text != "" {
			am.Content = ptr(reply.text)
		}
		msgs = append(msgs, am)
		for _, c := range reply.toolCalls {
			name := stepName(c.name)
			// The wait for approval is not part of the tool's step: the
			// step brackets the run only, and a denied call has none.
			denial, err := r.approve(ctx, turn, c.name, c.args)
			if err != nil { // only cancellation ends the turn
				return result(err)
			}
			out := denial
			if denial == "" {
				cb.StepStarted(event.StepTool, name)
				st.toolRan = true
				out, err = r.callTool(ctx, c.name, c.args)
				if err != nil {
					return result(err)
				}
				cb.StepCompleted(event.StepTool, name)
			}
			msgs = append(msgs, chatMessage{Role: "tool", ToolCallID: c.id, Content: ptr(out)})
		}
	}
	return result(&failure{
		user:  fmt.Sprintf("The agent stopped after %d model calls without a final answer (agents.openai.maxSteps).", r.maxSteps),
		cause: ErrMaxSteps,
	})
}

// switchProvider moves a replay-safe turn from provider from, whose call
// failed with err, to provider to: the person reads one notice, the trace
// and the journal get the engine's Fallback record, and the liveness window
// starts afresh for to (the switch is progress). It returns to.
func (r *Runner) switchProvider(runID string, st *turnState, from, to *provider, err error) *provider {
	timedOut := errors.Is(err, ErrIdleTimeout) || errors.Is(err, ErrBreakerOpen)
	r.log.Warn("openai: model call failed before any reply; switching provider", "run_id", runID,
		"from", from.model, "to", to.model, "timed_out", timedOut, "err", redact(err.Error(), from.apiKey))
	if fr, ok := st.cb.(runner.FallbackReporter); ok {
		fr.Fallback(from.model, to.model)
	}
	st.cb.Heartbeat()
	st.notice(messages.ProviderSwitched(from.model, to.model, timedOut))
	return to
}

// The tool results of calls the person did not allow.
const (
	DeniedResult     = "The user denied this tool call."
	TimedOutResult   = "No answer in time: the tool call was denied."
	NoApproverResult = "Nobody could be asked for approval: the tool call was denied."
)

// maxApprovalDetail bounds the arguments shown in an approval question.
const maxApprovalDetail = 1000

// approve asks the person before a call of a tool marked requireApproval.
// It returns "" when the call may run (also when it needs no approval, or
// cannot run anyway: an unknown tool, arguments that are not JSON), else the
// result the model gets instead; only cancellation of ctx is an error.
func (r *Runner) approve(ctx context.Context, turn runner.Turn, name, args string) (string, error) {
	t, ok := r.toolByName[name]
	if !ok || !t.approve || (strings.TrimSpace(args) != "" && !json.Valid([]byte(args))) {
		return "", nil
	}
	ans, err := turn.Ask(ctx, runner.Question{Title: "Run tool " + name, Detail: cutText(args, maxApprovalDetail), Tool: name})
	switch {
	case ctx.Err() != nil:
		return "", ctx.Err()
	case err != nil:
		r.log.Warn("openai: tool call approval could not be asked; denied", "run_id", turn.RunID, "tool", name, "err", err)
		return NoApproverResult, nil
	case ans.Allowed():
		r.log.Info("openai: tool call allowed", "run_id", turn.RunID, "tool", name, "by", ans.By)
		return "", nil
	case ans.Outcome == runner.TimedOut:
		r.log.Info("openai: tool call denied: no answer in time", "run_id", turn.RunID, "tool", name)
		return TimedOutResult, nil
	}
	r.log.Info("openai: tool call denied", "run_id", turn.RunID, "tool", name, "by", ans.By, "option", ans.OptionID)
	return DeniedResult, nil
}

// cutText shortens s to at most n bytes at a rune boundary, marking the cut.
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// callTool runs one tool call. A tool's own failure becomes text for the
// model; only cancellation of ctx is returned as an error.
func (r *Runner) callTool(ctx context.Context, name, args string) (string, error) {
	t, ok := r.toolByName[name]
	if !ok {
		return fmt.Sprintf("error: unknown tool %q", stepName(name)), nil
	}
	raw := json.RawMessage(args)
	if strings.TrimSpace(args) == "" {
		raw = json.RawMessage("{}")
	}
	if !json.Valid(raw) {
		return "error: the arguments are not valid JSON", nil
	}
	out, err := t.run(ctx, raw)
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	if err != nil {
		return "error: " + err.Error(), nil
	}
	return out, nil
}

// stepName bounds a model-chosen tool name for display.
func stepName(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	if s == "" {
		return "unnamed"
	}
	return s
}

func ptr[T any](v T) *T { return &v }
