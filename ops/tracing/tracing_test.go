package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/internal/faketime"
	"github.com/turnguard/turnguard/ops/tracing"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
)

// op is one thing a scripted runner does after waiting wait (on the
// bubble's clock).
type op struct {
	wait time.Duration
	do   func(runner.Callbacks)
}

// script does ops in order; then it returns end (nil: a final answer), or
// with hang it waits for its turn to be stopped (ignore: and goes on
// ignoring it for a minute, as a stuck tool would).
func script(end error, hang, ignore bool, ops ...op) runner.Runner {
	return runner.Func(func(ctx context.Context, _ runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		for _, o := range ops {
			select {
			case <-ctx.Done():
				return runner.Result{}, ctx.Err()
			case <-time.After(o.wait):
			}
			o.do(cb)
		}
		if ignore {
			<-time.After(time.Minute) // the bubble's clock
			return runner.Result{}, ctx.Err()
		}
		if hang {
			<-ctx.Done()
			return runner.Result{}, ctx.Err()
		}
		return runner.Result{Text: "done"}, end
	})
}

func start(kind, name string) op {
	return op{time.Second, func(cb runner.Callbacks) { cb.StepStarted(kind, name) }}
}
func done(kind, name string) op {
	return op{time.Second, func(cb runner.Callbacks) { cb.StepCompleted(kind, name) }}
}
func pauseFor(d time.Duration) []op {
	return []op{{0, func(cb runner.Callbacks) { cb.Pause("waiting for approval") }}, {d, func(cb runner.Callbacks) { cb.Resume() }}}
}

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// traced is an engine whose events a Tracer turns into spans kept in memory.
type traced struct {
	eng *gateway.Engine
	exp *tracetest.InMemoryExporter
	log *lockedBuffer
}

