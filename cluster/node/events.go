// A replica's events across the cluster: Export (a turn's live events held
// until another replica wants them, its end always), the interest that
// releases them (Watching, WatchingAll, WatchedElsewhere), the ends of
// the turns a takeover or Close's Leave ended (tookOver, left, exportEnds),
// and Import, the other replicas' events for this replica's watchers.

package node

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/turnguard/turnguard/cluster/natsbus"
	"github.com/turnguard/turnguard/cluster/pgcoord"
	"github.com/turnguard/turnguard/event"
)

// Export hands ev to the exporter (it never blocks); a fenced replica, or
// one that left, exports nothing.
//
// Only what another replica will show is published (issue 21): a turn's
// end always (every replica's watchers of the session, the agent calls
// waiting for it, the numbering a takeover continues), its other events
// only while another replica wants the session (Interest: it watches it,
// or asked about it). Until then they are held, in order, with the turn
// (at most maxHeld; past that the watchers that come later see a gap and
// reload), and published first when a replica announces that it shows the
// session mid-turn (dropped instead when it asked for the session's status,
// which holds them); at the end of a turn nobody wanted they are dropped
// unnumbered, so the session's sequence has no hole. A turn nobody else
// watches thus publishes one frame, its end; its deltas are not sent.
func (n *Node) Export(ev event.Event) {
	select {
	case <-n.coord.Load().Fenced():
		return
	default:
	}
	key := ev.SessionKey
	v, held := n.held.Load(key)
	if !held && n.interest.Wanted(key) {
		n.exp.Publish(ev)
		return
	}
	if !held {
		switch ev.Kind {
		case event.Finished, event.Aborted:
			n.exp.Publish(ev)
			return
		case event.Delta, event.ForceFinalized, event.SessionReset:
			// A delta is lossy by design; the others come after a turn's
			// end, or outside any: nobody here to show them to.
			return
		}
		v, _ = n.held.LoadOrStore(key, &heldEvents{})
	}
	h := v.(*heldEvents)
	h.mu.Lock()
	defer h.mu.Unlock()
	if ev.RunID != "" && h.run != ev.RunID {
		// What an earlier turn held whose end never went out from here
		// (it was not this replica's to end): nobody will see that turn end.
		n.clearLocked(h)
		h.run = ev.RunID
	}
	switch {
	case n.interest.Wanted(key):
		n.releaseLocked(key, h)
		n.exp.Publish(ev)
	case ev.Kind.Terminal():
		n.clearLocked(h) // nobody wanted them: not numbered
		n.exp.Publish(ev)
	case ev.Kind == event.Delta:
	case len(h.events) >= maxHeld || n.heldN.Load() >= maxHeldTotal:
		h.lost = true
	default:
		ev.Locals = nil // the run's, not the exporter's
		h.events = append(h.events, ev)
		n.heldN.Add(1)
	}
	if ev.Kind.Terminal() {
		h.ended = true
		n.held.CompareAndDelete(key, h)
	}
}

// maxHeld bounds the events held for one session's turn, and maxHeldTotal
// those of all of this replica's turns together, while no other replica
// wants them; past either, a watcher that comes later sees a gap there.
const (
	maxHeld      = 128
	maxHeldTotal = 1 << 16
)

// heldEvents are the events of a session's live turn that nobody on
// another replica wanted when they were published.
type heldEvents struct {
	mu     sync.Mutex
	run    string // the turn they are of
	events []event.Event
	lost   bool // more than maxHeld: the watchers see a gap where they were
	ended  bool // the turn's end went out: a new turn holds anew
}

// releaseLocked publishes what h holds, in order (a frameLost first when
// some did not fit), and leaves it empty. Called with h.mu held.
func (n *Node) releaseLocked(key string, h *heldEvents) {
	if h.lost {
		n.exp.Lost(key)
	}
	for _, ev := range h.events {
		n.exp.Publish(ev)
	}
	n.clearLocked(h)
}

// clearLocked empties h (what it held is never numbered: no gap). Called
// with h.mu held.
func (n *Node) clearLocked(h *heldEvents) {
	n.heldN.Add(-int64(len(h.events)))
	h.events, h.lost = nil, false
}

