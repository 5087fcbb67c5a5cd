// A run's streamed reply as chat delta events: how often a delta goes out
// (interval), recording the newest text (onDelta), sending and flushing
// deltas (emitDelta, flushDelta) and encoding them once for every watcher
// (deltaRef). The rest of a run's events are in events.go.

package ws

import (
	"time"

	"github.com/turnguard/turnguard/event"
)

// Streaming. The protocol's chat delta carries the whole reply so far
// (the TUI draws message, not deltaText), so encoding every chunk would
// cost O(reply) per chunk and O(reply²) per turn. Instead a run records
// the newest full text (a string the engine already has: no copy) and
// sends a delta at most every deltaInterval — at once when the previous
// one is older, else from a timer, and always before any other frame of
// the run. Each delta's deltaText is the text since the previous delta, so
// the deltaTexts still add up to the reply. The interval grows with the
// reply (deltaBytesPerSec), so encoding costs a bounded share of a core
// however long the reply: total work is linear in the reply's size.

// deltaBytesPerSec bounds how many bytes of full text one run's deltas
// encode per second: a reply of 1 MB is sent at most every 64 ms.
const deltaBytesPerSec = 16 << 20

// interval is how long after the last delta the next may be sent.
func (rs *runState) interval() time.Duration {
	d := rs.s.opts.DeltaInterval
	if d < 0 {
		return 0
	}
	return max(d, time.Duration(len(rs.full))*time.Second/deltaBytesPerSec)
}

// onDelta records a streamed chunk and sends a delta when one is due.
func (rs *runState) onDelta(ev event.Event) {
	rs.last = time.Now()
	rs.full, rs.fullAt = ev.FullText, ev.Time
	if !rs.watched {
		rs.sent = len(rs.full) // nobody saw it; later watchers get the full text in message
		return
	}
	wait := rs.interval() - time.Since(rs.lastDelta)
	if rs.lastDelta.IsZero() || wait <= 0 {
		rs.emitDelta()
		return
	}
	if rs.deltaT == nil {
		rs.deltaT = time.AfterFunc(wait, rs.flushDelta)
	} else {
		rs.deltaT.Reset(wait) // not pending: emitDelta stops it, and it is reset only while text waits
	}
}

// emitDelta appends the delta of the text not sent yet.
func (rs *runState) emitDelta() {
	if rs.deltaT != nil {
		rs.deltaT.Stop()
	}
	from := rs.sent
	rs.sent, rs.lastDelta = len(rs.full), time.Now()
	if !rs.watched || from >= len(rs.full) {
		return
	}
	rs.seq++
	d := &deltaRef{ev: chatEvent{RunID: rs.id, SessionKey: rs.key, Seq: rs.seq, AgentID: rs.agent, State: "delta"},
		at: rs.fullAt, full: rs.full, from: from}
	rs.frames = append(rs.frames, outFrame{data: d.encode(), seq: true, kind: kindDelta, runID: rs.id, delta: d})
}

// flushDelta runs on the delta timer: it sends the text that arrived since
// the last delta.
func (rs *runState) flushDelta() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.done || rs.sent >= len(rs.full) {
		return
	}
	rs.watched = rs.hasWatchers()
	rs.frames = rs.frames[:0]
	rs.emitDelta()
	if len(rs.frames) > 0 {
		rs.s.fanout(rs.key, rs.frames)
		clear(rs.frames)
	}
}

// deltaRef is a chat delta before encoding: the run's full text at that
// moment and where in it the delta text starts.
type deltaRef struct {
	ev   chatEvent // RunID, SessionKey, Seq, AgentID, State
	at   time.Time // the message's timestamp
	full string
	from int
}

// encode returns the delta's frame head.
func (d *deltaRef) encode() []byte {
	p := d.ev
	p.DeltaText = d.full[d.from:]
	p.Message = textMessage("assistant", d.full, d.at, "")
	return encodeChat(&p)
}

// since returns a frame of d's run with d's full text and a delta text that
// starts at from (the start of deltas a connection did not get). It is
// encoded when written.
func (d *deltaRef) since(from int) outFrame {
	n := *d
	n.from = min(from, d.from)
	return outFrame{seq: true, kind: kindDelta, runID: d.ev.RunID, delta: &n}
}
