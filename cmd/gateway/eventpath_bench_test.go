package main

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/turnguard/turnguard/channels/ws"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/gateway/abort"
	"github.com/turnguard/turnguard/ops/tracing"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/store"
)

// eventPathSizes are the live-turn counts of BenchmarkEventPath.
var eventPathSizes = []int{1, 10_000, 100_000}

// pathEnv is a gateway wired as start wires it — store recorder on a real
// SQLite file, engine, WebSocket server, metrics and alerts on the bus —
// with n live turns on a runner that only holds its callbacks. Telegram is
// off (as in the default configuration). Nobody watches any session.
type pathEnv struct {
	a    *app
	cbs  []runner.Callbacks
	runs []*abort.Run
}

func newPathEnv(b *testing.B, n int) *pathEnv { return newPathEnvTraced(b, n, tracingOff) }

// traceMode is how BenchmarkEventPathTracing's gateway traces.
type traceMode string

const (
	tracingOff       traceMode = "off"       // no tracer built or subscribed (the default)
	tracingUnsampled traceMode = "unsampled" // subscribed, telemetry.sampleRatio 0: the sampler drops every turn
	tracingSampled   traceMode = "sampled"   // subscribed, telemetry.sampleRatio 1: every turn recorded
)

// newPathEnvTraced is newPathEnv, with the tracer subscribed as start does
// when telemetry.otlp.endpoint is set (spans go through the batch processor
// to an exporter that discards them) unless mode is tracingOff.
func newPathEnvTraced(b *testing.B, n int, mode traceMode) *pathEnv {
	b.Helper()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := config.Default()
	cfg.Server.MaxSessions = max(cfg.Server.MaxSessions, 2*n)
	a := &app{log: log, cfg: config.NewSource(cfg), serveErr: make(chan error, 1)}
	var err error
	a.store, err = store.Open(ctx, filepath.Join(b.TempDir(), "turnguard.db"), store.Options{
		QueueSize: cfg.Store.QueueSize, Logger: log, Retention: retention(cfg.Store.Retention)})
	if err != nil {
		b.Fatal(err)
	}
	got := make(chan runner.Callbacks, 1024)
	hold := runner.Func(func(ctx context.Context, _ runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		cb.StepStarted("tool", "web_search")
		got <- cb
		<-ctx.Done()
		return runner.Result{}, ctx.Err()
	})
	a.ops = newOps(a.cfg, log)
	a.eng, err = gateway.New(gateway.Options{Config: a.cfg, Log: log, History: storeHistory(a.store),
		Runners:  map[string]runner.Runner{"demo": hold, "openai": hold, "exec": hold},
		Observer: a.ops.observer(), StuckRuns: a.ops.stuckRuns, Admit: a.store.Health})
	if err != nil {
		b.Fatal(err)
	}
	a.unsub = a.eng.Bus().Subscribe("", a.store.Handle)
	if mode != tracingOff {
		tel := cfg.Telemetry
		tel.SampleRatio = 1
		if mode == tracingUnsampled {
			tel.SampleRatio = 0
		}
		a.tracer, err = tracing.New(ctx, tracing.Options{Telemetry: tel, Exporter: tracetest.NewNoopExporter(), Batch: true, Log: log})
		if err != nil {
			b.Fatal(err)
		}
		a.unsubTrace = a.eng.Bus().Subscribe("", a.tracer.Handle)
	}
	a.eng.Start(ctx)
	a.ws = ws.NewServer(a.eng, a.cfg, ws.Options{Version: "bench", Log: log})
	if err := a.ops.wire(ctx, a, nil); err != nil {
		b.Fatal(err)
	}

	e := &pathEnv{a: a, cbs: make([]runner.Callbacks, 0, n), runs: make([]*abort.Run, 0, n)}
	for i := range n {
		key := "agent:main:bench-" + strconv.Itoa(i)
		if _, err := a.eng.Send(ctx, gateway.SendRequest{SessionKey: key, Channel: config.ChannelWS, Text: "hi"}); err != nil {
			b.Fatal(err)
		}
		e.cbs = append(e.cbs, <-got)
		run, ok := a.eng.Active(key)
		if !ok {
			b.Fatalf("turn %d is not live", i)
		}
		e.runs = append(e.runs, run)
	}
	// Let the writer catch up with the set-up, so the measurement starts
	// with an empty store queue.
	fctx, cancel := context.WithTimeout(ctx, time.Minute) // real time: the writer writes a real file
	defer cancel()
	if err := a.store.Flush(fctx); err != nil {
		b.Fatal(err)
	}
	return e
}