// dropHeld forgets what key's live turn held (never numbered: no gap).
func (n *Node) dropHeld(key string) {
	if v, ok := n.held.Load(key); ok {
		h := v.(*heldEvents)
		h.mu.Lock()
		n.clearLocked(h)
		h.mu.Unlock()
	}
}

// wanted is Interest.OnWanted: another replica started to want key (""
// every session) mid-turn: what its live turn held goes out now.
func (n *Node) wanted(key string) {
	release := func(k, v any) bool {
		h := v.(*heldEvents)
		h.mu.Lock()
		if !h.ended && n.interest.Wanted(k.(string)) {
			n.releaseLocked(k.(string), h)
		}
		h.mu.Unlock()
		return true
	}
	if key == "" {
		n.held.Range(release)
		return
	}
	if v, ok := n.held.Load(key); ok {
		release(key, v)
	}
}

// Watching tells the other replicas that this replica shows sessionKey's
// events to someone (on) or no longer (off): their turns of it publish
// their live events only while a replica does (see Export). It never
// blocks.
func (n *Node) Watching(sessionKey string, on bool) { n.interest.Watch(sessionKey, on) }

// WatchingAll is Watching for every session (an operator's view of all).
func (n *Node) WatchingAll(on bool) { n.interest.WatchAll(on) }

// WatchedElsewhere reports whether another replica wants sessionKey's
// events now.
func (n *Node) WatchedElsewhere(sessionKey string) bool { return n.interest.Wanted(sessionKey) }

// tookOver exports the end of every turn a takeover ended, then tells
// Options.OnTakeover. It runs on pgcoord's survey goroutine. The ends go
// through an exporter of their own, which this replica's Import does not
// skip: its watchers see them as every other replica's do (the local
// engine never ran those turns, so its bus does not carry their ends).
func (n *Node) tookOver(t pgcoord.Takeover) {
	n.exportEnds(t)
	// from_epoch, not epoch: this replica's lines carry its own epoch as
	// "epoch" (pgcoord's logger), and the two disagreed side by side.
	n.log.Info("cluster: took a dead replica's turns over", "from_replica", t.Replica, "from_epoch", t.Epoch,
		"turns", len(t.Turns), "overdue", t.Overdue)
	if n.opts.OnTakeover != nil {
		n.opts.OnTakeover(t)
	}
}

// left exports the ends of the turns Close's Leave ended (the engine had
// not finished them).
func (n *Node) left(t pgcoord.Takeover) {
	n.exportEnds(t)
	n.log.Warn("cluster: left with turns still running: ended as interrupted", "turns", len(t.Turns))
}

// exportEnds exports an Aborted event (interrupted, with the notice) for
// every turn t ended, and waits until the stream has stored them (or
// takeoverFlush passed): a turn started at once in one of the sessions
// (OnTakeover runs the queued messages) is numbered after these ends.
//
// Each end continues its session's sequence after the stream's last frame
// of it, which takes one stream lookup per session: they are made
// takeoverLookups at a time (adoptEnds), not one after another on the
// exporter's goroutine, and the ends are published as their lookups
// return, the exporter's acknowledgements pipelined (its MaxInFlight).
func (n *Node) exportEnds(t pgcoord.Takeover) {
	now := time.Now()
	for start := 0; start < len(t.Turns); start += takeoverChunk {
		if start > 0 {
			// A takeover of thousands of turns waits for a chunk to be
			// stored before the next, instead of overflowing the
			// exporter's buffer (its watchers would see gaps).
			n.flushEnds(takeoverChunkFlush)
		}
		n.adoptEnds(t.Turns[start:min(start+takeoverChunk, len(t.Turns))], now)
	}
	n.flushEnds(takeoverFlush)
}

