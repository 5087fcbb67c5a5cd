// Command loadtest is the loopback WebSocket load test behind `make load`:
// many concurrent OpenClaw-protocol clients, each running scripted demo
// turns against a gateway on 127.0.0.1, measuring turns per second, the
// latency from a run's end (the engine's terminal event) to the client's
// receipt of its `final`, and terminal events that never arrived.
//
// The gateway is the built binary (-gateway, bin/gateway: make load builds
// it) in a child process with its store on a real SQLite file in a temporary
// directory: the product's own figure, store included. (A child process
// also because one process cannot hold both ends of 10,000 sockets under
// the machine's 20,000 open files limit.) Both processes read the same wall
// clock; once the gateway has stopped, the exact end time of every run is
// read from its SQLite file (turns.ended_at) and joined with the receipt
// times. CPU is read from /proc/PID/stat (utime+stime) of the gateway and
// of this process separately, over the turns.
//
// It is bounded: a fixed number of turns per client, at most -max overall,
// loopback only.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/turnguard/turnguard/internal/clusterrig"
)

type options struct {
	clients  int
	turns    int
	rate     float64
	script   string
	max      time.Duration
	dialPar  int
	turnWait time.Duration
	gateway  string // the gateway binary

	replicas    int // > 0: the cluster mode (cluster.go)
	lease       time.Duration
	phases      string
	sessions    int
	conns       int
	abortEvery  int
	noWatchers  bool
	stepTimeout time.Duration
	busySamples int
	kills       string

	out io.Writer // the report; os.Stdout
}

