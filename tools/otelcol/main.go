// Command otelcol is the OTLP receiver the tracing end-to-end test exports
// to: the OpenTelemetry Collector's own otlpreceiver (gRPC and HTTP), whose
// trace batches are written to -out as OTLP JSON, one batch a line (the
// format of the Collector's file exporter). It is a module of its own, so
// the gateway's go.mod does not carry the Collector's dependencies; the
// Makefile builds it to bin/otelcol.
//
//	otelcol -grpc 127.0.0.1:4317 -http 127.0.0.1:4318 -out traces.jsonl
//
// It runs until SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
)

func main() {
	grpcAddr := flag.String("grpc", "127.0.0.1:4317", "OTLP/gRPC listen `address`")
	httpAddr := flag.String("http", "127.0.0.1:4318", "OTLP/HTTP listen `address`")
	out := flag.String("out", "traces.jsonl", "`file` the trace batches are appended to, as OTLP JSON lines")
	flag.Parse()
	if err := run(*grpcAddr, *httpAddr, *out); err != nil {
		fmt.Fprintln(os.Stderr, "otelcol:", err)
		os.Exit(1)
	}
}

func run(grpcAddr, httpAddr, out string) error {
	f, err := os.OpenFile(out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	var mu sync.Mutex
	var enc ptrace.JSONMarshaler
	sink, err := consumer.NewTraces(func(_ context.Context, td ptrace.Traces) error {
		b, err := enc.MarshalTraces(td)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if _, err := f.Write(append(b, '\n')); err != nil {
			return err
		}
		return f.Sync()
	})
	if err != nil {
		return err
	}

	factory := otlpreceiver.NewFactory()
	cfg := factory.CreateDefaultConfig()
	conf := confmap.NewFromStringMap(map[string]any{"protocols": map[string]any{
		"grpc": map[string]any{"endpoint": grpcAddr},
		"http": map[string]any{"endpoint": httpAddr},
	}})
	if err := conf.Unmarshal(cfg); err != nil {
		return fmt.Errorf("receiver config: %w", err)
	}
	ctx := context.Background()
	rcv, err := factory.CreateTraces(ctx, receivertest.NewNopSettings(factory.Type()), cfg, sink)
	if err != nil {
		return fmt.Errorf("receiver: %w", err)
	}
	if err := rcv.Start(ctx, componenttest.NewNopHost()); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	fmt.Fprintf(os.Stderr, "otelcol: receiving OTLP on grpc %s and http %s, writing %s\n", grpcAddr, httpAddr, out)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	return rcv.Shutdown(ctx)
}
