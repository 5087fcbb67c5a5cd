package main

// What a cluster phase cost, per process and per turn (issue 21, target 3):
// the CPU of every process of the rig — each gateway replica, PostgreSQL
// with its children (the backends and background workers; the CPU of
// those that exited is in the postmaster's cutime/cstime), each NATS node
// — and of this load client (its own: the rig's processes are its
// children), from /proc/PID/stat; PostgreSQL's commits
// (pg_stat_database), statements (pg_stat_statements) and WAL records,
// writes and flushes (pg_stat_wal); JetStream's stored messages per stream
// (the streams' last sequence: every publish the stream kept, a retried
// duplicate once) and the messages into each NATS server (/varz in_msgs).
// A snapshot is taken before the turns and one after; the report divides
// the differences by the turns that ended.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/pgtest"
	"github.com/turnguard/turnguard/internal/tb"
)

// userHZ is the kernel's clock tick for /proc/PID/stat's times (USER_HZ,
// 100 on Linux).
const userHZ = 100

// procTimes is what the cost report needs of one /proc/PID/stat line:
// the parent and the CPU times in clock ticks (own user and system time,
// and that of the children the process waited for).
type procTimes struct {
	pid, ppid                    int
	utime, stime, cutime, cstime int64
}

// parseProcStat parses one /proc/PID/stat. The command name (field 2) is
// in parentheses and may itself hold spaces and parentheses, so the fields
// are counted from the last ')'.
func parseProcStat(b []byte) (procTimes, error) {
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 1 || end < open {
		return procTimes{}, fmt.Errorf("/proc stat %.40q: no command name", s)
	}
	var p procTimes
	var err error
	if p.pid, err = strconv.Atoi(strings.TrimSpace(s[:open])); err != nil {
		return procTimes{}, fmt.Errorf("/proc stat %.40q: pid: %w", s, err)
	}
	f := strings.Fields(s[end+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return procTimes{}, fmt.Errorf("/proc stat of %d: %d fields after the name, want ≥ 15", p.pid, len(f))
	}
	dst := []*int64{&p.utime, &p.stime, &p.cutime, &p.cstime} // fields 14–17
	for k, d := range dst {
		if *d, err = strconv.ParseInt(f[11+k], 10, 64); err != nil {
			return procTimes{}, fmt.Errorf("/proc stat of %d: field %d: %w", p.pid, 14+k, err)
		}
	}
	if p.ppid, err = strconv.Atoi(f[1]); err != nil {
		return procTimes{}, fmt.Errorf("/proc stat of %d: ppid: %w", p.pid, err)
	}
	return p, nil
}

// readProcs reads every process's stat under root (/proc). Processes that
// end while it reads are skipped.
func readProcs(root string) ([]procTimes, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", root, err)
	}
	var out []procTimes
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		p, err := parseProcStat(b)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// treeTicks is the CPU, in clock ticks, of root and every live descendant,
// each with the children it waited for: a child that exited and was
// reaped is counted in its parent's cutime/cstime, a live one by itself,
// so every tick is counted once, and the sum only grows. 0 when root is
// not among procs.
func treeTicks(procs []procTimes, root int) int64 {
	kids := map[int][]int{}
	by := map[int]procTimes{}
	for _, p := range procs {
		by[p.pid] = p
		kids[p.ppid] = append(kids[p.ppid], p.pid)
	}
	if _, ok := by[root]; !ok {
		return 0
	}
	var sum int64
	stack := []int{root}
	for len(stack) > 0 {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		p := by[pid]
		sum += p.utime + p.stime + p.cutime + p.cstime
		stack = append(stack, kids[pid]...)
	}
	return sum
}

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }

// varz is what the report reads of a NATS server's /varz.
// in_msgs counts every message into the server, its routes' (a stream's
// replication between the nodes) included; in_client_msgs only those of
// its clients.
type varz struct {
	InMsgs       int64 `json:"in_msgs"`
	InClientMsgs int64 `json:"in_client_msgs"`
}

func parseVarz(b []byte) (varz, error) {
	var v varz
	if err := json.Unmarshal(b, &v); err != nil {
		return varz{}, fmt.Errorf("/varz: %w", err)
	}
	return v, nil
}

// pgStats are PostgreSQL's counters of the rig's database (commits,
// statements) and server (WAL).
type pgStats struct {
	commits    int64
	statements map[int64]stmtStat // by queryid
	walRecords int64
	walWrites  int64
	walSyncs   int64 // flushes to disk (0 while fsync is off)
	fsync      string
	syncCommit string
	tables     map[string]rowStat // the rows each table of the database's own was written
}

