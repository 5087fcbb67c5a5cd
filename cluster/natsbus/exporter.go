package natsbus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/turnguard/turnguard/event"
)

// ExporterOptions tunes an Exporter. The zero value is the defaults.
type ExporterOptions struct {
	Config
	// Buffer is how many events wait between Publish and the network.
	// When it is full Publish drops the event (counted in Stats.Dropped);
	// a dropped kept event becomes a frameLost, so its watchers learn of
	// it. Default 65536.
	Buffer int
	// MaxInFlight bounds the kept frames published and not yet
	// acknowledged by the stream. Default 4096.
	MaxInFlight int
	// AckTimeout is how long one publish waits for the stream's
	// acknowledgement. Default 5 s.
	AckTimeout time.Duration
	// Retries is how many times a kept frame that was not acknowledged is
	// published again (with the same Nats-Msg-Id, so the stream stores it
	// once) before it counts as failed. Default 3.
	Retries int
	// OnError, if set, is called with a *PublishError for every kept event
	// the exporter could not store or dropped. It is called on the
	// exporter's goroutines and must not block.
	OnError func(error)
}

func (o ExporterOptions) withDefaults() ExporterOptions {
	o.Config = o.Config.withDefaults()
	if o.Buffer <= 0 {
		o.Buffer = 1 << 16
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 4096
	}
	if o.AckTimeout <= 0 {
		o.AckTimeout = 5 * time.Second
	}
	if o.Retries <= 0 {
		o.Retries = 3
	}
	return o
}

// PublishError reports a kept event that did not reach the stream: after
// Retries publishes without an acknowledgement (Seq > 0), or dropped by a
// full buffer before it was numbered (Seq == 0). Watchers of the session
// see a gap there and report it; the error is for operators.
type PublishError struct {
	SessionKey string
	Kind       event.Kind
	Seq        uint64
	Err        error
}

func (e *PublishError) Error() string {
	if e.Seq == 0 {
		return fmt.Sprintf("natsbus: %s event of session %q dropped: %v", e.Kind, e.SessionKey, e.Err)
	}
	return fmt.Sprintf("natsbus: %s event %d of session %q not stored: %v", e.Kind, e.Seq, e.SessionKey, e.Err)
}

func (e *PublishError) Unwrap() error { return e.Err }

// ErrBufferFull is the cause of a PublishError for an event Publish
// dropped because the exporter's buffer was full.
var ErrBufferFull = errors.New("exporter buffer full")

// ErrClosed is the cause for an event published after Close.
var ErrClosed = errors.New("exporter closed")

// ExporterStats are an Exporter's counters since it was created.
type ExporterStats struct {
	Published     uint64 // kept frames handed to NATS (events, lost and sync frames; retries not counted)
	Acked         uint64 // kept frames the stream acknowledged
	Failed        uint64 // kept frames not acknowledged after Retries
	Dropped       uint64 // events (kept or delta) Publish dropped: buffer full or closed
	Deltas        uint64 // deltas published
	DeltasDropped uint64 // deltas not sent: not connected, no kept event yet, or a write error
	Queued        int    // events waiting in the buffer now
}

// Exporter is the owner side: it numbers each session's kept events and
// publishes them to the stream, and its deltas to a core subject.
//
// Publish never waits on the network: it copies the event into a bounded
// buffer and returns (about a hundred nanoseconds). One goroutine numbers
// and publishes asynchronously; another collects the stream's
// acknowledgements, retries what was not acknowledged and records where the
// stream put each frame (the repair hint that later frames carry). When
// NATS is slow the in-flight frames (MaxInFlight), then the buffer, fill;
// past that Publish drops events and counts them. No kept event is lost
// silently: each dropped or unstored one is counted, reported to OnError,
// and made visible to watchers by a frameLost or frameSync in its
// session's sequence.
type Exporter struct {
	opt    ExporterOptions
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream

	queue    chan event.Event
	inflight chan *pending
	quit     chan struct{} // Close: drain and stop
	abort    chan struct{} // Close's ctx ended: stop waiting on the network
	done     chan struct{} // both goroutines have returned
	closing  atomic.Bool
	once     sync.Once

	tenurePrefix string
	tenureN      atomic.Uint64

	mu       sync.Mutex
	sessions map[string]*expSession
	lost     map[string]uint64 // session → events dropped unnumbered, owing a frameLost
	unsynced map[string]bool   // sessions owing a frameSync
	owe      atomic.Bool       // lost or unsynced is not empty
	settled  uint64            // kept events stored or failed (Flush)
	settledC chan struct{}     // closed at the next settle; nil when no Flush waits
	accepted atomic.Uint64     // kept events Publish queued

	published, acked, failed, dropped, deltas, deltasDropped atomic.Uint64
}

// expSession is the exporter's numbering of one session it owns. Guarded
// by Exporter.mu.
type expSession struct {
	key        string
	subj       subjects
	tenure     string
	base, seq  uint64
	hintSeq    uint64
	hintStream uint64
	used       time.Time
}

