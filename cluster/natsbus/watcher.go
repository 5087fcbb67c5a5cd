package natsbus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnguard/turnguard/event"
)

// GapReason says why a watcher could not deliver a session's sequence.
type GapReason uint8

const (
	// GapUnrepaired: frames were missing on the wire and the stream did
	// not have them within RepairTimeout (aged out, lost with a node, never
	// stored, or the stream unreachable).
	GapUnrepaired GapReason = iota + 1
	// GapLost: the exporter dropped events before numbering them (its
	// buffer was full); a frameLost stands in their place.
	GapLost
	// GapConflict: a new owner numbered the session from an earlier point
	// than what this watcher has delivered: the two owners disagree about
	// what happened, and only the store can tell.
	GapConflict
	// GapOverflow: more frames arrived ahead of a gap than the watcher
	// holds (MaxAhead).
	GapOverflow
)

func (r GapReason) String() string {
	switch r {
	case GapUnrepaired:
		return "unrepaired"
	case GapLost:
		return "lost at the source"
	case GapConflict:
		return "owners conflict"
	case GapOverflow:
		return "too far ahead"
	}
	return "unknown"
}

// GapError is what OnGap receives: the watcher cannot deliver the session's
// events after Delivered. A WebSocket connection closes with 1012 on it and
// its client reloads the history. After OnGap the watcher follows the
// session afresh from the next frame it receives.
type GapError struct {
	SessionKey string
	Reason     GapReason
	Delivered  uint64 // the last sequence delivered in order
	Next       uint64 // the sequence the watcher had reached when it gave up (0: unknown)
	Err        error  // the last repair error, if any
}

func (e *GapError) Error() string {
	s := fmt.Sprintf("natsbus: session %q: gap after seq %d (%s", e.SessionKey, e.Delivered, e.Reason)
	if e.Next > 0 {
		s += fmt.Sprintf(", next seen %d", e.Next)
	}
	s += ")"
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *GapError) Unwrap() error { return e.Err }

// WatchOptions tunes a Watcher. The zero value is the defaults.
type WatchOptions struct {
	Config
	// Replay, for a watcher of one session: deliver the kept events after
	// sequence After (0: from the first), repairing from the stream those
	// published before Watch. Without it the watcher starts at the first
	// frame it receives.
	Replay bool
	After  uint64
	// RepairTimeout is how long a gap may stay open — waiting for the
	// missing frames on the wire or in the stream (its leader may be
	// changing after a node's loss, which takes seconds) — before OnGap.
	// Default 5 s.
	RepairTimeout time.Duration
	// TailCheck: a session whose last delivered event is not terminal and
	// that has been silent this long is checked against the stream's last
	// frame (its last event may have been lost on the wire). Default 2 s.
	TailCheck time.Duration
	// MaxAhead bounds the frames held per session while a gap is open.
	// Default 4096.
	MaxAhead int
	// Buffer is the subscription's channel capacity; past it NATS drops
	// messages for this watcher (detected: every session is checked).
	// Default 65536.
	Buffer int
	// SkipOrigin, when set, is an Exporter's Origin: the frames that
	// exporter published still count in their sessions' sequences (so
	// another owner's frames that follow them are in order) but their
	// events are not delivered. A replica watching every session sets its
	// own exporter's, so it hears only the other replicas' events. Such a
	// frame is never decoded whole: its head (peekFrame) is what its
	// session's sequence needs.
	SkipOrigin string
	// Follow, for a watcher of every session, names the sessions it
	// delivers in sequence: those this replica shows to someone (issue
	// 21: each replica receives every session's frames, and most are of
	// sessions it shows nobody). nil follows every session. Of a session
	// it does not follow, the watcher delivers only the ends of turns
	// (a terminal event not of SkipOrigin), each once per tenure and
	// sequence, outside any sequence check (no gap is repaired or
	// reported); its other frames are dropped after their head, never
	// decoded. A session it starts to follow is followed afresh from the
	// next frame it receives, as a session it had never heard of; one it
	// stops following is forgotten but for its last end. Follow is called
	// on the watcher's goroutine for each frame: it must be quick and
	// must not block.
	Follow func(sessionKey string) bool
}

func (o WatchOptions) withDefaults() WatchOptions {
	o.Config = o.Config.withDefaults()
	if o.RepairTimeout <= 0 {
		o.RepairTimeout = 5 * time.Second
	}
	if o.TailCheck <= 0 {
		o.TailCheck = 2 * time.Second
	}
	if o.MaxAhead <= 0 {
		o.MaxAhead = 4096
	}
	if o.Buffer <= 0 {
		o.Buffer = 1 << 16
	}
	return o
}

