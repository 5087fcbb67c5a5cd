package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		want       procTimes
		bad        bool
	}{
		{name: "a real line (cat)", line: "3767 (cat) R 3741 3741 29706 0 -1 4194304 98 0 0 0 0 0 0 0 20 0 1 0 1176279 3133440 381 18446744073709551615 94854864879616 94854864899497 140725207206880 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 94854864915504 94854864917120 94855042105344 140725207214844 140725207214864 140725207214864 140725207216107 0\n",
			want: procTimes{pid: 3767, ppid: 3741}},
		{name: "times", line: "1000 (postgres) S 1 1000 1000 0 -1 4194560 5000 90000 0 0 50 20 300 100 20 0 6 0",
			want: procTimes{pid: 1000, ppid: 1, utime: 50, stime: 20, cutime: 300, cstime: 100}},
		{name: "a command name with spaces and parentheses", line: "1003 (a) b)) R 1001 1000 1000 0 -1 4194304 10 0 0 0 9 1 0 0 20 0 1 0",
			want: procTimes{pid: 1003, ppid: 1001, utime: 9, stime: 1}},
		{name: "no name", line: "1003 R 1001 1000", bad: true},
		{name: "too few fields", line: "1003 (x) R 1001 1000 1000 0 -1 4194304 10 0 0 0 9 1", bad: true},
		{name: "a time that is not a number", line: "1003 (x) R 1001 1000 1000 0 -1 4194304 10 0 0 0 nine 1 0 0 20 0 1 0", bad: true},
		{name: "no pid", line: "(x) R 1001 1000 1000 0 -1 4194304 10 0 0 0 9 1 0 0 20 0 1 0", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcStat([]byte(tc.line))
			if tc.bad {
				if err == nil {
					t.Fatalf("parsed %+v from a malformed line", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseProcStat = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// The CPU of a process tree counts the root with the children it reaped
// (cutime, cstime) and every live descendant, each once; a process
// outside the tree, or a directory that is not a process, is not counted.
func TestTreeTicks(t *testing.T) {
	procs, err := readProcs("testdata/proc")
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 4 {
		t.Fatalf("read %d processes from testdata/proc, want 4 (self is not one): %+v", len(procs), procs)
	}
	for _, tc := range []struct {
		root int
		want int64
	}{
		{1000, (50 + 20 + 300 + 100) + (400 + 100 + 7 + 3) + (9 + 1)}, // postmaster, backend, its child
		{1001, (400 + 100 + 7 + 3) + (9 + 1)},
		{2000, 1234 + 567},
		{4242, 0}, // gone
	} {
		if got := treeTicks(procs, tc.root); got != tc.want {
			t.Errorf("treeTicks(%d) = %d, want %d", tc.root, got, tc.want)
		}
	}
	if got := ownTicks(procs, 1000); got != 50+20 {
		t.Errorf("ownTicks(1000) = %d, want 70 (its children's time left out)", got)
	}
	if got := ticks(1480); got != 14800*time.Millisecond {
		t.Errorf("ticks(1480) = %v, want 14.8s (USER_HZ 100)", got)
	}
}

func TestParseVarz(t *testing.T) {
	b, err := os.ReadFile("testdata/varz.json")
	if err != nil {
		t.Fatal(err)
	}
	v, err := parseVarz(b)
	if err != nil || v != (varz{InMsgs: 184467, InClientMsgs: 27318}) {
		t.Fatalf("parseVarz = %+v, %v", v, err)
	}
	if _, err := parseVarz([]byte("<html>")); err == nil {
		t.Fatal("parsed a page that is not JSON")
	}
}

// The report divides each counter's difference by the turns: CPU per
// process and per kind, PostgreSQL's commits, statements (this report's
// own reads left out; BEGIN/COMMIT/SET apart), WAL, the slowest
// statement, those above 1 ms and the statements by total time, the rows written per table, JetStream's stored messages per stream and each NATS
// server's messages in.
func TestCostReportPerTurn(t *testing.T) {
	names := []string{"gateway r1", "postgres", "nats n0", "nats n1", "load client"}
	t0 := time.Unix(1000, 0)
	a := costSnap{at: t0,
		procs:   map[string]int64{"gateway r1": 100, "postgres": 1000, "nats n0": 10, "nats n1": 20, "load client": 5},
		varz:    []varz{{InMsgs: 100, InClientMsgs: 10}, {InMsgs: 200, InClientMsgs: 20}},
		streams: map[string]uint64{"TG_EVENTS": 50, "KV_lease": 7},
		pg: pgStats{commits: 40, walRecords: 1000, walWrites: 10, walSyncs: 5,
			tables: map[string]rowStat{"turns": {ins: 10, upd: 30, hot: 5}, "leases": {upd: 3}}, statements: map[int64]stmtStat{
				1: {calls: 10, ms: 5, query: "WITH claim AS (…) INSERT INTO turns"},
				2: {calls: 10, ms: 1, query: "BEGIN"},
				3: {calls: 3, ms: 1, query: "SELECT xact_commit FROM pg_stat_database"},
			}},
	}
	b := costSnap{at: t0.Add(5 * time.Second),
		procs:   map[string]int64{"gateway r1": 250, "postgres": 1100, "nats n0": 60, "nats n1": 70, "load client": 25},
		varz:    []varz{{InMsgs: 5100, InClientMsgs: 2010}, {InMsgs: 2200, InClientMsgs: 20}},
		streams: map[string]uint64{"TG_EVENTS": 1050, "KV_lease": 7, "TG_NEW": 40},
		pg: pgStats{commits: 1040, walRecords: 27000, walWrites: 510, walSyncs: 155, fsync: "on", syncCommit: "on",
			tables: map[string]rowStat{"turns": {ins: 510, upd: 1530, hot: 1005}, "leases": {upd: 3}, "queued": {ins: 50, del: 50}}, statements: map[int64]stmtStat{
				1: {calls: 510, ms: 505, query: "WITH claim AS (…) INSERT INTO turns"},
				2: {calls: 510, ms: 2, query: "BEGIN"},
				3: {calls: 9, ms: 2, query: "SELECT xact_commit FROM pg_stat_database"},
				6: {calls: 2, ms: 900, query: "SELECT relname, n_tup_ins FROM pg_stat_user_tables"}, // the report's own read
				4: {calls: 500, ms: 100, query: "UPDATE turns\n  SET state = $1"},
				5: {calls: 4, ms: 400, query: "SELECT rare"}, // under 1 % of the calls: not the slowest
			}},
	}
	var out bytes.Buffer
	diffCost(names, a, b).write(&out, "scaling, 1 replica(s)", 500)
	got := out.String()
	for _, want := range []string{
		"scaling, 1 replica(s): CPU per turn over 500 turns in 5.0s (/proc/PID/stat utime+stime, PostgreSQL with its children): gateway r1 1.50s = 3.000 ms; postgres 1.00s = 2.000 ms; nats n0 0.50s = 1.000 ms; nats n1 0.50s = 1.000 ms; load client 0.20s = 0.400 ms\n",
		"scaling, 1 replica(s): CPU per turn, cluster total (gateways + PostgreSQL + NATS) 7.000 ms: gateways 3.000 ms, PostgreSQL 2.000 ms, NATS 2.000 ms\n",
		"scaling, 1 replica(s): PostgreSQL per turn (fsync=on, synchronous_commit=on): 2.00 commits, 3.01 statements (2.01 without BEGIN/COMMIT/SET), 52.00 WAL records, 1.00 WAL writes, 0.30 WAL flushes\n",
		`scaling, 1 replica(s): PostgreSQL's slowest statement by mean time (of those with ≥ 1% of the calls): 1.000 ms over 500 calls: "WITH claim AS (…) INSERT INTO turns"`,
		`scaling, 1 replica(s): PostgreSQL's statements with a mean above 1 ms (any number of calls): 100.000 ms × 4 "SELECT rare"` + "\n",
		`scaling, 1 replica(s): PostgreSQL's statements by total execution time per turn (pg_stat_statements, the 3 dearest): 1.00 calls, 1.000 ms: "WITH claim AS (…) INSERT INTO turns"; 0.01 calls, 0.800 ms: "SELECT rare"; 1.00 calls, 0.200 ms: "UPDATE turns SET state = $1"` + "\n",
		"scaling, 1 replica(s): PostgreSQL rows per turn, inserted/updated (HOT: no index entry)/deleted (pg_stat_user_tables): queued 0.10/0.00 (0.00 HOT)/0.10, turns 1.00/3.00 (2.00 HOT)/0.00\n",
		"scaling, 1 replica(s): NATS per turn: 2.08 JetStream publishes stored (TG_EVENTS 2.00, TG_NEW 0.08); messages into the servers, all/from clients (/varz in_msgs/in_client_msgs): 14.00/4.00 (n0 10.00/4.00, n1 4.00/0.00)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks\n%s\nin\n%s", want, got)
		}
	}
	if strings.Contains(got, "not every counter") {
		t.Errorf("errors reported without errors:\n%s", got)
	}
}

// A statement's sampled lock waits are its samples × the interval, divided
// over its calls in the window; one the window did not count is left out.
func TestLockWaitsPerCall(t *testing.T) {
	stmts := map[int64]stmtStat{
		1: {calls: 500, ms: 900, query: "UPDATE turns\n  SET step_kind = $1"},
		4: {calls: 200, ms: 20, query: "WITH lease AS (…)"},
	}
	waits := lockWaits(map[int64]int{1: 50, 4: 2, 9: 7}, stmts)
	got := formatLockWaits("scaling, 3 replica(s)", 300, waits, nil)
	want := `scaling, 3 replica(s): PostgreSQL lock waits (pg_stat_activity sampled every 10ms, 300 samples), estimated per call: ` +
		`1.000 ms a call (50 samples, 500 calls) "UPDATE turns SET step_kind = $1"; 0.100 ms a call (2 samples, 200 calls) "WITH lease AS (…)"` + "\n"
	if got != want {
		t.Errorf("lock waits:\n%s\nwant\n%s", got, want)
	}
	if got := formatLockWaits("final", 10, nil, nil); !strings.Contains(got, "estimated per call: none seen\n") {
		t.Errorf("no waits: %s", got)
	}
}