func newTraced(t *testing.T, rn runner.Runner, adjust func(*config.Config)) *traced {
	t.Helper()
	c := config.Default()
	c.Agents.Defaults.Runner = config.RunnerDemo
	c.Agents.Defaults.StepTimeoutSeconds = secs(5)
	c.Agents.Defaults.TimeoutSeconds = secs(60)
	c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(0)
	c.Agents.Defaults.AbortGraceSeconds = secs(2)
	if adjust != nil {
		adjust(c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	buf := &lockedBuffer{}
	log := slog.New(tracing.LogHandler(slog.NewJSONHandler(buf, nil)))
	exp := tracetest.NewInMemoryExporter()
	tr, err := tracing.New(context.Background(), tracing.Options{Telemetry: c.Telemetry, Exporter: exp, Version: "test", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := gateway.New(gateway.Options{Config: config.NewSource(c), Log: log,
		Runners: map[string]runner.Runner{config.RunnerDemo: rn}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	eng.Start(ctx)
	unsub := eng.Bus().Subscribe("", tr.Handle)
	t.Cleanup(func() {
		eng.Shutdown(context.Background())
		unsub()
		cancel()
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return &traced{eng: eng, exp: exp, log: buf}
}

func secs(v float64) *float64 { return &v }

func (v *traced) send(t *testing.T, key, id string) {
	t.Helper()
	if _, err := v.eng.Send(context.Background(), gateway.SendRequest{SessionKey: key, Channel: "ws", RunID: id, Text: "hi"}); err != nil {
		t.Fatal(err)
	}
}

// tree is the exported spans of one trace: the root and its children, oldest first.
type tree struct {
	root     tracetest.SpanStub
	children []tracetest.SpanStub
}

func spansOf(t *testing.T, exp *tracetest.InMemoryExporter, runID string) tree {
	t.Helper()
	var tr tree
	found := false
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID() != tracing.TraceID(runID) {
			continue
		}
		if !s.Parent.IsValid() {
			tr.root, found = s, true
		} else {
			tr.children = append(tr.children, s)
		}
	}
	if !found {
		t.Fatalf("no root span for run %s among %d spans", runID, len(exp.GetSpans()))
	}
	for _, c := range tr.children {
		if c.Parent.SpanID() != tr.root.SpanContext.SpanID() {
			t.Errorf("span %s is not a child of the root", c.Name)
		}
	}
	return tr
}

func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value
		}
	}
	return attribute.Value{}
}

func eventNames(s tracetest.SpanStub) []string {
	var out []string
	for _, e := range s.Events {
		out = append(out, e.Name)
	}
	return out
}

// TestTurnTrace drives a real engine through turns that end every way and
// checks each turn's span tree.
func TestTurnTrace(t *testing.T) {
	tests := []struct {
		name    string
		rn      runner.Runner
		adjust  func(*config.Config)
		act     func(t *testing.T, v *traced) // after the send
		reason  event.StopReason
		status  codes.Code
		steps   []string // child spans: name/kind
		paused  map[string]int64
		events  []string // root events, in order
		elapsed time.Duration
	}{
		{
			name: "finished", reason: event.ReasonStop, status: codes.Unset,
			rn: script(nil, false, false, append(append([]op{start("llm", ""), done("llm", ""), start("tool", "ask_human")},
				pauseFor(3*time.Second)...), done("tool", "ask_human"))...),
			steps:  []string{"llm/llm", "ask_human/tool"},
			paused: map[string]int64{"ask_human": 3000, "llm": 0},
			events: []string{"paused", "resumed"},
		},
		{
			name: "step timeout", reason: event.ReasonStepTimeout, status: codes.Error,
			rn:     script(nil, true, false, start("tool", "web_search")),
			steps:  []string{"web_search/tool"},
			events: []string{"aborted"},
		},
		{
			name: "wall clock", reason: event.ReasonTimeout, status: codes.Error,
			adjust: func(c *config.Config) { c.Agents.Defaults.TimeoutSeconds = secs(3) },
			rn:     script(nil, true, false),
			events: []string{"budget_warning", "aborted"}, // the default budgetWarningRatio 0.8
		},
		{
			name: "progress then user stop", reason: event.ReasonUser, status: codes.Unset,
			adjust: func(c *config.Config) {
				c.Agents.Defaults.StepTimeoutSeconds = secs(30)
				c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(5)
			},
			rn: script(nil, true, false, start("tool", "build")),
			act: func(t *testing.T, v *traced) {
				faketime.Advance(10 * time.Second)
				if _, err := v.eng.Abort(context.Background(), "s", "run-1", event.ReasonUser, "", true); err != nil {
					t.Fatal(err)
				}
			},
			steps:  []string{"build/tool"},
			events: []string{"progress", "aborted"},
		},
		{
			name: "runner error", reason: event.ReasonError, status: codes.Error,
			rn:    script(errors.New("boom"), false, false, start("tool", "x"), done("tool", "x")),
			steps: []string{"x/tool"},
		},
		{
			name: "force finalized", reason: event.ReasonStepTimeout, status: codes.Error,
			rn:     script(nil, false, true, start("tool", "stuck")),
			steps:  []string{"stuck/tool", "force_finalized/"},
			events: []string{"aborted"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				v := newTraced(t, tc.rn, tc.adjust)
				v.send(t, "s", "run-1")
				if tc.act != nil {
					tc.act(t, v)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				if _, ok := v.eng.Wait(ctx, "run-1"); !ok {
					t.Fatal("the turn did not end")
				}
				faketime.Advance(time.Minute) // a force-finalization, a stuck runner's return
				synctest.Wait()

				tr := spansOf(t, v.exp, "run-1")
				r := tr.root
				if r.Name != "turn" || r.Status.Code != tc.status {
					t.Errorf("root %q status %v, want turn %v", r.Name, r.Status, tc.status)
				}
				for k, want := range map[string]string{tracing.AttrRunID: "run-1", tracing.AttrSession: "s",
					tracing.AttrChannel: "ws", tracing.AttrRunner: config.RunnerDemo, tracing.AttrStopReason: string(tc.reason)} {
					if got := attr(r, k).AsString(); got != want {
						t.Errorf("root %s = %q, want %q", k, got, want)
					}
				}
				if got := attr(r, tracing.AttrQueuedMs).AsInt64(); got != 0 {
					t.Errorf("queue wait %d ms, want 0", got)
				}
				var steps []string
				for _, c := range tr.children {
					steps = append(steps, c.Name+"/"+attr(c, tracing.AttrStepKind).AsString())
					if want, ok := tc.paused[c.Name]; ok && attr(c, tracing.AttrPausedMs).AsInt64() != want {
						t.Errorf("step %s paused %d ms, want %d", c.Name, attr(c, tracing.AttrPausedMs).AsInt64(), want)
					}
					if c.EndTime.Before(c.StartTime) || c.StartTime.Before(r.StartTime) {
						t.Errorf("step %s from %v to %v, turn from %v", c.Name, c.StartTime, c.EndTime, r.StartTime)
					}
				}
				if strings.Join(steps, " ") != strings.Join(tc.steps, " ") {
					t.Errorf("steps %v, want %v", steps, tc.steps)
				}
				if got := strings.Join(eventNames(r), " "); got != strings.Join(tc.events, " ") {
					t.Errorf("root events %q, want %q", got, strings.Join(tc.events, " "))
				}
				if tc.reason == event.ReasonError {
					id := attr(r, tracing.AttrErrorID).AsString()
					if id == "" {
						t.Error("no error id on the failed turn")
					}
					// The log line of the failure carries the turn's trace id.
					line := logLine(t, v.log.String(), "turn failed")
					if line["trace_id"] != tracing.TraceIDString("run-1") || line["errorId"] != id {
						t.Errorf("log line %v, want trace_id %s", line, tracing.TraceIDString("run-1"))
					}
				}
			})
		})
	}
}

// logLine finds the JSON log line with message msg.
func logLine(t *testing.T, log, msg string) map[string]any {
	t.Helper()
	for _, l := range strings.Split(log, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg {
			return m
		}
	}
	t.Fatalf("no log line %q in:\n%s", msg, log)
	return nil
}

// TestQueueWait: a message that waited for its session's running turn
// starts a turn whose root carries the wait.
func TestQueueWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newTraced(t, script(nil, false, false, op{8 * time.Second, func(runner.Callbacks) {}}),
			func(c *config.Config) { c.Agents.Defaults.StepTimeoutSeconds = secs(30) })
		v.send(t, "s", "first")
		faketime.Advance(3 * time.Second)
		v.send(t, "s", "second") // queued behind first for 5s
		ctx := context.Background()
		for _, id := range []string{"first", "second"} {
			if _, ok := v.eng.Wait(ctx, id); !ok {
				t.Fatalf("%s did not end", id)
			}
		}
		synctest.Wait()
		if got := attr(spansOf(t, v.exp, "second").root, tracing.AttrQueuedMs).AsInt64(); got != 5000 {
			t.Errorf("queue wait %d ms, want 5000", got)
		}
		if got := attr(spansOf(t, v.exp, "first").root, tracing.AttrQueuedMs).AsInt64(); got != 0 {
			t.Errorf("first turn's queue wait %d ms, want 0", got)
		}
	})
}