func main() {
	var o options
	flag.IntVar(&o.clients, "clients", 10000, "concurrent WebSocket clients")
	flag.IntVar(&o.turns, "turns", 10, "turns per client")
	flag.Float64Var(&o.rate, "rate", 2500, "offered turns per second over all clients (0: each client sends its next turn as soon as the last one ended)")
	flag.StringVar(&o.script, "script", "/steps a:10ms b:10ms c:10ms", "the message of every turn (a demo runner script)")
	flag.DurationVar(&o.max, "max", 120*time.Second, "upper bound on the whole run")
	flag.IntVar(&o.dialPar, "dial-parallel", 200, "connections opened at once while connecting")
	flag.DurationVar(&o.turnWait, "turn-wait", 30*time.Second, "how long a client waits for a turn's terminal event before counting it lost")
	flag.StringVar(&o.gateway, "gateway", envOr(clusterrig.EnvGatewayBin, "bin/gateway"), "the gateway binary, run as a child process on a real SQLite file (default $"+clusterrig.EnvGatewayBin+" or bin/gateway)")
	flag.IntVar(&o.replicas, "replicas", 0, "cluster mode: start a whole cluster (3 nats-server, PostgreSQL, this many built gateways; make load-cluster) and measure it (0: one process; 1: the phases scaling and final only)")
	flag.DurationVar(&o.lease, "lease", 3*time.Second, "cluster mode: cluster.leaseSeconds")
	flag.StringVar(&o.phases, "phases", "scaling,final,busy,takeover", "cluster mode: which measurements, in this order")
	flag.IntVar(&o.sessions, "sessions", 600, "cluster mode: sessions of the scaling and final phases (one turn at a time each)")
	flag.IntVar(&o.conns, "conns", 0, "cluster mode: sender connections per replica (0: one per session; the takeover's senders: at most 64)")
	flag.BoolVar(&o.noWatchers, "no-watchers", false, "cluster mode, scaling and final phases: watch no session from another replica (the same client load as one replica; what the watchers cost)")
	flag.IntVar(&o.abortEvery, "abort-every", 10, "cluster mode, final phase: every n-th session runs hanging turns the step timeout ends (0: none)")
	flag.DurationVar(&o.stepTimeout, "step-timeout", 500*time.Millisecond, "cluster mode, final phase: channels.ws.timeouts.stepTimeoutSeconds")
	flag.IntVar(&o.busySamples, "busy-samples", 300, "cluster mode: busy answers timed per path")
	flag.StringVar(&o.kills, "kills", "1:50,1000:10,10000:3", "cluster mode: TURNS:KILLS,… hanging turns on the killed replica and how many kills")
	flag.Parse()
	o.out = os.Stdout
	var err error
	if o.replicas > 0 {
		err = clusterMain(o)
	} else {
		err = drive(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

// envOr is the environment variable k, or def when it is unset or empty.
func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// result is what one client saw.
type result struct {
	recv      map[string]int64 // run id → unix ns when its terminal chat event arrived
	sent      int
	lost      int
	errors    int
	states    map[string]int // terminal states seen: final, aborted, error
	firstSend int64
	lastRecv  int64
	errText   string
}

func drive(o options) error {
	if o.clients < 1 || o.turns < 1 {
		return errors.New("-clients and -turns must be ≥ 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.max)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	gw, err := startGateway(ctx, o.gateway, o.clients)
	if err != nil {
		return err
	}
	defer gw.cleanup()
	defer gw.kill()
	addr, url := gw.addr, gw.url()

	fmt.Fprintf(o.out, "loadtest: %d clients × %d turns of %q, offered %s, gateway %s (pid %d) on %s, store %s (GOMAXPROCS %d)\n",
		o.clients, o.turns, o.script, rateText(o.rate), o.gateway, gw.pid(), addr, gw.db, runtime.GOMAXPROCS(0))

	// Connect everyone first.
	t0 := time.Now()
	conns := make([]*websocket.Conn, o.clients)
	var dialErr atomic.Value
	sem := make(chan struct{}, o.dialPar)
	var wg sync.WaitGroup
	for i := range conns {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := connect(ctx, url)
			if err != nil {
				dialErr.CompareAndSwap(nil, fmt.Errorf("client %d: %w", i, err))
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	if err, _ := dialErr.Load().(error); err != nil {
		closeAll(conns)
		return err
	}
	fmt.Fprintf(o.out, "connected %d clients in %.1fs\n", o.clients, time.Since(t0).Seconds())

	// Run the turns, reading both processes' CPU around them.
	results := make([]result, o.clients)
	gwCPU0, selfCPU0 := procCPU(gw.pid()), procCPU(os.Getpid())
	start := time.Now().Add(100 * time.Millisecond)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runClient(ctx, o, c, i, start)
		}()
	}
	wg.Wait()
	cpu := turnCPU{gateway: procCPU(gw.pid()) - gwCPU0, client: procCPU(os.Getpid()) - selfCPU0}
	closeAll(conns)

	// The store's counters, then a clean stop (the writer flushes), then
	// the run end times from the SQLite file.
	sc, err := gw.storeCounters()
	if err != nil {
		return err
	}
	if cpu.gatewayLife, err = gw.stop(); err != nil {
		return err
	}
	ends, err := gw.ends()
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "store (SQLite file): %d turns recorded with their end; events at the last turn's end: written %d, queued %d, shed %d (steps, pauses, progress: store.queueSize full), failed %d\n",
		len(ends), sc.written, sc.queued, sc.dropped, sc.failed)
	return report(o, results, ends, cpu)
}

// turnCPU is the CPU time (utime+stime, /proc/PID/stat) the gateway and
// this process (the load generator) used while the turns ran, and the
// gateway's over its whole life (start-up, connections, shutdown too).
type turnCPU struct {
	gateway, client, gatewayLife time.Duration
}

// clusterMain runs the cluster mode with o's flags.
func clusterMain(o options) error {
	if o.replicas < 1 || o.replicas > 5 {
		return fmt.Errorf("-replicas %d: want 1–5", o.replicas)
	}
	if o.sessions < 1 || o.turns < 1 || o.conns < 0 || o.sessions > 20000 || o.turns > 1000 {
		return errors.New("-sessions (1–20000) and -turns (1–1000) must be ≥ 1, -conns ≥ 0")
	}
	kills, err := parseKills(o.kills)
	if err != nil {
		return err
	}
	return runCluster(clusterOptions{
		replicas: o.replicas, lease: o.lease, phases: o.phases, sessions: o.sessions, turns: o.turns,
		rate: o.rate, conns: o.conns, abortEvery: o.abortEvery, noWatchers: o.noWatchers, stepTimeout: o.stepTimeout,
		busySamples: o.busySamples, kills: kills, script: o.script, turnWait: o.turnWait, max: o.max,
		logf: func(s string) { fmt.Fprintln(os.Stderr, time.Now().Format("15:04:05.000"), s) }, out: o.out,
		runName: "loadtest",
	})
}

func rateText(r float64) string {
	if r <= 0 {
		return "as fast as possible (closed loop)"
	}
	return fmt.Sprintf("%.0f turns/s", r)
}

func closeAll(conns []*websocket.Conn) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}

// connect opens one client: challenge, connect (as the TUI does, with the
// tool-events cap), hello.
func connect(ctx context.Context, url string) (*websocket.Conn, error) {
	d := websocket.Dialer{HandshakeTimeout: 30 * time.Second, ReadBufferSize: 2048, WriteBufferSize: 1024}
	c, _, err := d.DialContext(ctx, url, nil)
	if err != nil {
		return nil, err
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, msg, err := c.ReadMessage(); err != nil || !bytes.Contains(msg, []byte(`"connect.challenge"`)) {
		c.Close()
		return nil, fmt.Errorf("no challenge: %v", err)
	}
	err = c.WriteJSON(map[string]any{"type": "req", "id": "hello", "method": "connect", "params": map[string]any{
		"minProtocol": 4, "maxProtocol": 4, "role": "operator",
		"client": map[string]any{"id": "loadtest", "version": "1", "platform": "linux", "mode": "cli"},
		"caps":   []string{"tool-events"},
	}})
	if err != nil {
		c.Close()
		return nil, err
	}
	if _, msg, err := c.ReadMessage(); err != nil || !bytes.Contains(msg, []byte(`"hello-ok"`)) {
		c.Close()
		return nil, fmt.Errorf("no hello: %v %s", err, msg)
	}
	return c, nil
}

// terminal is the part of a chat event the client decodes.
type terminal struct {
	Payload struct {
		RunID string `json:"runId"`
		State string `json:"state"`
	} `json:"payload"`
}

// runClient runs o.turns turns on session "load-<i>". With a rate, turn j of
// client i is due at start + (j·clients + i)/rate: together an even offered
// load.
func runClient(ctx context.Context, o options, c *websocket.Conn, i int, start time.Time) result {
	r := result{recv: make(map[string]int64, o.turns), states: map[string]int{}}
	session := "load-" + strconv.Itoa(i)
	for j := range o.turns {
		if o.rate > 0 {
			due := start.Add(time.Duration(float64(j*o.clients+i) / o.rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
				}
			}
		} else if j == 0 {
			time.Sleep(time.Duration(rand.Int64N(int64(time.Second)))) // spread the first turns
		}
		if ctx.Err() != nil {
			break
		}
		run := "c" + strconv.Itoa(i) + "-t" + strconv.Itoa(j)
		req := `{"type":"req","id":"` + run + `","method":"chat.send","params":{"sessionKey":"` + session +
			`","message":` + strconv.Quote(o.script) + `,"idempotencyKey":"` + run + `"}}`
		now := time.Now().UnixNano()
		if r.firstSend == 0 {
			r.firstSend = now
		}
		if err := c.WriteMessage(websocket.TextMessage, []byte(req)); err != nil {
			r.errText = err.Error()
			r.lost += o.turns - j
			return r
		}
		r.sent++
		switch awaitTerminal(ctx, c, run, o.turnWait, &r) {
		case gotTerminal, refused:
		case broken:
			r.lost += o.turns - j
			return r
		default:
			r.lost++
		}
	}
	return r
}

var (
	chatEvent = []byte(`"event":"chat"`)
	ackFail   = []byte(`"ok":false`)
)

type outcome int

const (
	timedOut    outcome = iota
	gotTerminal         // the run's final, aborted or error event arrived
	refused             // chat.send was answered with an error: no run, nothing to lose
	broken              // the connection failed
)

// awaitTerminal reads until the terminal chat event of run.
func awaitTerminal(ctx context.Context, c *websocket.Conn, run string, wait time.Duration, r *result) outcome {
	deadline := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.SetReadDeadline(deadline)
	for {
		_, msg, err := c.ReadMessage()
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				r.errText = err.Error()
				return broken
			}
			return timedOut
		}
		now := time.Now().UnixNano()
		if bytes.Contains(msg, ackFail) {
			r.errors++
			if r.errText == "" {
				r.errText = string(msg)
			}
			return refused
		}
		if !bytes.Contains(msg, chatEvent) || bytes.Contains(msg, []byte(`"state":"delta"`)) {
			continue
		}
		var t terminal
		if json.Unmarshal(msg, &t) != nil || t.Payload.RunID != run {
			continue
		}
		r.recv[run] = now
		r.lastRecv = now
		r.states[t.Payload.State]++
		return gotTerminal
	}
}

func report(o options, results []result, ends map[string]int64, cpu turnCPU) error {
	var (
		sent, lost, errs, got int
		first, last           int64
		lat                   []time.Duration
		states                = map[string]int{}
		unmatched             int
		errText               string
	)
	for _, r := range results {
		sent += r.sent
		lost += r.lost
		errs += r.errors
		got += len(r.recv)
		if r.firstSend != 0 && (first == 0 || r.firstSend < first) {
			first = r.firstSend
		}
		last = max(last, r.lastRecv)
		for k, v := range r.states {
			states[k] += v
		}
		for run, ns := range r.recv {
			end, ok := ends[run]
			if !ok {
				unmatched++
				continue
			}
			lat = append(lat, time.Duration(ns-end))
		}
		if errText == "" && r.errText != "" {
			errText = r.errText
		}
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	elapsed := time.Duration(last - first)
	fmt.Fprintf(o.out, "turns: %d sent, %d terminal events received (%v), %d refused, lost terminal events: %d\n",
		sent, got, states, errs, lost)
	if elapsed > 0 {
		fmt.Fprintf(o.out, "throughput: %.0f turns/s (%d turns in %.1fs)\n", float64(got)/elapsed.Seconds(), got, elapsed.Seconds())
	}
	fmt.Fprintf(o.out, "latency, run end → final at the client: p50 %v  p90 %v  p99 %v  max %v  (%d samples)\n",
		q(0.50).Round(time.Microsecond), q(0.90).Round(time.Microsecond), q(0.99).Round(time.Microsecond),
		q(1).Round(time.Microsecond), len(lat))
	perTurn := func(d time.Duration) string {
		if got == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f ms/turn", float64(d)/float64(time.Millisecond)/float64(got))
	}
	fmt.Fprintf(o.out, "CPU while the turns ran (/proc/PID/stat utime+stime): gateway %.2fs = %s; load generator %.2fs = %s; total %s\n",
		cpu.gateway.Seconds(), perTurn(cpu.gateway), cpu.client.Seconds(), perTurn(cpu.client), perTurn(cpu.gateway+cpu.client))
	fmt.Fprintf(o.out, "CPU of the gateway over its whole life (start, connections, turns, shutdown): %.2fs\n", cpu.gatewayLife.Seconds())
	if unmatched > 0 {
		fmt.Fprintf(o.out, "warning: %d received runs have no end time from the gateway\n", unmatched)
	}
	if errText != "" {
		fmt.Fprintf(o.out, "first error: %s\n", errText)
	}
	if lost > 0 || errs > 0 {
		return fmt.Errorf("%d terminal events lost, %d turns refused", lost, errs)
	}
	return nil
}