// adoptEnds numbers and publishes the ends of turns, takeoverLookups
// sessions at a time: each worker adopts a session (natsbus Adopt: the
// stream lookup and a new tenure after it) and publishes its end. A
// session whose lookup fails is renewed instead, and the exporter's
// goroutine looks it up again (retrying while NATS does not answer).
func (n *Node) adoptEnds(turns []pgcoord.TakenTurn, now time.Time) {
	next := make(chan pgcoord.TakenTurn)
	var wg sync.WaitGroup
	for range min(takeoverLookups, len(turns)) {
		wg.Go(func() {
			for tt := range next {
				ctx, cancel := context.WithTimeout(context.Background(), takeoverLookupTimeout)
				if _, err := n.tkx.Adopt(ctx, tt.SessionKey, 0); err != nil {
					n.tkx.Renew(tt.SessionKey)
				}
				cancel()
				n.tkx.Publish(event.Event{Kind: event.Aborted, RunID: tt.RunID, SessionKey: tt.SessionKey,
					Channel: tt.Channel, ChatRef: tt.ChatRef, StopReason: event.ReasonInterrupted, Message: tt.Notice, Time: now})
			}
		})
	}
	for _, tt := range turns {
		next <- tt
	}
	close(next)
	wg.Wait()
}

// Chunks of a takeover's ends (exportEnds): at most takeoverChunk ends are
// in the takeover exporter's buffer (4096 places; two per end when a
// lookup failed and the end was renewed) at once, their stream lookups
// takeoverLookups at a time.
const (
	takeoverChunk         = 1500
	takeoverChunkFlush    = 30 * time.Second
	takeoverLookups       = 32
	takeoverLookupTimeout = 5 * time.Second
)

// flushEnds waits until the takeover exporter stored what it was given,
// at most d.
func (n *Node) flushEnds(d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := n.tkx.Flush(ctx); err != nil {
		n.log.Warn("cluster: the ends of taken-over turns are not all stored yet (their watchers may see a gap)", "error", err)
	}
}

// Import watches every session and calls h with the events the other
// replicas export, in each session's order, and gap with a session it
// could not deliver in order — for the sessions this replica shows
// (Watching, WatchingAll) or asked another replica about (a forwarded
// send or status, for as long as the other wants it for us); of the
// others, only the ends of their turns, each once, outside any order. If NATS cannot be reached now, it keeps
// trying in the background; events exported before the watch is up are
// not delivered (a client that connects meanwhile loads the history). stop
// ends it; no call follows stop's return.
func (n *Node) Import(h event.Handler, gap func(sessionKey string)) (stop func()) {
	im := &imported{quit: make(chan struct{}), done: make(chan struct{})}
	onGap := func(g *natsbus.GapError) {
		n.log.Warn("cluster: a session's events could not be delivered in order", "session", g.SessionKey, "error", g)
		if gap != nil {
			gap(g.SessionKey)
		}
	}
	// Only the sessions this replica shows are followed (issue 21): of the
	// others, only the ends of turns are decoded and delivered.
	opt := natsbus.WatchOptions{Config: n.cfg, SkipOrigin: n.exp.Origin(), Follow: n.interest.Shows}
	watch := func() (*natsbus.Watcher, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return natsbus.Watch(ctx, n.nc, "", h, onGap, opt)
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		close(im.done)
		return func() {}
	}
	n.watchers[im] = struct{}{}
	n.mu.Unlock()
	w, err := watch()
	if err == nil {
		im.w = w
		close(im.done)
	} else {
		n.log.Error("cluster: cannot watch the other replicas' events yet; retrying", "error", err)
		go im.retry(watch, n.log)
	}
	return func() {
		n.mu.Lock()
		delete(n.watchers, im)
		n.mu.Unlock()
		im.stop()
	}
}

// imported is one Import: its watcher, once it is up.
type imported struct {
	w    *natsbus.Watcher // set before done closes
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

func (im *imported) retry(watch func() (*natsbus.Watcher, error), log *slog.Logger) {
	defer close(im.done)
	wait := 250 * time.Millisecond
	for {
		select {
		case <-im.quit:
			return
		case <-time.After(wait):
		}
		w, err := watch()
		if err == nil {
			log.Info("cluster: watching the other replicas' events")
			im.w = w
			return
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func (im *imported) stop() {
	im.once.Do(func() {
		close(im.quit)
		<-im.done
		if im.w != nil {
			im.w.Stop()
		}
	})
}
