package pgcoord

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// maxGroup bounds the statements of one group commit.
const maxGroup = 64

// groupTimeout bounds a group's round trip (its statements and commit).
const groupTimeout = 30 * time.Second

// groupLockTimeout bounds each lock wait of a group: a group holds the
// locks of all its statements until its commit, so it could wait in a
// cycle with a transaction no single statement would (the recorder's
// batch updating turn rows in another order; another replica's group
// claiming the same sessions crosswise) until the server's deadlock
// timeout (1 s); past this the group fails, commits nothing, and its
// statements run alone, as without group commit.
const groupLockTimeout = `SET LOCAL lock_timeout = '50ms'`

// errAlone says a group failed for one of its statements: nothing of it
// was committed, and each statement runs again alone.
var errAlone = errors.New("the group's transaction failed: run alone")

// committer is group commit across sessions (issue 21): the claims' and
// finishes' statements that wait while a group is in flight are sent
// together as one pipeline, which PostgreSQL runs as one implicit
// transaction — one commit, one flush of the write-ahead log, for all of
// them. Each statement is one claim's or one finish's whole work and
// decides by itself (its lease, its turn), as alone; a later statement of
// a group sees the earlier ones' writes, as if committed before it. At
// most one group is in flight per replica. Under contention — a
// statement came while another was still unanswered — a group starts no
// sooner than pace after the one before it started (unless it is full),
// so the groups grow with the commit's latency and with pace and the
// replica's commits, and their WAL flushes, are at most about one per
// pace (issue 21: at 300 turns/s offered, with nothing but the latency to
// wait for, most statements went alone — 3.1 commits and 1.5 WAL flushes
// a turn). Without contention — one caller's statements one after
// another, a takeover's restore, one turn at a time — a statement goes
// at once.
type committer struct {
	pool *pgxpool.Pool
	pace time.Duration // the least time between two groups' starts (groupPace)

	mu        sync.Mutex
	queue     []*groupReq
	running   bool      // a goroutine sends the queue's groups
	last      time.Time // when the last group was sent
	pending   int       // statements queued or sent and not yet answered
	contended bool      // a queued statement came while another was pending
}

// groupPace is a replica's least time between two group commits: at most
// about 66 commits (and WAL flushes) a second from claims and finishes,
// about 0.25 a turn at 300 turns/s, for at most this much more on a claim
// or a finish while groups follow each other closely.
const groupPace = 15 * time.Millisecond

// groupReq is one statement waiting for its group: its row's values go to
// dest.
type groupReq struct {
	sql  string
	args []any
	dest []any
	done chan error // buffered: the result
}

// queryRow runs sql with args in the next group and scans its one row into
// dest. When ctx ends before the statement was sent it returns ctx's error
// and nothing was sent; once sent it waits for the group's answer (bounded
// by groupTimeout), as a statement whose commit may have happened must. A
// group that failed for one of its statements (a *pgconn.PgError: its
// transaction committed nothing) runs each again alone; any other failure
// (a lost connection: the commit's answer is unknown) is returned, as
// pool.QueryRow's would be.
func (g *committer) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	req := &groupReq{sql: sql, args: args, dest: dest, done: make(chan error, 1)}
	g.mu.Lock()
	if g.pending > 0 {
		g.contended = true
	}
	g.pending++
	g.queue = append(g.queue, req)
	if !g.running {
		g.running = true
		go g.run()
	}
	g.mu.Unlock()
	var err error
	select {
	case err = <-req.done:
	case <-ctx.Done():
		if g.withdraw(req) {
			return ctx.Err()
		}
		err = <-req.done
	}
	if errors.Is(err, errAlone) {
		return g.pool.QueryRow(ctx, sql, args...).Scan(dest...)
	}
	return err
}

// withdraw removes req from the queue; false when it was sent already.
func (g *committer) withdraw(req *groupReq) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, q := range g.queue {
		if q == req {
			g.queue = append(g.queue[:i], g.queue[i+1:]...)
			g.pending--
			return true
		}
	}
	return false
}

// run sends the queue's groups one after another until it is empty; under
// contention each no sooner than pace after the last one started unless
// the queue holds a full group.
func (g *committer) run() {
	for {
		g.mu.Lock()
		if wait := g.pace - time.Since(g.last); g.contended && wait > 0 && len(g.queue) > 0 && len(g.queue) < maxGroup {
			g.mu.Unlock()
			time.Sleep(wait) // the pace: more statements join the group meanwhile
			g.mu.Lock()
		}
		n := min(len(g.queue), maxGroup)
		if n == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		group := make([]*groupReq, n)
		copy(group, g.queue)
		g.queue = append(g.queue[:0], g.queue[n:]...)
		g.last, g.contended = time.Now(), len(g.queue) > 0
		g.mu.Unlock()
		g.send(group)
	}
}

// answered counts group's statements as answered; called before their
// answers go out, so a caller's next statement finds its last one done.
func (g *committer) answered(group []*groupReq) {
	g.mu.Lock()
	g.pending -= len(group)
	g.mu.Unlock()
}

// send runs group's statements in one pipeline and answers each.
func (g *committer) send(group []*groupReq) {
	ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
	defer cancel()
	if len(group) == 1 {
		q := group[0]
		err := g.pool.QueryRow(ctx, q.sql, q.args...).Scan(q.dest...)
		g.answered(group)
		q.done <- err
		return
	}
	b := &pgx.Batch{}
	b.Queue(groupLockTimeout)
	for _, q := range group {
		b.Queue(q.sql, q.args...)
	}
	br := g.pool.SendBatch(ctx, b)
	_, err := br.Exec()
	errs := make([]error, len(group))
	for i, q := range group {
		errs[i] = br.QueryRow().Scan(q.dest...)
	}
	// The results count only once the transaction committed (Close reads
	// up to the pipeline's end): a statement that failed rolled back the
	// others' too.
	err = cmpErr(err, br.Close())
	for _, e := range errs {
		err = cmpErr(err, e)
	}
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok && pe != nil {
		err = errAlone
	}
	g.answered(group)
	for _, q := range group {
		q.done <- err
	}
}

// cmpErr is the first error of a and b.
func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