// close stops the gateway as shutdown does (without the HTTP server).
func (e *pathEnv) close() {
	ctx := context.Background()
	e.a.eng.Shutdown(ctx)
	wctx, cancel := context.WithTimeout(ctx, wsShutdownWait)
	e.a.ws.Shutdown(wctx)
	cancel()
	e.a.close()
}

// BenchmarkEventPath measures one step callback of a runner through the
// whole event path: the registry, Run.Publish, Engine.publish, the bus and
// every subscriber the gateway has (store recorder, metrics, alerts, the
// WebSocket server), for a session nobody watches, at 1, 10K and 100K live
// turns, beside the registry's own work in the same process (registry):
// Run.StepCompleted alone, as gateway/abort's BenchmarkStepCompleted.
// Each op goes to the next turn, round robin.
//
// Beside ns/op (wall time, which on a shared machine includes the time the
// publisher waited for a core) it reports cpu-ns/op: the CPU time of the
// publishing thread per op (Linux; the goroutine is locked to its thread),
// what the path costs its caller whatever else runs.
func BenchmarkEventPath(b *testing.B) {
	for _, n := range eventPathSizes {
		if n > 10_000 && testing.Short() {
			continue
		}
		e := newPathEnv(b, n)
		b.Run("registry/turns="+strconv.Itoa(n), func(b *testing.B) {
			pathLoop(b, n, func(i int) { e.runs[i].StepCompleted("tool", "web_search") })
		})
		b.Run("StepCompleted/turns="+strconv.Itoa(n), func(b *testing.B) {
			pathLoop(b, n, func(i int) { e.cbs[i].StepCompleted("tool", "web_search") })
		})
		b.Run("StepStarted/turns="+strconv.Itoa(n), func(b *testing.B) {
			pathLoop(b, n, func(i int) { e.cbs[i].StepStarted("tool", "web_search") })
		})
		e.close()
	}
}

// BenchmarkEventPathTracing is BenchmarkEventPath's step (StepStarted then
// StepCompleted: one step span opened and ended) with tracing off — the
// default, no tracer subscribed — on with turns the sampler drops, and on
// with every turn sampled, at 1 and 10K live turns, in one run
// (docs/performance.md, "Tracing").
func BenchmarkEventPathTracing(b *testing.B) {
	for _, n := range []int{1, 10_000} {
		for _, mode := range []traceMode{tracingOff, tracingUnsampled, tracingSampled} {
			e := newPathEnvTraced(b, n, mode)
			b.Run("tracing="+string(mode)+"/turns="+strconv.Itoa(n), func(b *testing.B) {
				pathLoop(b, n, func(i int) {
					e.cbs[i].StepStarted("tool", "web_search")
					e.cbs[i].StepCompleted("tool", "web_search")
				})
			})
			e.close()
		}
	}
}

// pathLoop runs op round robin over the n turns, once per iteration, and
// reports the publishing thread's CPU time per op (cpu-ns/op).
func pathLoop(b *testing.B, n int, op func(i int)) {
	b.ReportAllocs()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0, ok := threadCPU()
	ops, i := 0, 0
	for b.Loop() {
		op(i)
		if i++; i == n {
			i = 0
		}
		ops++
	}
	if cpu1, ok1 := threadCPU(); ok && ok1 && ops > 0 {
		b.ReportMetric(float64(cpu1-cpu0)/float64(ops), "cpu-ns/op")
	}
}
