package natsbus

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// InterestOptions tunes an Interest. Replica is required.
type InterestOptions struct {
	Config
	// Replica is this replica's id; its own announcements are ignored.
	Replica string
	// Refresh is how often each replica announces its whole set (a lost
	// change is repaired by the next one); a replica not heard for three
	// of them is forgotten, and a Touch lasts three. Default 2 s.
	Refresh time.Duration
	// OnWanted, if set, is called (on the subscription's goroutine, one
	// call at a time; it must not block long) with each session another
	// replica starts to want, and with "" when one starts to want every
	// session.
	OnWanted func(sessionKey string)
	// OnError, if set, is told of announcements that cannot be sent or
	// read.
	OnError func(error)
}

// maxAnnounced bounds the sessions one announcement names; a replica that
// watches more announces that it wants every session (which costs only
// publishes, never an event).
const maxAnnounced = 4096

// Interest is the cluster's registry of the sessions each replica shows
// to someone (a WebSocket connection watching them), so that an owner
// publishes a turn's live events only when another replica will deliver
// them (issue 21: the rest of the time a turn publishes its end alone).
//
// Each replica announces the changes of its own set at once and the whole
// set every Refresh on a core subject (<prefix>.int, outside the stream)
// that every replica follows; a replica starting asks the others for
// theirs. It is live state, not a record: a lost announcement is repaired
// by the next whole one, a replica gone silent is forgotten, and a request
// another replica forwards about a session (Touch) makes its replica want
// the session at once, before the answer, with no announcement to wait
// for. Its methods are safe for concurrent use.
type Interest struct {
	opt  InterestOptions
	nc   *nats.Conn
	subj string
	sub  *nats.Subscription
	quit chan struct{}
	done chan struct{}
	once sync.Once

	mu       sync.Mutex // local, localAll, asked
	local    map[string]struct{}
	localAll bool
	asked    map[string]time.Time // Asked: until when

	rmu     sync.RWMutex // remotes, counts, allN, touched
	remotes map[string]*remoteInterest
	counts  map[string]int // session → replicas that announced it
	allN    int            // replicas that want every session
	touched map[string]time.Time
	any     atomic.Int64 // len(counts) + allN + len(touched): 0 means nobody wants anything
	anyAll  atomic.Bool  // allN > 0: every session is wanted
}

type remoteInterest struct {
	keys  map[string]struct{}
	all   bool
	heard time.Time
}

// interestMsg is one announcement.
type interestMsg struct {
	Replica string   `json:"r"`
	Hello   bool     `json:"hello,omitempty"` // a replica started: announce in full
	Full    bool     `json:"full,omitempty"`  // Add and All are the replica's whole set
	All     bool     `json:"all,omitempty"`
	Add     []string `json:"add,omitempty"`
	Del     []string `json:"del,omitempty"`
}

// NewInterest starts following the other replicas' announcements on nc
// and asks them for their sets. The caller owns nc; Close the Interest
// before closing nc.
func NewInterest(nc *nats.Conn, opt InterestOptions) (*Interest, error) {
	opt.Config = opt.Config.withDefaults()
	if opt.Refresh <= 0 {
		opt.Refresh = 2 * time.Second
	}
	if opt.Replica == "" {
		return nil, fmt.Errorf("natsbus: interest: no replica id")
	}
	i := &Interest{opt: opt, nc: nc, subj: opt.Prefix + ".int", quit: make(chan struct{}), done: make(chan struct{}),
		local: map[string]struct{}{}, asked: map[string]time.Time{}, remotes: map[string]*remoteInterest{}, counts: map[string]int{}, touched: map[string]time.Time{}}
	sub, err := nc.Subscribe(i.subj, i.receive)
	if err != nil {
		return nil, fmt.Errorf("natsbus: interest: subscribe %s: %w", i.subj, err)
	}
	if err := sub.SetPendingLimits(-1, 64<<20); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("natsbus: interest: %w", err)
	}
	i.sub = sub
	i.send(interestMsg{Hello: true})
	go i.loop()
	return i, nil
}