// WatcherStats are a watcher's counters.
type WatcherStats struct {
	Delivered     uint64 // kept events handed to the handler
	Deltas        uint64 // deltas handed to the handler
	Late          uint64 // duplicate or late frames dropped
	DeltasDropped uint64 // deltas dropped (stale, or a gap open)
	Repaired      uint64 // frames fetched from the stream to fill a gap
	Gaps          uint64 // OnGap calls
	Skipped       uint64 // kept events of SkipOrigin passed in sequence, not delivered
	Decoded       uint64 // frames decoded whole (a SkipOrigin frame and a frame not followed never are)
	Unfollowed    uint64 // frames of sessions not followed (WatchOptions.Follow) dropped after their head
}

// Watcher delivers the events of one session, or of all, from the wire,
// in per-session sequence order. Create it with Watch; Stop it.
//
// One goroutine owns all of a watcher's state: it reads the subscription,
// repairs gaps (a repair's round trips to the stream hold back the
// watcher's other sessions meanwhile) and calls the handlers, one at a
// time. Handlers must not block, as on event.Bus.
type Watcher struct {
	opt    WatchOptions
	nc     *nats.Conn
	stream jetstream.Stream
	key    string // "" = every session
	h      event.Handler
	onGap  func(*GapError)

	sub  *nats.Subscription
	msgs chan *nats.Msg
	quit chan struct{}
	done chan struct{}

	sessions map[string]*watchSession
	live     map[string]*watchSession // sessions with a turn running or a gap open: the ticker looks at these
	stats    WatcherStats
	statsC   chan chan WatcherStats
}

type watchSession struct {
	key  string
	subj subjects

	// loose: the watcher does not follow the session (WatchOptions.Follow)
	// and delivers only its turns' ends; endTenure and endSeq are the
	// last one's, to drop it when it comes again.
	loose     bool
	endTenure string
	endSeq    uint64

	started   bool
	d         uint64 // last sequence delivered (or passed: sync frames)
	tenure    string // tenure of the frame at d ("" after Replay: any)
	old       []string
	terminal  bool // the event at d ended its turn (or nothing runs)
	heard     time.Time
	runID     string
	runSeq    uint64 // Event.Seq of the newest event delivered for runID
	hintSeq   uint64 // a stored frame's session and stream sequence,
	hintStrm  uint64 // hintSeq <= d: where a repair starts walking
	ahead     map[uint64]frame
	gapSince  time.Time
	lastError error
}

// Watch subscribes nc to sessionKey's frames ("" for every session) and
// calls h with each event in sequence order and onGap when a gap cannot be
// repaired. Events published before Watch returns are delivered only with
// opt.Replay (one session). The caller owns nc.
func Watch(ctx context.Context, nc *nats.Conn, sessionKey string, h event.Handler, onGap func(*GapError), opt WatchOptions) (*Watcher, error) {
	opt = opt.withDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("natsbus: watch: %w", err)
	}
	s, err := js.Stream(ctx, opt.Stream)
	if err != nil {
		return nil, fmt.Errorf("natsbus: watch: stream %s: %w", opt.Stream, err)
	}
	w := &Watcher{opt: opt, nc: nc, stream: s, key: sessionKey, h: h, onGap: onGap,
		msgs: make(chan *nats.Msg, opt.Buffer), quit: make(chan struct{}), done: make(chan struct{}),
		sessions: map[string]*watchSession{}, live: map[string]*watchSession{}, statsC: make(chan chan WatcherStats)}
	subject := opt.Prefix + ".*.*.*"
	if sessionKey != "" {
		subject = subjectsFor(opt.Prefix, sessionKey).both
	}
	w.sub, err = nc.ChanSubscribe(subject, w.msgs)
	if err != nil {
		return nil, fmt.Errorf("natsbus: watch: subscribe %s: %w", subject, err)
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		w.sub.Unsubscribe()
		return nil, fmt.Errorf("natsbus: watch: flush: %w", err)
	}
	var first *watchSession
	if sessionKey != "" && opt.Replay {
		first = w.session(sessionKey)
		first.started, first.d = true, opt.After
	}
	go w.run(first)
	return w, nil
}

// Stop unsubscribes and waits for the watcher's goroutine; no handler runs
// after it returns. It is safe to call more than once.
func (w *Watcher) Stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
	_ = w.sub.Unsubscribe()
}

// Stats returns the watcher's counters (zero once it has stopped).
func (w *Watcher) Stats() WatcherStats {
	c := make(chan WatcherStats, 1)
	select {
	case w.statsC <- c:
		return <-c
	case <-w.done:
		return WatcherStats{}
	}
}

