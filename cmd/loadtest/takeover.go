// The takeover phase: a replica holding N running turns is killed, and the
// survivors' commit of its turns and their notices at every watcher are
// timed from the lease's expiry (issue 21, target 2).

package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/tb"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// takeoverPhase kills replicas running N hanging turns, co.kills times
// per size; see takeoverOnce.
func takeoverPhase(r *tb.Run, co clusterOptions, c *clusterrig.Cluster) error {
	ctx := context.Background()
	db, err := pgx.Connect(ctx, c.DBURL())
	if err != nil {
		return fmt.Errorf("connect to the rig's database: %w", err) // the URL (with its password) is not printed
	}
	defer db.Close(ctx)
	kill := 0
	for _, ks := range co.kills {
		var committed, notified, free latencies
		incomplete := 0 // kills after which not every notice reached the watcher
		for range ks.kills {
			if co.stopping.Load() {
				break
			}
			a, b, cc, err := takeoverOnce(r, co, c, db, kill, ks.turns)
			if err != nil {
				return fmt.Errorf("kill %d (%d turns): %w", kill, ks.turns, err)
			}
			committed, free = append(committed, a), append(free, cc)
			if b >= 0 {
				notified = append(notified, b)
			} else {
				incomplete++
			}
			kill++
			co.logf(fmt.Sprintf("kill %d, %d turns: committed %s, notices %s, free %s", kill, ks.turns, ms(a), ms(b), ms(cc)))
		}
		bound := co.lease + time.Second
		fmt.Fprintf(co.out, "takeover, %d turns on the killed replica, %d kills (target p99 ≤ lease + 1 s = %v; watchers told to reload (1012) so far: %d):\n",
			ks.turns, len(committed), bound, co.counters.takeoverReloads.Load())
		for _, row := range []struct {
			what string
			l    latencies
		}{
			{"(a) every interrupted end committed (database)", committed},
			{fmt.Sprintf("(b) every notice at a watcher on a survivor (%d kills; %d incomplete)", len(notified), incomplete), notified},
			{"(c) the session takes a new message (via a survivor)", free},
		} {
			fmt.Fprintf(co.out, "  %-56s p50 %s  p99 %s  max %s\n", row.what, ms(row.l.q(0.5)), ms(row.l.q(0.99)), ms(row.l.q(1)))
		}
	}
	return nil
}