type pending struct {
	st   *expSession
	kind event.Kind
	seq  uint64
	msg  *nats.Msg
	id   string
	fut  jetstream.PubAckFuture
	err  error // the async publish was refused outright
}

// NewExporter ensures the stream (EnsureStream) and starts the exporter on
// nc. The caller owns nc; Close the exporter before closing nc.
func NewExporter(ctx context.Context, nc *nats.Conn, opt ExporterOptions) (*Exporter, error) {
	opt = opt.withDefaults()
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(opt.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(opt.AckTimeout))
	if err != nil {
		return nil, fmt.Errorf("natsbus: exporter: %w", err)
	}
	s, err := EnsureStream(ctx, js, opt.Config)
	if err != nil {
		return nil, err
	}
	x := &Exporter{
		opt:          opt,
		nc:           nc,
		js:           js,
		stream:       s,
		queue:        make(chan event.Event, opt.Buffer),
		inflight:     make(chan *pending, opt.MaxInFlight),
		quit:         make(chan struct{}),
		abort:        make(chan struct{}),
		done:         make(chan struct{}),
		tenurePrefix: nuid.Next(),
		sessions:     map[string]*expSession{},
		lost:         map[string]uint64{},
		unsynced:     map[string]bool{},
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); x.run() }()
	go func() { defer wg.Done(); x.collect() }()
	go func() { wg.Wait(); close(x.done) }()
	return x, nil
}

// Publish hands ev to the exporter; it has the signature of an
// event.Handler, for event.Bus.Subscribe. It never blocks: a full buffer,
// or a closed exporter, drops the event (counted; a kept one reported to
// OnError and shown to watchers as a frameLost). Locals are not carried.
func (x *Exporter) Publish(ev event.Event) {
	if ev.Kind == 0 {
		return // not an event (Kind 0 marks a Renew in the buffer)
	}
	ev.Locals = nil
	if !x.closing.Load() {
		select {
		case x.queue <- ev:
			if ev.Kind != event.Delta {
				x.accepted.Add(1)
			}
			return
		default:
		}
		x.refuse(ev, ErrBufferFull)
		return
	}
	x.refuse(ev, ErrClosed)
}

func (x *Exporter) refuse(ev event.Event, cause error) {
	x.dropped.Add(1)
	if ev.Kind == event.Delta {
		return
	}
	x.mu.Lock()
	x.lost[ev.SessionKey]++
	x.owe.Store(true)
	x.mu.Unlock()
	x.report(&PublishError{SessionKey: ev.SessionKey, Kind: ev.Kind, Err: cause})
}

// Lost records that kept events of sessionKey were left out of its
// sequence by the caller (not handed to Publish): the session's next
// frame is a frameLost, so its watchers see a gap there (and reload)
// instead of missing them silently.
func (x *Exporter) Lost(sessionKey string) {
	x.mu.Lock()
	x.lost[sessionKey]++
	x.owe.Store(true)
	x.mu.Unlock()
}

func (x *Exporter) report(err error) {
	if x.opt.OnError != nil {
		x.opt.OnError(err)
	}
}

// Adopt makes the exporter the session's owner from now on, under a new
// tenure that continues after max(lastSeq, the sequence of the stream's
// last frame of the session); it returns that sequence. A new owner calls
// it at takeover with what it knows (lastSeq, e.g. kept beside the
// session's ownership; 0 if nothing) before publishing the session's
// events; without it, the first event of a session the exporter does not
// know looks the stream up the same way on the exporter's goroutine.
func (x *Exporter) Adopt(ctx context.Context, sessionKey string, lastSeq uint64) (uint64, error) {
	subj := subjectsFor(x.opt.Prefix, sessionKey)
	learned, err := x.lastSeq(ctx, subj.kept)
	if err != nil {
		return 0, err
	}
	base := max(learned, lastSeq)
	x.mu.Lock()
	x.sessions[sessionKey] = x.newSession(sessionKey, subj, base)
	x.mu.Unlock()
	return base, nil
}

// Origin names this exporter in its frames: every tenure it numbers under
// begins with it. A watcher given it (WatchOptions.SkipOrigin) follows the
// sequence of the frames this exporter published but does not deliver
// them: a replica's own events reach its clients locally.
func (x *Exporter) Origin() string { return x.tenurePrefix }

// Renew makes the exporter's next event of sessionKey start a new tenure
// continuing after the greater of the stream's last frame of the session
// and the exporter's own numbering of it. Call it when this exporter's
// replica owns the session again (a claim) after another owner may have
// numbered it meanwhile: without it the exporter would go on under its
// old tenure, which the watchers that followed the other owner drop as
// superseded. Unlike Adopt it never blocks: it takes its place in the
// buffer, after the events published before it, and the exporter's
// goroutine looks the stream up (only if it numbered the session before;
// a session it does not know is looked up at its first event anyway).
func (x *Exporter) Renew(sessionKey string) {
	if x.closing.Load() {
		return
	}
	select {
	case x.queue <- event.Event{SessionKey: sessionKey}: // Kind 0: the renewal marker
	default:
		// A full buffer drops events after this one anyway (frameLost).
	}
}