// Close stops announcing and following. It is safe to call more than once.
func (i *Interest) Close() {
	i.once.Do(func() {
		close(i.quit)
		<-i.done
		_ = i.sub.Unsubscribe()
	})
}

// Watch records that this replica shows sessionKey to someone (on) or no
// longer (off), and announces the change.
func (i *Interest) Watch(sessionKey string, on bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	_, had := i.local[sessionKey]
	switch {
	case on && !had:
		i.local[sessionKey] = struct{}{}
		if len(i.local) <= maxAnnounced {
			i.send(interestMsg{Add: []string{sessionKey}})
		} else if len(i.local) == maxAnnounced+1 {
			i.announceLocked() // now "every session"
		}
	case !on && had:
		delete(i.local, sessionKey)
		if len(i.local) < maxAnnounced {
			i.send(interestMsg{Del: []string{sessionKey}})
		} else if len(i.local) == maxAnnounced {
			i.announceLocked()
		}
	}
}

// WatchAll records that this replica shows every session to someone (on:
// an operator's dashboard) or no longer, and announces it.
func (i *Interest) WatchAll(on bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.localAll != on {
		i.localAll = on
		i.announceLocked()
	}
}

// Asked records that this replica asked another about sessionKey (a
// forwarded status or send, which makes that replica Touch it): Shows
// reports it for as long as the other replica's Touch lasts, three
// Refresh periods.
func (i *Interest) Asked(sessionKey string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.asked[sessionKey] = time.Now().Add(3 * i.opt.Refresh)
}

// Shows reports whether this replica wants sessionKey's events itself: it
// shows the session to someone (Watch, WatchAll) or recently Asked about
// it. It is the filter of this replica's watcher of every session
// (WatchOptions.Follow), called once per frame: one uncontended lock.
func (i *Interest) Shows(sessionKey string) bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.localAll {
		return true
	}
	if _, ok := i.local[sessionKey]; ok {
		return true
	}
	until, ok := i.asked[sessionKey]
	return ok && time.Now().Before(until)
}

// Touch makes replica want sessionKey now, for three Refresh periods (its
// announcements keep it wanted after that while it watches): a replica
// asking this one about a session it is about to show. OnWanted is not
// called: the caller knows.
func (i *Interest) Touch(replica, sessionKey string) {
	if replica == i.opt.Replica {
		return
	}
	i.rmu.Lock()
	i.touched[sessionKey] = time.Now().Add(3 * i.opt.Refresh)
	i.recount()
	i.rmu.Unlock()
}

// Wanted reports whether another replica wants sessionKey's events. It
// takes no lock while nobody wants anything, or somebody everything.
func (i *Interest) Wanted(sessionKey string) bool {
	if i.any.Load() == 0 {
		return false
	}
	if i.anyAll.Load() {
		return true
	}
	i.rmu.RLock()
	defer i.rmu.RUnlock()
	if i.allN > 0 || i.counts[sessionKey] > 0 {
		return true
	}
	until, ok := i.touched[sessionKey]
	return ok && time.Now().Before(until)
}

// recount is called with rmu held.
func (i *Interest) recount() {
	i.any.Store(int64(len(i.counts) + i.allN + len(i.touched)))
	i.anyAll.Store(i.allN > 0)
}

// announceLocked sends the whole local set; called with i.mu held.
func (i *Interest) announceLocked() {
	m := interestMsg{Full: true, All: i.localAll || len(i.local) > maxAnnounced}
	if !m.All {
		m.Add = make([]string, 0, len(i.local))
		for k := range i.local {
			m.Add = append(m.Add, k)
		}
	}
	i.send(m)
}

func (i *Interest) send(m interestMsg) {
	m.Replica = i.opt.Replica
	b, err := json.Marshal(m)
	if err == nil {
		err = i.nc.Publish(i.subj, b)
	}
	if err != nil && i.opt.OnError != nil {
		i.opt.OnError(fmt.Errorf("natsbus: interest: announce: %w", err))
	}
}