// rowStat is a table's rows written (pg_stat_user_tables): inserted,
// updated (HOT: without a new index entry) and deleted.
type rowStat struct {
	ins, upd, hot, del int64
}

type stmtStat struct {
	calls int64
	ms    float64 // total execution time
	query string
}

// costSnap is the state of every counter at one moment.
type costSnap struct {
	at       time.Time
	procs    map[string]int64 // process name → CPU ticks
	varz     []varz           // per NATS node
	streams  map[string]uint64
	pg       pgStats
	pgErr    error
	natsErr  error
	procsErr error
}

// costWatch measures a phase's cost: snapshots around the turns.
type costWatch struct {
	c      *clusterrig.Cluster
	db     *pgx.Conn
	js     jetstream.JetStream
	names  []string // processes in report order
	pids   map[string]int
	before costSnap
	locks  *lockSampler // on db between the snapshots; nil without db
}

// startCost connects to the rig's database and NATS and takes the first
// snapshot. Anything it cannot read is reported, not fatal: the turns are
// measured regardless.
func startCost(r *tb.Run, c *clusterrig.Cluster) *costWatch {
	w := &costWatch{c: c, pids: map[string]int{}}
	for _, g := range c.Gateways() {
		w.names = append(w.names, "gateway "+g.ID)
		w.pids["gateway "+g.ID] = g.PID()
	}
	w.names = append(w.names, "postgres")
	w.pids["postgres"] = pgtest.PID()
	for i := range c.NATS().Size() {
		n := fmt.Sprintf("nats n%d", i)
		w.names = append(w.names, n)
		w.pids[n] = c.NATS().PID(i)
	}
	w.names = append(w.names, loadClient)
	w.pids[loadClient] = os.Getpid()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := pgx.Connect(ctx, c.DBURL())
	if err == nil {
		w.db = db
		r.Cleanup(func() { _ = db.Close(context.Background()) })
		// Counting statements needs the extension in the database (the
		// server preloads it when the installation has it).
		if _, err := db.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
			r.Logf("cost: no pg_stat_statements (statements are not counted): %v", err)
		}
	} else {
		r.Logf("cost: cannot connect to the rig's database: %v", errors.Unwrap(err))
	}
	nc := c.NATS().Connect(r, 0, nats.Name("loadtest cost"))
	if js, err := jetstream.New(nc); err == nil {
		w.js = js
	}
	// PostgreSQL's backends report their commits and WAL a second after
	// they go idle: what the start-up did is counted before the turns.
	time.Sleep(2 * time.Second) // real time: PostgreSQL's statistics interval
	w.before = w.snap()
	if w.db != nil {
		w.locks = startLockSampler(w.db)
	}
	return w
}

// snapProcs reads the processes' CPU only.
func (w *costWatch) snapProcs() costSnap {
	s := costSnap{at: time.Now(), procs: map[string]int64{}}
	procs, err := readProcs("/proc")
	s.procsErr = err
	for _, n := range w.names {
		if n == loadClient {
			// Its own time only: the rig's processes are its children.
			s.procs[n] = ownTicks(procs, w.pids[n])
			continue
		}
		s.procs[n] = treeTicks(procs, w.pids[n])
	}
	return s
}

// loadClient names this process in the report.
const loadClient = "load client"

// ownTicks is pid's own CPU in clock ticks, without its children's.
func ownTicks(procs []procTimes, pid int) int64 {
	for _, p := range procs {
		if p.pid == pid {
			return p.utime + p.stime
		}
	}
	return 0
}

