// Command gateway runs turnguard: it loads the configuration, opens the
// store, starts the turn engine with its runners, the channels (WebSocket
// protocol and web chat on one HTTP port; Telegram when enabled) and serves
// until SIGTERM or SIGINT.
//
// Usage:
//
//	gateway [-config FILE]          run (without -config: built-in defaults and GATEWAY_ variables)
//	gateway -check [-config FILE]   load and validate the configuration, report every problem, exit
//	                                (SIGINT/SIGTERM end it at once, exit status 1)
//	gateway -print-config [-config FILE]
//	                                print the effective configuration, one key a line, secrets
//	                                redacted, with each value's source (default, file, env GATEWAY_…)
//	gateway -version                print the version
//
// Logs go to stderr through log/slog: text by default, JSON when
// GATEWAY_LOG_FORMAT=json; GATEWAY_LOG_LEVEL is debug, info (default), warn
// or error. At start the gateway logs "listening" with the address it bound
// (addr) and the web chat URL (url).
//
// On Linux the process makes itself non-dumpable first (hideFromAgents), so
// that agents running as its user cannot read its /proc/<pid>/environ.
//
// Shutdown: the first SIGTERM/SIGINT stops accepting connections, aborts
// every running turn with stop reason "shutdown" (its user gets the
// configured shutdown message), waits up to abortGraceSeconds for the
// runners to return, closes client connections (1012, clients reconnect),
// flushes the store and exits 0. A second signal exits at once with status 1.
//
// Exit status: 0 after a clean run or a good -check, 1 when the gateway
// cannot start (or -check finds problems), 2 for bad command-line usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/turnguard/turnguard/config"
)

// version is the gateway's version; release builds set it with
// -ldflags "-X main.version=…".
var version = "0.1.0"

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	hideErr = hideFromAgents() // first, before any agent can start
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv, sig, os.Exit))
}

// hideErr is why main could not make the process non-dumpable (see
// hideFromAgents); run logs it. nil when it could, and under tests.
var hideErr error

// run is the whole program behind main, with its inputs injected: it returns
// the exit status. sig delivers shutdown signals; exit is called by a second
// signal, which must not wait for a graceful shutdown.
func run(args []string, stdout, stderr io.Writer, getenv func(string) string, sig <-chan os.Signal, exit func(int)) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "YAML configuration `file` (optional; GATEWAY_ environment variables override it)")
	check := fs.Bool("check", false, "load and validate the configuration, report every problem, and exit")
	showVersion := fs.Bool("version", false, "print the version and exit")
	printConfig := fs.Bool("print-config", false, "print the effective configuration (secrets redacted, each value's source: default, file or env) and exit")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: gateway [-config FILE] [-check | -print-config] [-version]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gateway: unexpected argument %q (flags: -config FILE, -check, -version)\n", fs.Arg(0))
		return exitUsage
	}
	if *showVersion {
		fmt.Fprintf(stdout, "turnguard gateway %s\n", version)
		return exitOK
	}

	if *check {
		// The check runs aside so that a signal ends it at once, even while
		// it waits on its file (a FIFO, a hung network mount).
		type result struct {
			report string
			ok     bool
		}
		checked := make(chan result, 1)
		go func() {
			report, ok := config.CheckReport(*cfgPath)
			checked <- result{report, ok}
		}()
		var res result
		select {
		case res = <-checked:
		case s := <-sig:
			fmt.Fprintf(stderr, "gateway: -check interrupted by signal %s; the configuration was not checked\n", s)
			return exitError
		}
		if !res.ok {
			fmt.Fprint(stderr, res.report)
			return exitError
		}
		fmt.Fprint(stdout, res.report)
		return exitOK
	}

	if *printConfig {
		cfg, err := config.Load(*cfgPath)
		if err != nil {
			fmt.Fprintf(stderr, "%v\n", err)
			return exitError
		}
		fmt.Fprint(stdout, cfg.PrintConfig())
		return exitOK
	}

	log, err := newLogger(stderr, getenv)
	if err != nil {
		fmt.Fprintf(stderr, "gateway: %v\n", err)
		return exitUsage
	}
	if hideErr != nil {
		log.Warn("agents running as the gateway's user may read its environment and memory", "error", hideErr)
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		log.Error("cannot start: invalid configuration", "error", err)
		return exitError
	}
	for _, w := range cfg.Warnings() {
		log.Warn("config: a value is not used as written", "key", w.Key, "warning", w.Text)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := start(ctx, *cfgPath, cfg, log)
	if err != nil {
		log.Error("cannot start", "error", err)
		return exitError
	}

	var served error
	select {
	case s := <-sig:
		log.Info("signal received: shutting down (a second signal exits at once)", "signal", s.String())
	case served = <-a.serveErr:
		log.Error("HTTP server failed; shutting down", "error", served)
	}
	go func() {
		s := <-sig
		log.Warn("second signal: exiting at once", "signal", s.String())
		exit(exitError)
	}()
	a.shutdown(ctx)
	if served != nil {
		return exitError
	}
	log.Info("stopped")
	return exitOK
}

// newLogger builds the slog logger from GATEWAY_LOG_FORMAT (text | json;
// default text) and GATEWAY_LOG_LEVEL (debug | info | warn | error; default
// info).
func newLogger(w io.Writer, getenv func(string) string) (*slog.Logger, error) {
	var level slog.Level
	if v := strings.TrimSpace(getenv("GATEWAY_LOG_LEVEL")); v != "" {
		if err := level.UnmarshalText([]byte(v)); err != nil {
			return nil, fmt.Errorf("GATEWAY_LOG_LEVEL must be debug, info, warn or error, got %q", v)
		}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f := strings.ToLower(strings.TrimSpace(getenv("GATEWAY_LOG_FORMAT"))); f {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("GATEWAY_LOG_FORMAT must be text or json, got %q", f)
	}
}
