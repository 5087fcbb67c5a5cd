package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/pgtest"
)

// TestMain removes the gateway binary clusterrig built and stops PostgreSQL.
func TestMain(m *testing.M) { clusterrig.Main(m) }

// A small run end to end against the built gateway binary on a real SQLite
// file: every turn's final arrives, none is lost, the store recorded every
// turn's end, and the report has every figure, per process.
func TestSmallRunReportsEveryTurn(t *testing.T) {
	var out bytes.Buffer
	o := options{clients: 40, turns: 3, rate: 400, script: "/steps a:1ms b:1ms c:1ms", max: time.Minute,
		dialPar: 10, turnWait: 20 * time.Second, out: &out, gateway: clusterrig.Binary(t)}
	if err := drive(o); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		`gateway \S+ \(pid \d+\) on 127\.0\.0\.1:\d+, store \S+turnguard\.db`,
		`store \(SQLite file\): 120 turns recorded with their end; events at the last turn's end: written \d+, queued \d+, shed \d+ \(steps, pauses, progress: store.queueSize full\), failed 0`,
		`turns: 120 sent, 120 terminal events received \(map\[final:120\]\), 0 refused, lost terminal events: 0`,
		`throughput: \d+ turns/s`,
		`latency, run end → final at the client: p50 \S+ +p90 \S+ +p99 \S+ +max \S+ +\(120 samples\)`,
		`CPU while the turns ran \(/proc/PID/stat utime\+stime\): gateway \d+\.\d+s = \d+\.\d+ ms/turn; load generator \d+\.\d+s = \d+\.\d+ ms/turn; total \d+\.\d+ ms/turn`,
		`CPU of the gateway over its whole life`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "warning:") {
		t.Errorf("runs without an end time in the store:\n%s", out.String())
	}
}

// The cluster mode at a tiny size: three replicas, every phase, two kills.
// It starts real processes (nats-server, PostgreSQL, built gateways), so
// only with TURNGUARD_CLUSTER_E2E=1 (make cluster-e2e runs it).
func TestClusterModeTiny(t *testing.T) {
	if os.Getenv("TURNGUARD_CLUSTER_E2E") != "1" {
		t.Skip("starts a whole cluster: runs only with TURNGUARD_CLUSTER_E2E=1 (make cluster-e2e)")
	}
	os.Setenv(pgtest.RequireEnv, "1")
	kills, err := parseKills("1:1,20:1")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = runCluster(clusterOptions{replicas: 3, lease: 2 * time.Second, phases: "scaling,final,busy,takeover",
		sessions: 6, turns: 2, rate: 50, abortEvery: 2, stepTimeout: 300 * time.Millisecond, busySamples: 5,
		kills: kills, script: "/steps a:5ms b:5ms", turnWait: 20 * time.Second, max: 90 * time.Second,
		logf: func(s string) { t.Log(s) }, out: &out, runName: "tiny"})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		`scaling: turns/s by replicas 1: \d+, 3: \d+`,
		`scaling, 3 replica\(s\): CPU per turn, cluster total \(gateways \+ PostgreSQL \+ NATS\) \d+\.\d+ ms: gateways`,
		`scaling, 1 replica\(s\): PostgreSQL per turn \(fsync=\w+, synchronous_commit=\w+\): \d+\.\d+ commits, \d+\.\d+ statements`,
		`final: NATS per turn: \d+\.\d+ JetStream publishes stored \(TG_EVENTS \d+\.\d+`,
		`final: run end → final, same replica .* p50 \S+ ms +p99 \S+ ms .*\(6\)`,
		`final: run end → final, other replica .* p50 \S+ ms +p99 \S+ ms .*\(6\)`,
		`abort lateness r1: p99 ≤ \S+ \(bucket \S+\) over [1-9]\d* deadline aborts`,
		`abort lateness r3: p99 ≤ \S+ \(bucket \S+\) over [1-9]\d* deadline aborts`,
		`busy answer through another replica \(forwarded\) \(r2\): p50`,
		`takeover, 20 turns on the killed replica, 1 kills`,
		`\(c\) the session takes a new message`,
		`counters \(must be 0\): lost finals 0, duplicate terminal events 0, order violations 0, stale-owner writes 0, finals of killed runs 0`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// The p99 bucket of the abort lateness sums the stop reasons' buckets.
func TestLateP99(t *testing.T) {
	m := `# HELP turnguard_abort_late_seconds x
turnguard_abort_late_seconds_bucket{stop_reason="step_timeout",le="0.001"} 50
turnguard_abort_late_seconds_bucket{stop_reason="step_timeout",le="0.005"} 98
turnguard_abort_late_seconds_bucket{stop_reason="step_timeout",le="0.01"} 100
turnguard_abort_late_seconds_bucket{stop_reason="step_timeout",le="+Inf"} 100
turnguard_abort_late_seconds_bucket{stop_reason="timeout",le="0.001"} 0
turnguard_abort_late_seconds_bucket{stop_reason="timeout",le="0.005"} 0
turnguard_abort_late_seconds_bucket{stop_reason="timeout",le="0.01"} 100
turnguard_abort_late_seconds_bucket{stop_reason="timeout",le="+Inf"} 100
`
	p99, n, err := lateP99(m)
	if err != nil || n != 200 || p99 != "10ms (bucket 5ms–10ms)" {
		t.Fatalf("lateP99 = %q, %d, %v", p99, n, err)
	}
	if p99, n, _ := lateP99("nothing"); n != 0 || p99 == "" {
		t.Fatalf("no histogram: %q %d", p99, n)
	}
}

func TestParseKills(t *testing.T) {
	k, err := parseKills("1:50, 1000:10,10000:3")
	if err != nil || len(k) != 3 || k[2] != (killSize{10000, 3}) {
		t.Fatalf("parseKills = %v, %v", k, err)
	}
	for _, bad := range []string{"1", "0:5", "x:1", "1:-1", "30000:1"} {
		if _, err := parseKills(bad); err == nil {
			t.Errorf("parseKills(%q) accepted", bad)
		}
	}
}

func TestUnknownPhaseIsRefused(t *testing.T) {
	var out bytes.Buffer
	err := runCluster(clusterOptions{replicas: 3, phases: "scaling,nope", out: &out, logf: func(string) {}})
	if err == nil || !regexp.MustCompile(`unknown phase "nope"`).MatchString(err.Error()) {
		t.Fatalf("err = %v", err)
	}
}