func (w *Watcher) session(key string) *watchSession {
	s := w.sessions[key]
	if s == nil {
		s = &watchSession{key: key, subj: subjectsFor(w.opt.Prefix, key), terminal: true}
		w.sessions[key] = s
	}
	return s
}

func (w *Watcher) run(first *watchSession) {
	defer close(w.done)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	reconnects := w.nc.Stats().Reconnects
	dropped, _ := w.sub.Dropped()
	if first != nil {
		w.checkTail(first) // Replay: fetch what was published before Watch
	}
	for {
		select {
		case <-w.quit:
			return
		case c := <-w.statsC:
			c <- w.stats
		case m := <-w.msgs:
			w.receive(m)
		case now := <-tick.C:
			// A reconnect or messages NATS dropped for us: anything may be
			// missing; check every session against the stream.
			r := w.nc.Stats().Reconnects
			dr, _ := w.sub.Dropped()
			if r != reconnects || dr != dropped {
				reconnects, dropped = r, dr
				for _, s := range w.sessions {
					if s.started && w.follows(s.key) {
						w.checkTail(s)
					}
				}
			}
			for _, s := range w.live {
				if !w.follows(s.key) {
					w.unfollow(s)
					continue
				}
				switch {
				case len(s.ahead) > 0:
					w.repair(s)
				case s.started && now.Sub(s.heard) >= w.opt.TailCheck:
					w.checkTail(s)
				}
			}
		}
	}
}

func (w *Watcher) receive(m *nats.Msg) {
	h, err := peekFrame(m.Data)
	if err != nil {
		w.stats.Late++ // not ours to deliver; nothing to repair from
		return
	}
	if w.key != "" && string(h.key) != w.key {
		return // a hash collision, or a foreign publisher
	}
	s := w.sessions[string(h.key)] // no copy of the key for a session already known
	var key string
	if s != nil {
		key = s.key
	} else {
		key = string(h.key)
	}
	own := w.skippedBytes(h.tenure)
	if !w.follows(key) {
		w.loose(s, key, &h, own, m.Data)
		return
	}
	if s == nil {
		s = w.session(key)
	} else if s.loose {
		*s = watchSession{key: s.key, subj: s.subj, terminal: true} // followed afresh
	}
	s.heard = time.Now()
	var f frame
	switch {
	case own && h.kind == frameDelta:
		return // never delivered, and a delta has no place in the sequence
	case own:
		f = s.headFrame(&h)
	default:
		if f, err = decodeFrame(m.Data); err != nil {
			w.stats.Late++
			return
		}
		w.stats.Decoded++
	}
	if f.kind == frameDelta {
		w.delta(s, &f)
		return
	}
	w.offer(s, f)
	w.drain(s)
	w.repair(s)
}

// follows says whether the watcher delivers key's events in sequence
// (WatchOptions.Follow).
func (w *Watcher) follows(key string) bool {
	return w.key != "" || w.opt.Follow == nil || w.opt.Follow(key)
}

// loose takes a frame of a session the watcher does not follow (s may be
// nil): a turn's end that is not SkipOrigin's is delivered, once; anything
// else is dropped undecoded.
func (w *Watcher) loose(s *watchSession, key string, h *head, own bool, data []byte) {
	if s != nil && !s.loose {
		w.unfollow(s)
	}
	if own || h.kind != frameEvent || !h.evKind.Terminal() {
		w.stats.Unfollowed++
		return
	}
	if s == nil {
		s = w.session(key)
		s.loose = true
	}
	if string(h.tenure) == s.endTenure && h.seq <= s.endSeq {
		w.stats.Late++ // a publish retried after an ack timeout
		return
	}
	f, err := decodeFrame(data)
	if err != nil {
		w.stats.Late++
		return
	}
	w.stats.Decoded++
	s.endTenure, s.endSeq = f.tenure, f.seq
	w.stats.Delivered++
	w.h(f.ev)
}

// unfollow forgets s's sequence: the watcher no longer follows it. What it
// delivered last stands as its last end, so that end is not delivered
// again.
func (w *Watcher) unfollow(s *watchSession) {
	*s = watchSession{key: s.key, subj: s.subj, terminal: true, loose: true, endTenure: s.tenure, endSeq: s.d}
	delete(w.live, s.key)
}