// TestApprovalEvents: a turn that asks the person (the demo runner's
// ask:deploy, answered 2s later through the engine) has the question and
// its settlement as root events, and the wait counts as paused time of the
// root, like the engine's liveness clock.
func TestApprovalEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newTraced(t, demo.New(), nil)
		if _, err := v.eng.Send(context.Background(), gateway.SendRequest{SessionKey: "s", Channel: "ws", RunID: "run-1",
			Text: "/steps ask:deploy say:Finished"}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		open := v.eng.PendingApprovals("s")
		if len(open) != 1 {
			t.Fatalf("open questions %+v", open)
		}
		faketime.Advance(2 * time.Second)
		if _, err := v.eng.Resolve(context.Background(), gateway.ResolveRequest{ApprovalID: open[0].ID, OptionID: "allow",
			SessionKey: "s", By: "alice"}); err != nil {
			t.Fatal(err)
		}
		if out, _ := v.eng.Wait(context.Background(), "run-1"); out.Text != "deploy ran (allowed). Finished" {
			t.Fatalf("outcome %+v", out)
		}
		synctest.Wait()
		tr := spansOf(t, v.exp, "run-1")
		if got := strings.Join(eventNames(tr.root), " "); got != "approval_requested approval_resolved" {
			t.Errorf("root events %q", got)
		}
		if got := attr(tr.root, tracing.AttrPausedMs).AsInt64(); got != 2000 {
			t.Errorf("turn paused %d ms, want 2000", got)
		}
		res := tr.root.Events[1]
		want := []attribute.KeyValue{attribute.String(tracing.AttrApprovalID, open[0].ID), attribute.String(tracing.AttrTool, "deploy"),
			attribute.String(tracing.AttrOutcome, "selected"), attribute.String(tracing.AttrOptionKind, "allow_once"),
			attribute.String(tracing.AttrBy, "alice")}
		for i, kv := range want {
			if i >= len(res.Attributes) || res.Attributes[i] != kv {
				t.Errorf("approval_resolved attributes %v, want %v", res.Attributes, want)
				break
			}
		}
		if len(tr.children) != 1 || tr.children[0].Name != "deploy" {
			t.Errorf("steps %+v, want the allowed deploy", tr.children)
		}
	})
}

