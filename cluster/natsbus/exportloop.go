// The Exporter's two goroutines. run takes the buffered events in order,
// numbers each session's kept ones (session, publishKept; a delta is
// published unnumbered, publishDelta), pays the frames sessions owe
// (payDebts) and forgets idle sessions (evictIdle); collect awaits each
// in-flight frame's acknowledgement in order, retries those that got none
// and reports those that never reached the stream (retry, fail, settle).

package natsbus

import (
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnguard/turnguard/event"
)

// run numbers and publishes, in buffer order.
func (x *Exporter) run() {
	defer close(x.inflight)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if x.owe.Load() {
			x.payDebts()
		}
		select {
		case ev := <-x.queue:
			x.export(ev)
		case <-tick.C:
			x.evictIdle()
		case <-x.quit:
			for {
				select {
				case ev := <-x.queue:
					x.export(ev)
				default:
					if x.owe.Load() {
						x.payDebts()
					}
					return
				}
			}
		}
	}
}

func (x *Exporter) export(ev event.Event) {
	if ev.Kind == 0 {
		x.renew(ev.SessionKey)
		return
	}
	if ev.Kind == event.Delta {
		x.publishDelta(&ev)
		return
	}
	st, err := x.session(ev.SessionKey)
	if err != nil {
		x.failed.Add(1)
		x.settle()
		x.report(&PublishError{SessionKey: ev.SessionKey, Kind: ev.Kind, Err: err})
		return
	}
	x.publishKept(st, frameEvent, &ev)
}

// session returns the numbering of key, learning where it continues from
// the stream when the exporter has none. It retries the lookup while NATS
// does not answer, until Close gives up.
func (x *Exporter) session(key string) (*expSession, error) {
	x.mu.Lock()
	st := x.sessions[key]
	x.mu.Unlock()
	if st != nil {
		return st, nil
	}
	subj := subjectsFor(x.opt.Prefix, key)
	for attempt := 1; ; attempt++ {
		ctx, cancel := x.opContext(x.opt.AckTimeout)
		base, err := x.lastSeq(ctx, subj.kept)
		cancel()
		if err == nil {
			x.mu.Lock()
			if st = x.sessions[key]; st == nil { // Adopt may have come first
				st = x.newSession(key, subj, base)
				x.sessions[key] = st
			}
			x.mu.Unlock()
			return st, nil
		}
		select {
		case <-x.abort:
			return nil, err
		case <-time.After(min(time.Duration(attempt)*100*time.Millisecond, time.Second)):
		}
	}
}

// publishKept numbers a kept frame in st and publishes it asynchronously;
// it waits only when MaxInFlight frames await their acknowledgement.
func (x *Exporter) publishKept(st *expSession, kind frameKind, ev *event.Event) {
	x.mu.Lock()
	st.seq++
	st.used = time.Now()
	f := frame{kind: kind, seq: st.seq, tenure: st.tenure, base: st.base, hintSeq: st.hintSeq, hintStream: st.hintStream}
	x.mu.Unlock()
	var k event.Kind
	if ev != nil {
		f.ev = *ev
		k = ev.Kind
	} else {
		f.ev.SessionKey = st.key
	}
	p := &pending{st: st, kind: k, seq: f.seq,
		msg: &nats.Msg{Subject: st.subj.kept, Data: appendFrame(make([]byte, 0, 256), &f), Header: nats.Header{}},
		id:  f.tenure + ":" + strconv.FormatUint(f.seq, 10)}
	p.fut, p.err = x.js.PublishMsgAsync(p.msg, jetstream.WithMsgID(p.id), jetstream.WithExpectStream(x.opt.Stream))
	x.published.Add(1)
	select {
	case x.inflight <- p:
	case <-x.abort:
		x.fail(p, fmt.Errorf("natsbus: exporter closed before the ack: %w", ErrClosed))
	}
}

func (x *Exporter) publishDelta(ev *event.Event) {
	x.mu.Lock()
	st := x.sessions[ev.SessionKey]
	var f frame
	if st != nil {
		f = frame{kind: frameDelta, seq: st.seq, tenure: st.tenure, base: st.base, ev: *ev}
	}
	x.mu.Unlock()
	if st == nil || !x.nc.IsConnected() {
		x.deltasDropped.Add(1)
		return
	}
	if err := x.nc.Publish(st.subj.delta, appendFrame(make([]byte, 0, 256), &f)); err != nil {
		x.deltasDropped.Add(1)
		return
	}
	x.deltas.Add(1)
}