// headFrame is the frame h heads, with only what its place in s's sequence
// needs (SkipOrigin's frames, never delivered). The strings s already
// holds are reused, not copied again.
func (s *watchSession) headFrame(h *head) frame {
	f := frame{kind: h.kind, seq: h.seq, base: h.base, hintSeq: h.hintSeq, hintStream: h.hintStream, tenure: s.tenure}
	if string(h.tenure) != s.tenure {
		f.tenure = string(h.tenure)
	}
	f.ev = event.Event{Kind: h.evKind, SessionKey: s.key, Seq: h.evSeq, RunID: s.runID}
	if string(h.runID) != s.runID {
		f.ev.RunID = string(h.runID)
	}
	return f
}

// track keeps the live set: sessions whose turn runs or that have a gap.
func (w *Watcher) track(s *watchSession) {
	if !s.terminal || len(s.ahead) > 0 {
		w.live[s.key] = s
	} else {
		delete(w.live, s.key)
	}
}

func (w *Watcher) delta(s *watchSession, f *frame) {
	if !s.started || len(s.ahead) > 0 || f.seq != s.d || (s.tenure != "" && f.tenure != s.tenure) ||
		(f.ev.RunID == s.runID && f.ev.Seq <= s.runSeq) {
		w.stats.DeltasDropped++
		return
	}
	if w.skipped(f.tenure) {
		return
	}
	s.runID, s.runSeq = f.ev.RunID, f.ev.Seq
	w.stats.Deltas++
	w.h(f.ev)
}

// offer takes a kept frame from the wire or the stream: it starts the
// session, is dropped as late, or waits in ahead for its turn.
func (w *Watcher) offer(s *watchSession, f frame) {
	if !s.started {
		s.started, s.d, s.tenure = true, f.seq-1, f.tenure
	}
	if s.isOld(f.tenure) {
		w.stats.Late++
		return
	}
	if s.tenure != "" && f.tenure != s.tenure && f.base < s.d {
		// A tenure we have not followed continues from before what we
		// delivered: its frames up to d are not the ones we delivered.
		w.gap(s, GapConflict, f.seq)
		return
	}
	if f.seq <= s.d {
		w.stats.Late++
		return
	}
	if _, ok := s.ahead[f.seq]; ok {
		w.stats.Late++
		return
	}
	if f.seq == s.d+1 && len(s.ahead) == 0 {
		w.next(s, &f) // the next one, nothing held: passed at once, never held in ahead
		return
	}
	if len(s.ahead) >= w.opt.MaxAhead {
		w.gap(s, GapOverflow, f.seq)
		return
	}
	if s.ahead == nil {
		s.ahead = map[uint64]frame{}
	}
	s.ahead[f.seq] = f
}

// skipped says whether a frame of tenure comes from SkipOrigin's exporter.
func (w *Watcher) skipped(tenure string) bool {
	o := w.opt.SkipOrigin
	return o != "" && len(tenure) > len(o) && tenure[len(o)] == '.' && tenure[:len(o)] == o
}

// skippedBytes is skipped of a tenure still in the message.
func (w *Watcher) skippedBytes(tenure []byte) bool {
	o := w.opt.SkipOrigin
	return o != "" && len(tenure) > len(o) && tenure[len(o)] == '.' && string(tenure[:len(o)]) == o
}

func (s *watchSession) isOld(tenure string) bool {
	for _, t := range s.old {
		if t == tenure {
			return true
		}
	}
	// An earlier tenure of the exporter whose tenure we follow: each
	// exporter numbers its tenures in order (Origin "." counter), and an
	// owner renews its tenure at every claim, so a frame of one of its
	// tenures from before the last few we remember — a publish retried
	// after an ack timeout reaches core subscribers again — is late, not
	// a new owner numbering from an earlier point.
	return earlierTenure(tenure, s.tenure)
}

// earlierTenure reports whether tenure a was numbered by the same exporter
// as tenure b, before it.
func earlierTenure(a, b string) bool {
	if a == b {
		return false // the common case, without parsing
	}
	ia, ib := strings.LastIndexByte(a, '.'), strings.LastIndexByte(b, '.')
	if ia <= 0 || ib <= 0 || a[:ia] != b[:ib] {
		return false
	}
	na, errA := strconv.ParseUint(a[ia+1:], 36, 64)
	nb, errB := strconv.ParseUint(b[ib+1:], 36, 64)
	return errA == nil && errB == nil && na < nb
}

// drain delivers the frames that follow d.
func (w *Watcher) drain(s *watchSession) {
	for {
		f, ok := s.ahead[s.d+1]
		if !ok {
			break
		}
		delete(s.ahead, f.seq)
		if s.isOld(f.tenure) { // read from the stream: a superseded owner's
			w.stats.Late++
			break
		}
		if !w.next(s, &f) {
			return
		}
	}
	if len(s.ahead) == 0 {
		s.gapSince, s.lastError = time.Time{}, nil
	} else if s.gapSince.IsZero() {
		s.gapSince = time.Now()
	}
}