// TestSampling: sampleRatio 0 records nothing, and the trace ids stay the
// turns' own.
func TestSampling(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := config.Default().Telemetry
	tel.SampleRatio = 0
	tr, err := tracing.New(context.Background(), tracing.Options{Telemetry: tel, Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	locals := &event.Locals{}
	for _, k := range []event.Kind{event.TurnStarted, event.Finished} {
		tr.Handle(event.Event{Kind: k, RunID: "r", Locals: locals, Time: time.Now(), StopReason: event.ReasonStop})
	}
	if n := len(exp.GetSpans()); n != 0 {
		t.Errorf("%d spans exported at ratio 0", n)
	}
}

// TestUnsampledStepAllocatesNothing: a turn the sampler drops keeps no
// state and starts no span, so each of its per-step events (a step started
// and completed, a pause, a progress notice) costs the tracer no allocation;
// the same step of a sampled turn allocates (the harness measures).
func TestUnsampledStepAllocatesNothing(t *testing.T) {
	now := time.Now()
	step := event.Step{Kind: event.StepTool, Name: "web_search", Seq: 1, StartedAt: now}
	for _, tc := range []struct {
		name    string
		ratio   float64
		wantNil bool // zero allocations per step
	}{
		{"unsampled", 0, true},
		{"sampled", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tel := config.Default().Telemetry
			tel.SampleRatio = tc.ratio
			tr, err := tracing.New(context.Background(), tracing.Options{Telemetry: tel, Exporter: tracetest.NewNoopExporter()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
			locals := &event.Locals{}
			ev := func(k event.Kind) event.Event {
				return event.Event{Kind: k, RunID: "run-" + tc.name, SessionKey: "agent:main:s", Channel: "ws",
					Locals: locals, Time: now, Step: step, Elapsed: time.Second, Text: "waiting"}
			}
			tr.Handle(ev(event.TurnStarted))
			perStep := []event.Event{ev(event.StepStarted), ev(event.Progress), ev(event.Paused), ev(event.Resumed),
				ev(event.Recovered), ev(event.StepCompleted)}
			allocs := testing.AllocsPerRun(1000, func() {
				for _, e := range perStep {
					tr.Handle(e)
				}
			})
			tr.Handle(ev(event.Finished))
			if tc.wantNil && allocs != 0 {
				t.Errorf("%v allocations per step of an unsampled turn, want 0", allocs)
			}
			if !tc.wantNil && allocs == 0 {
				t.Error("a sampled turn's step allocated nothing: the measurement measures nothing")
			}
		})
	}
}

// TestTraceIDIsStable: a run id always names the same valid trace id, and
// different run ids different ones.
func TestTraceIDIsStable(t *testing.T) {
	a, b := tracing.TraceID("run-1"), tracing.TraceID("run-2")
	if !a.IsValid() || a != tracing.TraceID("run-1") || a == b || len(a.String()) != 32 {
		t.Errorf("trace ids %s %s", a, b)
	}
}

// TestLogHandler: a record about a run carries its trace id, whether the
// run id is in the record or added by With; others pass unchanged.
func TestLogHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(tracing.LogHandler(slog.NewJSONHandler(&buf, nil)))
	log.Info("a", "run", "r1")
	log.With("run", "r2").Info("b")
	log.Info("c", "session", "s")
	log.WithGroup("g").Info("d", "run", "r3")
	want := map[string]string{"a": tracing.TraceIDString("r1"), "b": tracing.TraceIDString("r2"), "c": "", "d": ""}
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		got, _ := m["trace_id"].(string)
		if got != want[m["msg"].(string)] {
			t.Errorf("%s: trace_id %q, want %q", m["msg"], got, want[m["msg"].(string)])
		}
	}
}

var _ sdktrace.SpanExporter = (*tracetest.InMemoryExporter)(nil)

// TestReceiverDownBlocksNothing: with nothing listening at the endpoint,
// handling a turn's events returns at once and Shutdown gives up within its
// context's time, for both protocols.
func TestReceiverDownBlocksNothing(t *testing.T) {
	for _, protocol := range []string{config.OTLPGRPC, config.OTLPHTTP} {
		t.Run(protocol, func(t *testing.T) {
			tel := config.Default().Telemetry
			tel.OTLP = config.TelemetryOTLP{Endpoint: "127.0.0.1:1", Protocol: protocol, Insecure: true}
			var logs lockedBuffer
			tr, err := tracing.New(context.Background(), tracing.Options{Telemetry: tel, Log: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			began := time.Now()
			locals := &event.Locals{}
			for _, k := range []event.Kind{event.TurnStarted, event.StepStarted, event.StepCompleted, event.Finished} {
				tr.Handle(event.Event{Kind: k, RunID: "r", Locals: locals, Time: time.Now(), StopReason: event.ReasonStop})
			}
			if d := time.Since(began); d > time.Second {
				t.Errorf("handling the events took %v", d)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second) // real time: a real exporter's bounded flush
			defer cancel()
			_ = tr.Shutdown(ctx) // fails or gives up: the receiver is down
			if d := time.Since(began); d > 3*time.Second {
				t.Errorf("shutdown took %v with the receiver down", d)
			}
		})
	}
}

// TestBudgetWarningEvent: the budget warning is a span event of the turn's
// root: how long was left and whether the runner took the gateway's note
// (the demo does, and wraps up).
func TestBudgetWarningEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newTraced(t, demo.New(), func(c *config.Config) {
			c.Agents.Defaults.TimeoutSeconds = secs(10)
			c.Agents.Defaults.StepTimeoutSeconds = secs(0)
		})
		if _, err := v.eng.Send(context.Background(), gateway.SendRequest{SessionKey: "s", Channel: "ws", RunID: "run-1",
			Text: "/steps build:9s deploy:hang say:Built"}); err != nil {
			t.Fatal(err)
		}
		out, _ := v.eng.Wait(context.Background(), "run-1")
		if out.StopReason != event.ReasonStop || !strings.HasSuffix(out.Text, "Built") {
			t.Fatalf("outcome %+v, want the demo to wrap up and finish", out)
		}
		synctest.Wait()
		tr := spansOf(t, v.exp, "run-1")
		if got := strings.Join(eventNames(tr.root), " "); got != "budget_warning" {
			t.Fatalf("root events %q, want budget_warning", got)
		}
		want := []attribute.KeyValue{attribute.String(tracing.AttrStepName, "build"), attribute.Int64(tracing.AttrElapsedMs, 8000),
			attribute.Int64(tracing.AttrLeftMs, 2000), attribute.Bool(tracing.AttrRunnerTold, true)}
		if got := tr.root.Events[0].Attributes; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("budget_warning attributes %v, want %v", got, want)
		}
	})
}