// renew is Renew on the exporter's goroutine.
func (x *Exporter) renew(key string) {
	x.mu.Lock()
	old := x.sessions[key]
	delete(x.sessions, key)
	x.mu.Unlock()
	if old == nil {
		return
	}
	st, err := x.session(key)
	if err != nil {
		return // closing
	}
	x.mu.Lock()
	if old.seq > st.base && st.seq == st.base {
		st.base, st.seq = old.seq, old.seq
	}
	x.mu.Unlock()
}

// AwaitEnded waits until the stream's last kept frame of sessionKey ends
// a turn — a terminal event (Finished, Aborted) or ForceFinalized — or is
// no event (a lost or sync frame, or there is none), or until ctx ends
// (ctx's error). A replica that claims a session whose previous turn
// another replica ran calls it before Renew: that turn's end is recorded
// before its last event is exported, so a claim can come first, and a
// renewal that read the stream then would number the new turn's events
// over the previous owner's last one (issue 20: the exporter numbering
// race). It looks the stream up, backing off from 2 ms to 50 ms; the
// first look usually finds the end there.
func (x *Exporter) AwaitEnded(ctx context.Context, sessionKey string) error {
	subj := subjectsFor(x.opt.Prefix, sessionKey).kept
	wait := 2 * time.Millisecond
	for {
		m, err := x.stream.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err == nil {
			f, derr := decodeFrame(m.Data)
			if derr != nil || f.kind != frameEvent || f.ev.Kind.Terminal() || f.ev.Kind == event.ForceFinalized {
				return nil // a frame that does not decode is the watchers' to report, not a reason to wait
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("natsbus: await the end of session %q's last turn: %w", sessionKey, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// Forget drops the exporter's numbering of a session it no longer owns;
// if it owns it again later, it continues from the stream (a new tenure).
func (x *Exporter) Forget(sessionKey string) {
	x.mu.Lock()
	delete(x.sessions, sessionKey)
	x.mu.Unlock()
}

// newSession is called with x.mu held.
func (x *Exporter) newSession(key string, subj subjects, base uint64) *expSession {
	return &expSession{key: key, subj: subj, base: base, seq: base, used: time.Now(),
		tenure: x.tenurePrefix + "." + strconv.FormatUint(x.tenureN.Add(1), 36)}
}

// lastSeq returns the sequence of the stream's last kept frame on subject,
// 0 if it has none.
func (x *Exporter) lastSeq(ctx context.Context, subject string) (uint64, error) {
	m, err := x.stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("natsbus: last frame of %s: %w", subject, err)
	}
	f, err := decodeFrame(m.Data)
	if err != nil {
		return 0, fmt.Errorf("natsbus: last frame of %s (stream seq %d): %w", subject, m.Sequence, err)
	}
	return f.seq, nil
}

// Stats returns the exporter's counters.
func (x *Exporter) Stats() ExporterStats {
	return ExporterStats{
		Published: x.published.Load(), Acked: x.acked.Load(), Failed: x.failed.Load(),
		Dropped: x.dropped.Load(), Deltas: x.deltas.Load(), DeltasDropped: x.deltasDropped.Load(),
		Queued: len(x.queue),
	}
}

// Close stops taking events, publishes what is buffered and waits for the
// stream's acknowledgements, until ctx ends; then it stops waiting on the
// network (what was not acknowledged counts as failed) and returns
// ctx.Err(). It is safe to call more than once.
func (x *Exporter) Close(ctx context.Context) error {
	x.once.Do(func() {
		x.closing.Store(true)
		close(x.quit)
	})
	select {
	case <-x.done:
		return nil
	case <-ctx.Done():
	}
	select {
	case <-x.abort:
	default:
		close(x.abort)
	}
	<-x.done
	return fmt.Errorf("natsbus: exporter close: %w", ctx.Err())
}

// opContext is a context for one network operation: it ends after d or
// when Close gives up waiting.
func (x *Exporter) opContext(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	go func() {
		select {
		case <-x.abort:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// Flush waits until every kept event Publish took before the call is
// stored by the stream or counted as failed (reported to OnError), or
// until ctx ends (an error wrapping ctx.Err()). Deltas, and events Publish
// dropped, are not waited for. A replica flushes before it tells anyone
// that an event is out — e.g. before it runs a session's next turn
// elsewhere numbered after it.
func (x *Exporter) Flush(ctx context.Context) error {
	target := x.accepted.Load()
	for {
		x.mu.Lock()
		if x.settled >= target {
			x.mu.Unlock()
			return nil
		}
		if x.settledC == nil {
			x.settledC = make(chan struct{})
		}
		c := x.settledC
		x.mu.Unlock()
		select {
		case <-c:
		case <-ctx.Done():
			return fmt.Errorf("natsbus: flush: %w", ctx.Err())
		}
	}
}