// snap reads every counter.
func (w *costWatch) snap() costSnap {
	s := w.snapProcs()
	s.streams = map[string]uint64{}
	for i := range w.c.NATS().Size() {
		v, err := fetchVarz(w.c.NATS().MonitorURL(i))
		if err != nil && s.natsErr == nil {
			s.natsErr = err
		}
		s.varz = append(s.varz, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if w.js != nil {
		l := w.js.ListStreams(ctx)
		for info := range l.Info() {
			s.streams[info.Config.Name] = info.State.LastSeq
		}
		if err := l.Err(); err != nil && s.natsErr == nil {
			s.natsErr = fmt.Errorf("list streams: %w", err)
		}
	}
	if w.db != nil {
		s.pg, s.pgErr = readPG(ctx, w.db)
	} else {
		s.pgErr = errors.New("no connection to the database")
	}
	return s
}

func fetchVarz(url string) (varz, error) {
	cl := http.Client{Timeout: 5 * time.Second}
	res, err := cl.Get(url + "/varz")
	if err != nil {
		return varz{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return varz{}, err
	}
	if res.StatusCode != http.StatusOK {
		return varz{}, fmt.Errorf("%s/varz: status %d", url, res.StatusCode)
	}
	return parseVarz(b)
}

// readPG reads the database's and the server's counters.
func readPG(ctx context.Context, db *pgx.Conn) (pgStats, error) {
	var s pgStats
	if _, err := db.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return s, err
	}
	if err := db.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&s.commits); err != nil {
		return s, fmt.Errorf("pg_stat_database: %w", err)
	}
	if err := db.QueryRow(ctx, `SELECT wal_records, wal_write, wal_sync FROM pg_stat_wal`).Scan(&s.walRecords, &s.walWrites, &s.walSyncs); err != nil {
		return s, fmt.Errorf("pg_stat_wal: %w", err)
	}
	if err := db.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit')`).Scan(&s.fsync, &s.syncCommit); err != nil {
		return s, err
	}
	trows, err := db.Query(ctx, `SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables`)
	if err != nil {
		return s, fmt.Errorf("pg_stat_user_tables: %w", err)
	}
	s.tables = map[string]rowStat{}
	for trows.Next() {
		var name string
		var r rowStat
		if err := trows.Scan(&name, &r.ins, &r.upd, &r.hot, &r.del); err != nil {
			trows.Close()
			return s, fmt.Errorf("pg_stat_user_tables: %w", err)
		}
		s.tables[name] = r
	}
	trows.Close()
	if err := trows.Err(); err != nil {
		return s, fmt.Errorf("pg_stat_user_tables: %w", err)
	}
	rows, err := db.Query(ctx, `SELECT queryid, calls, total_exec_time, query FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND queryid IS NOT NULL`)
	if err != nil {
		return s, nil // no pg_stat_statements: statements stay 0 (reported as such)
	}
	defer rows.Close()
	s.statements = map[int64]stmtStat{}
	for rows.Next() {
		var id int64
		var st stmtStat
		if err := rows.Scan(&id, &st.calls, &st.ms, &st.query); err != nil {
			return s, fmt.Errorf("pg_stat_statements: %w", err)
		}
		s.statements[id] = st
	}
	return s, rows.Err()
}

// ownRead reports a statement of this report's own reads.
func ownRead(query string) bool {
	return hasPrefixFold(query, "select pg_stat", "select xact_commit", "select wal_records", "select current_setting",
		"select queryid", "select relname", "create extension")
}

// txOrSet reports transaction control and settings: a statement, not a
// turn's work (the figure "without BEGIN/COMMIT/SET").
func txOrSet(query string) bool {
	return hasPrefixFold(query, "begin", "commit", "rollback", "set ")
}

func hasPrefixFold(s string, prefixes ...string) bool {
	q := strings.ToLower(strings.TrimSpace(s))
	for _, p := range prefixes {
		if strings.HasPrefix(q, p) {
			return true
		}
	}
	return false
}

// topStatements is how many statements the report breaks down by total
// time.
const topStatements = 8

// costDiff is what happened between two snapshots.
type costDiff struct {
	elapsed    time.Duration
	cpu        map[string]time.Duration
	names      []string
	inMsgs     []int64
	inClient   []int64
	streams    map[string]uint64
	commits    int64
	calls      int64
	work       int64
	walRecords int64
	walWrites  int64
	walSyncs   int64
	slowest    stmtStat           // highest mean time among the window's statements with ≥ 1 % of its calls
	overMS     []stmtStat         // every statement of the window with a mean above 1 ms (issue 21's bound on lock waits), slowest first
	stmts      map[int64]stmtStat // the window's statements by queryid
	locks      []lockWait         // sampled lock waits (lockSampler), nil when not sampled
	lockRounds int
	lockErr    error
	tables     map[string]rowStat
	top        []stmtStat // the window's statements (BEGIN/COMMIT/SET apart) by total time, dearest first, at most topStatements
	fsync      string
	syncCommit string
	errs       []error
}

