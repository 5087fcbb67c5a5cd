// Watchers of the cluster load test: WebSocket clients that watch sessions
// on other replicas than the senders', reconnect when told to reload, and
// count the reloads (so a missed end during a reload is told apart).

package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// watchSessions makes cl watch every session (chat.history, 32 at a time).
func watchSessions(cl *wsclient.Client, sessions []string) error {
	var wg sync.WaitGroup
	var werr atomic.Value
	sem := make(chan struct{}, 32)
	for _, sk := range sessions {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f, err := cl.CallErr("chat.history", map[string]any{"sessionKey": sk, "limit": 1})
			if err == nil && !f.OK {
				err = fmt.Errorf("%v", f.Error)
			}
			if err != nil {
				werr.CompareAndSwap(nil, fmt.Errorf("watch %s: %w", sk, err))
			}
		}()
	}
	wg.Wait()
	err, _ := werr.Load().(error)
	return err
}

// reloadCounter counts watcher connections closed by their replica and
// when each tracker id was without a connection.
type reloadCounter struct {
	mu    sync.Mutex
	codes map[int]int
	gaps  map[int][][2]time.Time // tracker id → [closed, watching again]
	since map[[2]int]time.Time   // (tracker id, generation) → watching again
}

func (rc *reloadCounter) add(id, gen, code int, from, to time.Time) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.codes == nil {
		rc.codes, rc.gaps, rc.since = map[int]int{}, map[int][][2]time.Time{}, map[[2]int]time.Time{}
	}
	rc.codes[code]++
	rc.gaps[id] = append(rc.gaps[id], [2]time.Time{from, to})
	rc.since[[2]int{id, gen}] = to
}

// watchingSince is when generation gen (≥ 1) of watcher id watched again
// (zero before it did).
func (rc *reloadCounter) watchingSince(id, gen int) time.Time {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.since[[2]int{id, gen}]
}

// missed reports whether watcher id was reconnecting around t (a second's
// margin: the close comes after the gap it reports).
func (rc *reloadCounter) missed(id int, t time.Time) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, g := range rc.gaps[id] {
		if t.After(g[0].Add(-10*time.Second)) && t.Before(g[1].Add(time.Second)) {
			return true
		}
	}
	return false
}

func (rc *reloadCounter) String() string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.codes) == 0 {
		return "none"
	}
	var parts []string
	for code, k := range rc.codes {
		parts = append(parts, fmt.Sprintf("%d× close %d", k, code))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// reconnectWatcher waits for cl to be closed by its replica, then dials
// again (same tracker id) and watches the sessions again, until ctx ends.
func reconnectWatcher(ctx context.Context, g *clusterrig.Gateway, cl *wsclient.Client, id int, tr *tracker, sessions []string, rc *reloadCounter, logf func(string)) {
	orig, gen := cl, 0
	defer func() {
		if cl != orig {
			cl.Close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-cl.Done():
		}
		closed, code := time.Now(), cl.CloseCode()
		for {
			if ctx.Err() != nil {
				return
			}
			gen++
			next, err := wsclient.DialErr(nopTB{}, g.URL(), wsclient.Options{Token: clusterrig.OperatorToken, Name: g.ID,
				OnEvent: tr.onEventGen(id, gen), Discard: true})
			if err == nil {
				if err = watchSessions(next, sessions); err == nil {
					cl = next
					break
				}
				next.Close()
			}
			logf(fmt.Sprintf("watcher on %s: reconnect: %v", g.ID, err))
			time.Sleep(100 * time.Millisecond) // real time: retrying a connection
		}
		rc.add(id, gen, code, closed, time.Now())
		logf(fmt.Sprintf("watcher on %s closed with %d; watching %d sessions again after %v", g.ID, code, len(sessions), time.Since(closed).Round(time.Millisecond)))
	}
}
