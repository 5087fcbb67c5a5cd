package main

// Lock waits: a statement's mean time in pg_stat_statements counts its
// waits for locks and, on a busy two-core machine, its waits for a core
// alike. Issue 21 bounds the first (no statement above 1 ms a call from
// lock waits), so the cost report samples them apart: which statements of
// the rig's database wait for a lock (pg_stat_activity wait_event_type
// 'Lock'), every lockSampleEvery.

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// lockSampleEvery is the sampling interval: a statement seen waiting in k
// samples waited about k × lockSampleEvery.
const lockSampleEvery = 10 * time.Millisecond

// lockSampler counts, per statement (pg_stat_statements' queryid), the
// samples in which one of its executions waited for a lock.
type lockSampler struct {
	quit    chan struct{}
	done    chan struct{}
	rounds  int
	samples map[int64]int
	err     error // the first failed sample (sampling stops there)
}

// startLockSampler samples the database db's connection reaches until
// stop. A sample is never cancelled: pgx closes a connection whose query
// is, and db is the cost report's.
func startLockSampler(db *pgx.Conn) *lockSampler {
	l := &lockSampler{quit: make(chan struct{}), done: make(chan struct{}), samples: map[int64]int{}}
	go func() {
		defer close(l.done)
		tick := time.NewTicker(lockSampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-l.quit:
				return
			case <-tick.C:
			}
			if err := l.sample(context.Background(), db); err != nil {
				l.err = err
				return
			}
		}
	}()
	return l
}

// sample takes one sample.
func (l *lockSampler) sample(ctx context.Context, db *pgx.Conn) error {
	rows, err := db.Query(ctx, `SELECT query_id FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND query_id IS NOT NULL`)
	if err != nil {
		return fmt.Errorf("sample lock waits: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("sample lock waits: %w", err)
	}
	l.rounds++
	for _, id := range ids {
		l.samples[id]++
	}
	return nil
}

// stop ends the sampling and waits for it (its sample in flight ends).
func (l *lockSampler) stop() {
	close(l.quit)
	<-l.done
}

// lockWait is one statement's estimated lock wait.
type lockWait struct {
	perCall time.Duration // samples × lockSampleEvery ÷ calls
	samples int
	calls   int64
	query   string
}

// lockWaits estimates each sampled statement's lock wait per call from
// its samples and its calls in stmts (the window's, by queryid), most
// first; a statement the window did not count is left out.
func lockWaits(samples map[int64]int, stmts map[int64]stmtStat) []lockWait {
	var out []lockWait
	for id, n := range samples {
		st, ok := stmts[id]
		if !ok || st.calls <= 0 {
			continue
		}
		out = append(out, lockWait{perCall: time.Duration(n) * lockSampleEvery / time.Duration(st.calls),
			samples: n, calls: st.calls, query: st.query})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].perCall > out[j].perCall })
	return out
}

// formatLockWaits is the report's line of lock waits after label.
func formatLockWaits(label string, rounds int, waits []lockWait, err error) string {
	parts := []string{"none seen"}
	if len(waits) > 0 {
		parts = parts[:0]
	}
	for i, w := range waits {
		if i == maxOverMS {
			parts = append(parts, fmt.Sprintf("and %d more", len(waits)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("%.3f ms a call (%d samples, %d calls) %.60q",
			float64(w.perCall)/float64(time.Millisecond), w.samples, w.calls, oneLine(w.query)))
	}
	line := fmt.Sprintf("%s: PostgreSQL lock waits (pg_stat_activity sampled every %v, %d samples), estimated per call: %s",
		label, lockSampleEvery, rounds, strings.Join(parts, "; "))
	if err != nil {
		line += fmt.Sprintf(" (sampling stopped early: %v)", err)
	}
	return line + "\n"
}