func diffCost(names []string, a, b costSnap) costDiff {
	d := costDiff{elapsed: b.at.Sub(a.at), cpu: map[string]time.Duration{}, names: names, streams: map[string]uint64{}}
	for _, n := range names {
		d.cpu[n] = ticks(b.procs[n] - a.procs[n])
	}
	for i := range b.varz {
		var before varz
		if i < len(a.varz) {
			before = a.varz[i]
		}
		d.inMsgs = append(d.inMsgs, b.varz[i].InMsgs-before.InMsgs)
		d.inClient = append(d.inClient, b.varz[i].InClientMsgs-before.InClientMsgs)
	}
	for k, v := range b.streams {
		d.streams[k] = v - min(v, a.streams[k])
	}
	d.commits = b.pg.commits - a.pg.commits
	d.walRecords = b.pg.walRecords - a.pg.walRecords
	d.walWrites = b.pg.walWrites - a.pg.walWrites
	d.walSyncs = b.pg.walSyncs - a.pg.walSyncs
	d.fsync, d.syncCommit = b.pg.fsync, b.pg.syncCommit
	d.tables = map[string]rowStat{}
	for name, r := range b.pg.tables {
		was := a.pg.tables[name]
		if r = (rowStat{ins: r.ins - was.ins, upd: r.upd - was.upd, hot: r.hot - was.hot, del: r.del - was.del}); r != (rowStat{}) {
			d.tables[name] = r
		}
	}
	var window []stmtStat
	d.stmts = map[int64]stmtStat{}
	for id, st := range b.pg.statements {
		was := a.pg.statements[id]
		st.calls -= was.calls
		st.ms -= was.ms
		if st.calls <= 0 || ownRead(st.query) {
			continue
		}
		d.calls += st.calls
		d.stmts[id] = st
		if !txOrSet(st.query) {
			d.work += st.calls
			window = append(window, st)
		}
	}
	sort.Slice(window, func(i, j int) bool {
		if window[i].ms != window[j].ms {
			return window[i].ms > window[j].ms
		}
		return window[i].query < window[j].query
	})
	d.top = window[:min(len(window), topStatements)]
	for _, st := range window {
		if st.ms > float64(st.calls) {
			d.overMS = append(d.overMS, st)
		}
		if 100*st.calls >= d.work && (d.slowest.calls == 0 || st.ms/float64(st.calls) > d.slowest.ms/float64(d.slowest.calls)) {
			d.slowest = st
		}
	}
	sort.Slice(d.overMS, func(i, j int) bool {
		return d.overMS[i].ms/float64(d.overMS[i].calls) > d.overMS[j].ms/float64(d.overMS[j].calls)
	})
	for _, err := range []error{a.procsErr, b.procsErr, a.natsErr, b.natsErr, a.pgErr, b.pgErr} {
		if err != nil {
			d.errs = append(d.errs, err)
		}
	}
	return d
}

// finish takes the second snapshot, after the backends reported the
// turns' statistics, and writes the report for turns turns.
func (w *costWatch) finish(out io.Writer, label string, turns int) {
	procs := w.snapProcs() // the CPU as the turns ended
	if w.locks != nil {
		w.locks.stop() // before the snapshot: they share db
	}
	time.Sleep(2 * time.Second) // real time: PostgreSQL's statistics interval (see startCost)
	after := w.snap()
	after.at, after.procs, after.procsErr = procs.at, procs.procs, procs.procsErr
	d := diffCost(w.names, w.before, after)
	if w.locks != nil {
		d.locks, d.lockRounds, d.lockErr = lockWaits(w.locks.samples, d.stmts), w.locks.rounds, w.locks.err
	}
	d.write(out, label, turns)
}