// collect waits for each in-flight frame's acknowledgement in publication
// order, retries those that got none, and records the stream position of
// the acknowledged ones as their session's repair hint.
func (x *Exporter) collect() {
	for p := range x.inflight {
		var ack *jetstream.PubAck
		err := p.err
		if err == nil {
			select {
			case ack = <-p.fut.Ok():
			case err = <-p.fut.Err():
			case <-time.After(x.opt.AckTimeout + time.Second): // the future should have timed out itself
				err = jetstream.ErrAsyncPublishTimeout
			case <-x.abort:
				err = ErrClosed
			}
		}
		if err != nil {
			ack, err = x.retry(p, err)
		}
		if err != nil {
			x.fail(p, err)
			continue
		}
		x.acked.Add(1)
		x.mu.Lock()
		if p.seq > p.st.hintSeq {
			p.st.hintSeq, p.st.hintStream = p.seq, ack.Sequence
		}
		x.mu.Unlock()
		if p.kind != 0 {
			x.settle()
		}
	}
}

func (x *Exporter) retry(p *pending, err error) (*jetstream.PubAck, error) {
	for attempt := 1; attempt <= x.opt.Retries; attempt++ {
		select {
		case <-x.abort:
			return nil, err
		case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
		}
		ctx, cancel := x.opContext(x.opt.AckTimeout)
		var ack *jetstream.PubAck
		ack, err = x.js.PublishMsg(ctx, p.msg, jetstream.WithMsgID(p.id), jetstream.WithExpectStream(x.opt.Stream))
		cancel()
		if err == nil {
			return ack, nil
		}
	}
	return nil, err
}

// fail counts a kept frame that was not stored and makes its session owe
// a frameSync, so a watcher waiting for it sees the sequence move.
func (x *Exporter) fail(p *pending, err error) {
	x.failed.Add(1)
	x.mu.Lock()
	if x.sessions[p.st.key] == p.st {
		x.unsynced[p.st.key] = true
		x.owe.Store(true)
	}
	x.mu.Unlock()
	if p.kind != 0 { // an event, not a lost or sync frame: tell the operator
		x.settle()
		x.report(&PublishError{SessionKey: p.st.key, Kind: p.kind, Seq: p.seq, Err: err})
	}
}

// settle counts a kept event the exporter is done with (stored, or
// failed) and wakes the Flush calls waiting.
func (x *Exporter) settle() {
	x.mu.Lock()
	x.settled++
	if x.settledC != nil {
		close(x.settledC)
		x.settledC = nil
	}
	x.mu.Unlock()
}

// payDebts publishes the frameLost and frameSync frames sessions owe.
func (x *Exporter) payDebts() {
	x.mu.Lock()
	lost, unsynced := x.lost, x.unsynced
	x.lost, x.unsynced = map[string]uint64{}, map[string]bool{}
	x.owe.Store(false)
	x.mu.Unlock()
	for key := range lost {
		st, err := x.session(key)
		if err != nil {
			x.mu.Lock()
			x.lost[key] += lost[key]
			x.owe.Store(true)
			x.mu.Unlock()
			return
		}
		x.publishKept(st, frameLost, nil)
		delete(unsynced, key) // the lost frame moves the sequence too
	}
	for key := range unsynced {
		x.mu.Lock()
		st := x.sessions[key]
		x.mu.Unlock()
		if st != nil {
			x.publishKept(st, frameSync, nil)
		}
	}
}

// evictIdle forgets sessions not used for half the stream's MaxAge: their
// last frame is still in the stream, so a later event continues from it.
func (x *Exporter) evictIdle() {
	cut := time.Now().Add(-x.opt.MaxAge / 2)
	x.mu.Lock()
	defer x.mu.Unlock()
	for k, st := range x.sessions {
		if st.used.Before(cut) && st.hintSeq == st.seq && !x.unsynced[k] && x.lost[k] == 0 {
			delete(x.sessions, k)
		}
	}
}
