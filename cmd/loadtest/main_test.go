package main

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"
)

// TestMain lets this test binary play the gateway child process.
func TestMain(m *testing.M) {
	if os.Getenv("LOADTEST_GATEWAY_CHILD") == "1" {
		fs := flag.NewFlagSet("child", flag.ExitOnError)
		var o options
		fs.Bool("serve", true, "")
		fs.IntVar(&o.clients, "clients", 1, "")
		fs.IntVar(&o.turns, "turns", 1, "")
		fs.StringVar(&o.profile, "gateway-cpuprofile", "", "")
		fs.Parse(os.Args[1:])
		if err := serve(o); err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A small run end to end: every turn's final arrives, none is lost, and the
// report has every figure.
func TestSmallRunReportsEveryTurn(t *testing.T) {
	var out bytes.Buffer
	o := options{clients: 40, turns: 3, rate: 400, script: "/steps a:1ms b:1ms c:1ms", max: time.Minute,
		dialPar: 10, turnWait: 20 * time.Second, out: &out,
		child: func(args ...string) *exec.Cmd {
			c := exec.Command(os.Args[0], args...)
			c.Env = append(os.Environ(), "LOADTEST_GATEWAY_CHILD=1")
			return c
		}}
	if err := drive(o); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		`turns: 120 sent, 120 terminal events received \(map\[final:120\]\), 0 refused, lost terminal events: 0`,
		`throughput: \d+ turns/s`,
		`latency, run end → final at the client: p50 \S+ +p90 \S+ +p99 \S+ +max \S+ +\(120 samples\)`,
		`gateway: frames=\d+ writes=\d+ droppedDeltas=0 slowClosed=0`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