// next passes f, the frame after s.d (not of an old tenure), delivering
// its event unless it is SkipOrigin's. It returns false when it reported
// a gap instead (s starts afresh).
func (w *Watcher) next(s *watchSession, f *frame) bool {
	if s.tenure != "" && f.tenure != s.tenure {
		if f.base != s.d {
			w.gap(s, GapConflict, f.seq)
			return false
		}
		s.old = append(s.old, s.tenure)
		if len(s.old) > 4 {
			s.old = s.old[1:]
		}
	}
	s.tenure = f.tenure
	s.d = f.seq
	if f.hintSeq > s.hintSeq && f.hintSeq <= s.d {
		s.hintSeq, s.hintStrm = f.hintSeq, f.hintStream
	}
	switch f.kind {
	case frameLost:
		w.gap(s, GapLost, f.seq)
		return false
	case frameSync:
	default:
		s.terminal = f.ev.Kind.Terminal() || f.ev.Kind == event.ForceFinalized || f.ev.Kind == event.SessionReset
		s.runID, s.runSeq = f.ev.RunID, f.ev.Seq
		if w.skipped(f.tenure) {
			w.stats.Skipped++
			return true
		}
		w.stats.Delivered++
		w.h(f.ev)
	}
	return true
}

// repair fetches the missing frames (d+1 up to the first frame held
// ahead) from the stream, walking the session's subject from the newest
// known stream position at or before d. Past RepairTimeout it reports the
// gap.
func (w *Watcher) repair(s *watchSession) {
	defer w.track(s)
	if len(s.ahead) == 0 {
		return
	}
	want := ^uint64(0)
	for seq := range s.ahead {
		want = min(want, seq)
	}
	err := w.walk(s, want)
	w.drain(s)
	if len(s.ahead) == 0 {
		return
	}
	if err != nil {
		s.lastError = err
	}
	if time.Since(s.gapSince) >= w.opt.RepairTimeout {
		w.gap(s, GapUnrepaired, want)
	}
}

// walk reads the session's stored frames from the repair hint on until it
// has every sequence in (d, until) or the subject ends.
func (w *Watcher) walk(s *watchSession, until uint64) error {
	from := uint64(1)
	if s.hintSeq > 0 && s.hintSeq <= s.d {
		from = s.hintStrm + 1
	}
	missing := until - s.d - 1
	limit := w.opt.MaxMsgsPerSubject + int64(missing) + 16
	ctx, cancel := context.WithTimeout(context.Background(), w.opt.RepairTimeout)
	defer cancel()
	for i := int64(0); i < limit && missing > 0; i++ {
		m, err := w.stream.GetMsg(ctx, from, jetstream.WithGetMsgSubject(s.subj.kept))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("natsbus: repair %s from stream seq %d: %w", s.subj.kept, from, err)
		}
		from = m.Sequence + 1
		f, err := decodeFrame(m.Data)
		if err != nil || (f.kind == frameEvent && f.ev.SessionKey != s.key) {
			continue
		}
		if f.seq > s.d && f.seq < until {
			if _, ok := s.ahead[f.seq]; !ok {
				w.stats.Repaired++
				missing--
				s.ahead[f.seq] = f
			}
		}
		if f.seq <= s.d && f.seq > s.hintSeq {
			s.hintSeq, s.hintStrm = f.seq, m.Sequence
		}
	}
	return nil
}

// checkTail asks the stream for the session's last frame: if it is past
// what was delivered, the frames in between are repaired.
func (w *Watcher) checkTail(s *watchSession) {
	s.heard = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), w.opt.RepairTimeout)
	defer cancel()
	m, err := w.stream.GetLastMsgForSubject(ctx, s.subj.kept)
	if err != nil {
		w.track(s)
		return // nothing stored, or not reachable now: the next check or frame tells
	}
	f, err := decodeFrame(m.Data)
	if err != nil || f.seq <= s.d {
		w.track(s)
		return
	}
	w.offer(s, f)
	w.drain(s)
	w.repair(s)
}

// gap reports the session's gap and starts it afresh.
func (w *Watcher) gap(s *watchSession, r GapReason, next uint64) {
	w.stats.Gaps++
	err := &GapError{SessionKey: s.key, Reason: r, Delivered: s.d, Next: next, Err: s.lastError}
	*s = watchSession{key: s.key, subj: s.subj, terminal: true, heard: time.Now()}
	delete(w.live, s.key)
	if w.onGap != nil {
		w.onGap(err)
	}
}