// loop announces the whole set every Refresh and forgets what expired.
func (i *Interest) loop() {
	defer close(i.done)
	t := time.NewTicker(i.opt.Refresh)
	defer t.Stop()
	for {
		select {
		case <-i.quit:
			return
		case <-t.C:
		}
		now := time.Now()
		i.mu.Lock()
		i.announceLocked()
		for k, until := range i.asked {
			if !now.Before(until) {
				delete(i.asked, k)
			}
		}
		i.mu.Unlock()
		i.expire(now)
	}
}

// expire forgets replicas not heard for three Refresh periods and
// touches past their time.
func (i *Interest) expire(now time.Time) {
	i.rmu.Lock()
	defer i.rmu.Unlock()
	for r, ri := range i.remotes {
		if now.Sub(ri.heard) > 3*i.opt.Refresh {
			i.setRemote(r, nil, false, nil)
		}
	}
	for k, until := range i.touched {
		if !now.Before(until) {
			delete(i.touched, k)
		}
	}
	i.recount()
}

// receive applies another replica's announcement.
func (i *Interest) receive(msg *nats.Msg) {
	var m interestMsg
	if err := json.Unmarshal(msg.Data, &m); err != nil {
		if i.opt.OnError != nil {
			i.opt.OnError(fmt.Errorf("natsbus: interest: an announcement that is not one: %w", err))
		}
		return
	}
	if m.Replica == i.opt.Replica || m.Replica == "" {
		return
	}
	if m.Hello {
		i.mu.Lock()
		i.announceLocked()
		i.mu.Unlock()
		return
	}
	var fresh []string
	i.rmu.Lock()
	ri := i.remotes[m.Replica]
	if m.Full {
		keys := make(map[string]struct{}, len(m.Add))
		for _, k := range m.Add {
			keys[k] = struct{}{}
		}
		fresh = i.setRemote(m.Replica, keys, m.All, fresh)
	} else {
		if ri == nil {
			ri = &remoteInterest{keys: map[string]struct{}{}}
			i.remotes[m.Replica] = ri
		}
		for _, k := range m.Add {
			if _, ok := ri.keys[k]; !ok {
				ri.keys[k] = struct{}{}
				if i.counts[k]++; i.counts[k] == 1 && i.allN == 0 {
					fresh = append(fresh, k)
				}
			}
		}
		for _, k := range m.Del {
			if _, ok := ri.keys[k]; ok {
				delete(ri.keys, k)
				i.drop(k)
			}
		}
	}
	if ri = i.remotes[m.Replica]; ri != nil {
		ri.heard = time.Now()
	}
	i.recount()
	i.rmu.Unlock()
	if i.opt.OnWanted != nil {
		for _, k := range fresh {
			i.opt.OnWanted(k)
		}
	}
}

// setRemote replaces replica's set (keys nil and all false: forgets it)
// and appends to fresh the sessions nobody wanted before ("" for every
// session). Called with rmu held.
func (i *Interest) setRemote(replica string, keys map[string]struct{}, all bool, fresh []string) []string {
	old := i.remotes[replica]
	if old == nil {
		old = &remoteInterest{keys: map[string]struct{}{}}
	}
	if all && !old.all {
		if i.allN++; i.allN == 1 {
			fresh = append(fresh, "")
		}
	}
	if !all && old.all {
		i.allN--
	}
	for k := range old.keys {
		if _, ok := keys[k]; !ok {
			i.drop(k)
		}
	}
	for k := range keys {
		if _, ok := old.keys[k]; !ok {
			if i.counts[k]++; i.counts[k] == 1 && i.allN == 0 {
				fresh = append(fresh, k)
			}
		}
	}
	if keys == nil && !all {
		delete(i.remotes, replica)
		return fresh
	}
	i.remotes[replica] = &remoteInterest{keys: keys, all: all, heard: old.heard}
	return fresh
}

// drop removes one replica's announcement of k. Called with rmu held.
func (i *Interest) drop(k string) {
	if i.counts[k]--; i.counts[k] <= 0 {
		delete(i.counts, k)
	}
}