// TestFallbackEvent: a runner's move to another model provider
// (runner.FallbackReporter, as the openai runner reports it) is a span
// event on the turn's root, naming the failed step and the model the turn
// goes on with.
func TestFallbackEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rn := script(nil, false, false, start(event.StepLLM, "main-model"),
			op{time.Second, func(cb runner.Callbacks) { cb.(runner.FallbackReporter).Fallback("main-model", "backup-model") }},
			start(event.StepLLM, "backup-model"), done(event.StepLLM, "backup-model"))
		v := newTraced(t, rn, nil)
		v.send(t, "s", "run-1")
		if out, _ := v.eng.Wait(context.Background(), "run-1"); out.Text != "done" {
			t.Fatalf("outcome %+v", out)
		}
		synctest.Wait()
		tr := spansOf(t, v.exp, "run-1")
		if got := strings.Join(eventNames(tr.root), " "); got != "fallback" {
			t.Fatalf("root events %q, want one fallback", got)
		}
		ev := tr.root.Events[0]
		want := []attribute.KeyValue{attribute.String(tracing.AttrStepName, "main-model"), attribute.String(tracing.AttrFallbackTo, "backup-model")}
		if !slices.Equal(ev.Attributes, want) {
			t.Errorf("fallback attributes %v, want %v", ev.Attributes, want)
		}
		if len(tr.children) != 2 || tr.children[0].Name != "main-model" || tr.children[1].Name != "backup-model" {
			t.Errorf("steps %+v, want main-model then backup-model", tr.children)
		}
	})
}