// takeoverOnce: n hanging turns on the victim (kill%N), sent through it;
// watchers on the next replica, takeoverWatch sessions each; SIGKILL; then
// (a) the database has no running turn of the victim, (b) the watcher saw
// every run end (never a final), (c) a send to the first session through
// the third replica starts. The victim is restarted afterwards.
func takeoverOnce(r *tb.Run, co clusterOptions, c *clusterrig.Cluster, db *pgx.Conn, kill, n int) (committed, notified, free time.Duration, err error) {
	gws := c.Gateways()
	vi := kill % len(gws)
	victim := gws[vi]
	wi, ri := (vi+1)%len(gws), (vi+2)%len(gws)
	err = tb.Do(fmt.Sprintf("%s_kill%d", r.Name(), kill), co.logf, func(r *tb.Run) error {
		tr := newTracker(co.counters)
		d := &dialer{c: c, r: r, tr: tr}
		reader, _ := d.dial(ri)
		conns := max(1, min(co.conns, n))
		if co.conns <= 0 {
			conns = max(1, min(n, 64))
		}
		senders := make([]*wsclient.Client, conns)
		for k := range senders {
			senders[k], _ = d.dial(vi)
		}
		runs := make([]string, n)
		sessions := make([]string, n)
		var ref refusals
		defer func() {
			if ref.n.Load() > 0 {
				co.logf(fmt.Sprintf("kill %d: sends refused and retried: %s", kill, &ref))
			}
		}()
		var wg sync.WaitGroup
		var serr atomic.Value
		sem := make(chan struct{}, 64)
		for i := range n {
			runs[i] = fmt.Sprintf("k%d-%d", kill, i)
			sessions[i] = fmt.Sprintf("agent:main:kill%d-s%d", kill, i)
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := sendStarted(senders[i%conns], sessions[i], "/steps shell:hang", runs[i], &ref, 10*time.Second); err != nil {
					serr.CompareAndSwap(nil, err)
				}
			}()
		}
		wg.Wait()
		if err, _ := serr.Load().(error); err != nil {
			return err
		}
		// Watchers on a survivor, each of takeoverWatch sessions
		// (chat.history): a burst of notices for more sessions than its
		// send queue holds would close one connection as a slow client.
		var watchers []*wsclient.Client
		var wids []int
		// The first session, which the reader sends to once it is free, has
		// a watcher of its own: a new owner racing the takeover's notice
		// may make its replica close the watcher with 1012 (reload).
		group := func(i int) int { return min(i, 1) + max(0, i-1)/takeoverWatch }
		for lo := 0; lo < n; {
			hi := min(n, lo+takeoverWatch)
			if lo == 0 {
				hi = 1
			}
			cl, id := d.dial(wi)
			if err := watchSessions(cl, sessions[lo:hi]); err != nil {
				return fmt.Errorf("%s: %w", gws[wi].ID, err)
			}
			watchers, wids = append(watchers, cl), append(wids, id)
			lo = hi
		}
		// Every turn runs on the victim, and the database says so.
		if err := pollDB(db, 30*time.Second, func(running int) bool { return running == n }, victim.ID); err != nil {
			return fmt.Errorf("the %d turns running on %s: %w", n, victim.ID, err)
		}
		killed := victim.Kill()
		var a, b, cc time.Duration
		var wg2 sync.WaitGroup
		var perr atomic.Value
		wg2.Add(3)
		limit := co.lease + 30*time.Second
		go func() { // (a)
			defer wg2.Done()
			if err := pollDB(db, limit, func(running int) bool { return running == 0 }, victim.ID); err != nil {
				perr.CompareAndSwap(nil, fmt.Errorf("(a) %w", err))
				return
			}
			a = time.Since(killed)
		}()
		go func() { // (b)
			defer wg2.Done()
			var latest time.Time
			missing := 0
			for i, run := range runs {
				wid, watcher := wids[group(i)], watchers[group(i)]
				select {
				case <-tr.waitEnd(wid, run):
				case <-watcher.Done():
					if _, ok := tr.end(wid, run); ok {
						break
					}
					if code := watcher.CloseCode(); code != 1012 {
						perr.CompareAndSwap(nil, fmt.Errorf("(b) the watcher of %s on %s closed with %d before its end", run, gws[wi].ID, code))
						return
					}
					// Told to reload: the history it reloads holds the
					// notice (committed before it is published).
					co.counters.takeoverReloads.Add(1)
					if now := time.Now(); now.After(latest) {
						latest = now
					}
					continue
				case <-time.After(time.Until(killed.Add(limit))): // real time: bounded wait for another process
					if missing == 0 {
						co.logf(fmt.Sprintf("kill %d: the watcher on %s saw no end of %s within %v (its close code: %d)", kill, gws[wi].ID, run, limit, watcher.CloseCode()))
					}
					missing++
					co.counters.lostNotices.Add(1)
					continue
				}
				e, _ := tr.end(wid, run)
				if e.state == "final" {
					co.counters.finalAfterKill.Add(1)
				}
				if e.received.After(latest) {
					latest = e.received
				}
			}
			b = latest.Sub(killed)
			if missing > 0 {
				b = -1 // not every notice arrived: not a takeover time
			}
		}()
		go func() { // (c)
			defer wg2.Done()
			for k := 0; ; k++ {
				run := fmt.Sprintf("k%d-next%d", kill, k)
				ack, err := reader.SendErr(sessions[0], "/steps a:1ms", run)
				if err != nil {
					perr.CompareAndSwap(nil, fmt.Errorf("(c) %w", err))
					return
				}
				if ack.OK && ack.Status == "started" {
					cc = time.Since(killed)
					return
				}
				if time.Since(killed) > limit {
					perr.CompareAndSwap(nil, fmt.Errorf("(c) %s took no new message within %v: %v", sessions[0], limit, ack.Err))
					return
				}
				time.Sleep(5 * time.Millisecond) // real time: a send every 5 ms until the session is free
			}
		}()
		wg2.Wait()
		if err, _ := perr.Load().(error); err != nil {
			return err
		}
		// Writes of a stale owner: each taken-over run has exactly one
		// assistant entry, its interrupted notice.
		var bad int64
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM (
			SELECT run_id FROM messages WHERE run_id = ANY($1) AND role = 'assistant'
			GROUP BY run_id HAVING count(*) <> 1 OR bool_or(stop_reason <> 'interrupted')) x`, runs).Scan(&bad); err != nil {
			return fmt.Errorf("check the history: %w", err)
		}
		var missing int64
		if err := db.QueryRow(context.Background(), `SELECT $2 - count(DISTINCT run_id) FROM messages
			WHERE run_id = ANY($1) AND role = 'assistant'`, runs, len(runs)).Scan(&missing); err != nil {
			return fmt.Errorf("check the history: %w", err)
		}
		co.counters.staleWrites.Add(bad)
		co.counters.lostFinals.Add(missing)
		committed, notified, free = a, b, cc
		for _, cl := range append(append(senders, watchers...), reader) {
			cl.Close()
		}
		victim.Restart()
		return nil
	})
	return committed, notified, free, err
}

// pollDB polls, every 5 ms, the count of running turns owned by replica
// until ok accepts it.
func pollDB(db *pgx.Conn, within time.Duration, ok func(running int) bool, replica string) error {
	deadline := time.Now().Add(within)
	var running int
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := db.QueryRow(ctx, `SELECT count(*) FROM turns WHERE state = 'running' AND owner_replica = $1`, replica).Scan(&running)
		cancel()
		if err != nil {
			return fmt.Errorf("count running turns: %w", err)
		}
		if ok(running) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still %d running turns of %s after %v", running, replica, within)
		}
		time.Sleep(5 * time.Millisecond) // real time: polling the database
	}
}