// write prints the report of d for turns turns, each line prefixed with
// label.
func (d costDiff) write(out io.Writer, label string, turns int) {
	per := func(n float64) string {
		if turns == 0 {
			return "-"
		}
		return strconv.FormatFloat(n/float64(turns), 'f', 2, 64)
	}
	perMS := func(t time.Duration) string {
		if turns == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f ms", float64(t)/float64(time.Millisecond)/float64(turns))
	}
	var parts []string
	var cluster, gateways, natsCPU time.Duration
	for _, n := range d.names {
		c := d.cpu[n]
		parts = append(parts, fmt.Sprintf("%s %.2fs = %s", n, c.Seconds(), perMS(c)))
		switch {
		case n == loadClient:
			continue
		case strings.HasPrefix(n, "gateway "):
			gateways += c
		case strings.HasPrefix(n, "nats "):
			natsCPU += c
		}
		cluster += c
	}
	fmt.Fprintf(out, "%s: CPU per turn over %d turns in %.1fs (/proc/PID/stat utime+stime, PostgreSQL with its children): %s\n",
		label, turns, d.elapsed.Seconds(), strings.Join(parts, "; "))
	fmt.Fprintf(out, "%s: CPU per turn, cluster total (gateways + PostgreSQL + NATS) %s: gateways %s, PostgreSQL %s, NATS %s\n",
		label, perMS(cluster), perMS(gateways), perMS(d.cpu["postgres"]), perMS(natsCPU))
	fmt.Fprintf(out, "%s: PostgreSQL per turn (fsync=%s, synchronous_commit=%s): %s commits, %s statements (%s without BEGIN/COMMIT/SET), %s WAL records, %s WAL writes, %s WAL flushes\n",
		label, d.fsync, d.syncCommit, per(float64(d.commits)), per(float64(d.calls)), per(float64(d.work)),
		per(float64(d.walRecords)), per(float64(d.walWrites)), per(float64(d.walSyncs)))
	if d.slowest.calls > 0 {
		fmt.Fprintf(out, "%s: PostgreSQL's slowest statement by mean time (of those with ≥ 1%% of the calls): %.3f ms over %d calls: %.80q\n",
			label, d.slowest.ms/float64(d.slowest.calls), d.slowest.calls, oneLine(d.slowest.query))
	}
	over := []string{"none"}
	if len(d.overMS) > 0 {
		over = over[:0]
	}
	for i, st := range d.overMS {
		if i == maxOverMS {
			over = append(over, fmt.Sprintf("and %d more", len(d.overMS)-i))
			break
		}
		over = append(over, fmt.Sprintf("%.3f ms × %d %.60q", st.ms/float64(st.calls), st.calls, oneLine(st.query)))
	}
	fmt.Fprintf(out, "%s: PostgreSQL's statements with a mean above 1 ms (any number of calls): %s\n", label, strings.Join(over, "; "))
	if d.lockRounds > 0 || d.lockErr != nil {
		fmt.Fprint(out, formatLockWaits(label, d.lockRounds, d.locks, d.lockErr))
	}
	if len(d.top) > 0 {
		var by []string
		for _, st := range d.top {
			by = append(by, fmt.Sprintf("%s calls, %.3f ms: %.60q", per(float64(st.calls)), st.ms/float64(max(turns, 1)), oneLine(st.query)))
		}
		fmt.Fprintf(out, "%s: PostgreSQL's statements by total execution time per turn (pg_stat_statements, the %d dearest): %s\n",
			label, len(d.top), strings.Join(by, "; "))
	}
	if len(d.tables) > 0 {
		var rows []string
		for _, name := range slices.Sorted(maps.Keys(d.tables)) {
			r := d.tables[name]
			rows = append(rows, fmt.Sprintf("%s %s/%s (%s HOT)/%s", name, per(float64(r.ins)), per(float64(r.upd)), per(float64(r.hot)), per(float64(r.del))))
		}
		fmt.Fprintf(out, "%s: PostgreSQL rows per turn, inserted/updated (HOT: no index entry)/deleted (pg_stat_user_tables): %s\n",
			label, strings.Join(rows, ", "))
	}
	var total uint64
	var names []string
	for k, v := range d.streams {
		total += v
		if v > 0 {
			names = append(names, fmt.Sprintf("%s %s", k, per(float64(v))))
		}
	}
	sort.Strings(names)
	var in []string
	var inTotal, clientTotal int64
	for i, v := range d.inMsgs {
		inTotal += v
		clientTotal += d.inClient[i]
		in = append(in, fmt.Sprintf("n%d %s/%s", i, per(float64(v)), per(float64(d.inClient[i]))))
	}
	fmt.Fprintf(out, "%s: NATS per turn: %s JetStream publishes stored (%s); messages into the servers, all/from clients (/varz in_msgs/in_client_msgs): %s/%s (%s)\n",
		label, per(float64(total)), strings.Join(names, ", "), per(float64(inTotal)), per(float64(clientTotal)), strings.Join(in, ", "))
	for _, err := range d.errs {
		fmt.Fprintf(out, "%s: cost: not every counter was read: %v\n", label, err)
	}
}

// maxOverMS bounds the statements the report names as above 1 ms.
const maxOverMS = 6

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
