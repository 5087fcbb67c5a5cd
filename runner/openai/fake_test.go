package openai

// Test doubles: a scripted OpenAI-compatible server, an in-memory transport
// that serves it inside a synctest bubble, and a callback recorder.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"

	"github.com/turnguard/turnguard/internal/testlog"
)

// fakeLLM answers request i with handlers[i]; the last handler repeats.
type fakeLLM struct {
	t        *testing.T
	mu       sync.Mutex
	handlers []http.HandlerFunc
	reqs     []seenRequest
}

type seenRequest struct {
	at   time.Time
	auth string
	body chatRequest
}

func newFake(t *testing.T, handlers ...http.HandlerFunc) *fakeLLM {
	return &fakeLLM{t: t, handlers: handlers}
}

func (f *fakeLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		f.t.Errorf("fake LLM: unexpected %s %s", r.Method, r.URL.Path)
	}
	var body chatRequest
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		f.t.Errorf("fake LLM: request body: %v", err)
	}
	f.mu.Lock()
	i := len(f.reqs)
	f.reqs = append(f.reqs, seenRequest{at: time.Now(), auth: r.Header.Get("Authorization"), body: body})
	h := f.handlers[min(i, len(f.handlers)-1)]
	f.mu.Unlock()
	h(w, r)
}

// setHandlers replaces the script; requests are counted from now on.
func (f *fakeLLM) setHandlers(h ...http.HandlerFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handlers = h
	f.reqs = nil
}

func (f *fakeLLM) requests() []seenRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

// gaps returns the time between successive requests.
func (f *fakeLLM) gaps() []time.Duration {
	var out []time.Duration
	reqs := f.requests()
	for i := 1; i < len(reqs); i++ {
		out = append(out, reqs[i].at.Sub(reqs[i-1].at))
	}
	return out
}

// Handlers.

func sseHeader(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
}

func writeEvents(w http.ResponseWriter, events []string) {
	for _, e := range events {
		fmt.Fprintf(w, "data: %s\n\n", e)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
}

// stream answers with the events, then [DONE].
func stream(events ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sseHeader(w)
		writeEvents(w, append(events, "[DONE]"))
	}
}

// answer streams the text pieces as a final answer.
func answer(pieces ...string) http.HandlerFunc {
	var evs []string
	for _, p := range pieces {
		evs = append(evs, textChunk(p))
	}
	return stream(append(evs, finishChunk("stop"))...)
}

// stallAfter sends the events, then nothing until the request is cancelled.
func stallAfter(events ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sseHeader(w)
		writeEvents(w, events)
		<-r.Context().Done()
	}
}

// stallBeforeHeaders sends nothing at all until the request is cancelled.
func stallBeforeHeaders() http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
}

func status(code int, header map[string]string, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
}

// Chunks in the shape OpenAI streams them.

func chunkJSON(delta map[string]any, finish any) string {
	b, _ := json.Marshal(map[string]any{
		"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 946684800, "model": "test-model",
		"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}},
	})
	return string(b)
}

func textChunk(s string) string { return chunkJSON(map[string]any{"content": s}, nil) }

func finishChunk(reason string) string { return chunkJSON(map[string]any{}, reason) }

func toolStartChunk(index int, id, name string) string {
	return chunkJSON(map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
		"index": index, "id": id, "type": "function", "function": map[string]any{"name": name, "arguments": ""},
	}}}, nil)
}

func toolArgsChunk(index int, fragment string) string {
	return chunkJSON(map[string]any{"tool_calls": []any{map[string]any{
		"index": index, "function": map[string]any{"arguments": fragment},
	}}}, nil)
}

// callTool streams one complete tool call (arguments in one piece).
func callTool(id, name, args string) http.HandlerFunc {
	return stream(toolStartChunk(0, id, name), toolArgsChunk(0, args), finishChunk("tool_calls"))
}

// pipeTransport serves a handler in memory: no sockets, so a stalled stream
// is durably blocked and a synctest bubble's clock can run the idle timer.
type pipeTransport struct{ h http.Handler }

func (p pipeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, pw: pw, ready: make(chan struct{})}
	stop := context.AfterFunc(ctx, func() { pw.CloseWithError(ctx.Err()) })
	go func() {
		defer stop()
		p.h.ServeHTTP(w, req)
		w.WriteHeader(http.StatusOK)
		pw.Close()
	}()
	select {
	case <-w.ready:
		return &http.Response{
			Status: strconv.Itoa(w.status) + " " + http.StatusText(w.status), StatusCode: w.status,
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: w.sent, Body: pr, ContentLength: -1, Request: req,
		}, nil
	case <-ctx.Done():
		pr.CloseWithError(ctx.Err())
		return nil, ctx.Err()
	}
}

type pipeWriter struct {
	header http.Header
	sent   http.Header
	status int
	pw     *io.PipeWriter
	once   sync.Once
	ready  chan struct{}
}

func (w *pipeWriter) Header() http.Header { return w.header }
func (w *pipeWriter) WriteHeader(code int) {
	w.once.Do(func() {
		w.status, w.sent = code, w.header.Clone()
		close(w.ready)
	})
}
func (w *pipeWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(b)
}
func (w *pipeWriter) Flush() {}

// recorder records callbacks as readable strings.
type recorder struct {
	mu  sync.Mutex
	evs []string
	ch  chan string // every event, for tests that wait in real time
}

func newRecorder() *recorder { return &recorder{ch: make(chan string, 1000)} }

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.evs = append(r.evs, s)
	r.mu.Unlock()
	select {
	case r.ch <- s:
	default:
	}
}

func (r *recorder) StepStarted(kind, name string)   { r.add("start " + kind + " " + name) }
func (r *recorder) StepCompleted(kind, name string) { r.add("done " + kind + " " + name) }
func (r *recorder) Delta(text string)               { r.add("delta " + strconv.Quote(text)) }
func (r *recorder) Heartbeat()                      { r.add("heartbeat") }
func (r *recorder) Pause(reason string)             { r.add("pause " + reason) }
func (r *recorder) Resume()                         { r.add("resume") }

func (r *recorder) events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

type logBuffer = testlog.Buffer

const testModel = "test-model"

// newTestRunner returns a runner talking to h in memory. cfg's model and
// base URL default to test values.
func newTestRunner(t *testing.T, cfg config.OpenAI, h http.Handler, opts ...Option) (*Runner, *logBuffer) {
	t.Helper()
	if cfg.BaseURL == "" {
		cfg.BaseURL = "http://llm.test/v1"
	}
	if cfg.Model == "" {
		cfg.Model = testModel
	}
	logs := &logBuffer{}
	opts = append([]Option{
		WithHTTPClient(&http.Client{Transport: pipeTransport{h}}),
		WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))),
	}, opts...)
	r, err := New(cfg, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r, logs
}
