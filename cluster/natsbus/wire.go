package natsbus

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/turnguard/turnguard/event"
)

// wireVersion is the first byte of every frame. A decoder refuses other
// versions, so a rolling upgrade that changes the layout bumps it.
const wireVersion = 2 // 2: events carry their Approval

// maxString bounds one decoded string; a frame is a NATS message, which
// is at most 1 MiB by default, so anything longer is corrupt.
const maxString = 8 << 20

// frameKind says what a frame carries.
type frameKind uint8

const (
	// frameEvent carries a kept event under its session sequence.
	frameEvent frameKind = iota + 1
	// frameDelta carries a delta; its seq is the session sequence of the
	// last kept event published before it (deltas have none of their own).
	frameDelta
	// frameLost stands for events the exporter dropped before they were
	// numbered (its buffer was full): a watcher reaching it has missed them
	// and cannot get them back.
	frameLost
	// frameSync carries nothing: the exporter publishes one after a kept
	// event it could not store, so that a watcher waiting for that event
	// sees the sequence move and notices the gap even if the session falls
	// silent.
	frameSync
)

// frame is what travels in a NATS message: the transport's own fields and,
// for frameEvent and frameDelta, the event (every field but Locals).
type frame struct {
	kind frameKind
	// seq is the per-session sequence, 1-based, continuing across owners.
	seq uint64
	// tenure identifies one exporter's ownership of the session: a new
	// owner (or the same process after Adopt) numbers under a new tenure.
	tenure string
	// base is the sequence the tenure continued from: its first frame is
	// base+1. A watcher that delivered more than base from an earlier
	// tenure knows the two owners disagree.
	base uint64
	// hintSeq/hintStream: the newest frame of this tenure the stream has
	// acknowledged (its session and stream sequence), so a watcher repairs
	// a gap from there instead of from the session's first kept frame.
	hintSeq, hintStream uint64
	// ev is the event; a lost or sync frame carries only its SessionKey.
	ev event.Event
}

// appendFrame encodes f after b.
func appendFrame(b []byte, f *frame) []byte {
	b = append(b, wireVersion, byte(f.kind))
	b = binary.AppendUvarint(b, f.seq)
	b = appendString(b, f.tenure)
	b = binary.AppendUvarint(b, f.base)
	b = binary.AppendUvarint(b, f.hintSeq)
	b = binary.AppendUvarint(b, f.hintStream)
	if f.kind != frameEvent && f.kind != frameDelta {
		return appendString(b, f.ev.SessionKey) // lost and sync frames name their session only
	}
	ev := &f.ev
	b = append(b, byte(ev.Kind))
	b = appendString(b, ev.RunID)
	b = appendString(b, ev.SessionKey)
	b = appendString(b, ev.Channel)
	b = appendString(b, ev.ChatRef)
	b = binary.AppendUvarint(b, ev.Seq)
	b = appendTime(b, ev.Time)
	b = appendStep(b, ev.Step)
	b = appendStep(b, ev.LastStep)
	b = appendString(b, string(ev.StopReason))
	b = binary.AppendVarint(b, int64(ev.Elapsed))
	b = appendString(b, ev.Text)
	b = appendString(b, ev.FullText)
	b = appendString(b, ev.Message)
	b = appendTime(b, ev.Deadline)
	b = appendTime(b, ev.Ceiling)
	b = binary.AppendVarint(b, int64(ev.StepTimeout))
	b = binary.AppendVarint(b, int64(ev.Limit))
	b = appendString(b, ev.ErrorID)
	b = binary.AppendUvarint(b, uint64(len(ev.Joined)))
	for _, j := range ev.Joined {
		b = appendString(b, j)
	}
	return appendApproval(b, ev.Approval)
}

// appendApproval writes 0 for none, else 1 and every field.
func appendApproval(b []byte, a *event.Approval) []byte {
	if a == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	b = appendString(b, a.ID)
	b = appendString(b, a.Title)
	b = appendString(b, a.Detail)
	b = appendString(b, a.Tool)
	b = binary.AppendUvarint(b, uint64(len(a.Options)))
	for _, o := range a.Options {
		b = appendString(b, o.ID)
		b = appendString(b, o.Label)
		b = appendString(b, o.Kind)
	}
	b = appendTime(b, a.CreatedAt)
	b = appendTime(b, a.ExpiresAt)
	b = appendString(b, a.Outcome)
	b = appendString(b, a.OptionID)
	b = appendString(b, a.OptionKind)
	b = appendString(b, a.By)
	return appendTime(b, a.ResolvedAt)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendTime writes 0 for the zero time, else 1, the Unix seconds and the
// nanoseconds (valid for any year, unlike UnixNano). The location and the
// monotonic reading do not travel.
func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, 0)
	}
	b = append(b, 1)
	b = binary.AppendVarint(b, t.Unix())
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

func appendStep(b []byte, s event.Step) []byte {
	b = appendString(b, s.Kind)
	b = appendString(b, s.Name)
	b = binary.AppendUvarint(b, uint64(s.Seq))
	return appendTime(b, s.StartedAt)
}

// errCorrupt is wrapped by every decoding error.
var errCorrupt = errors.New("natsbus: corrupt frame")

// decodeFrame parses a frame. It never panics and rejects trailing bytes,
// unknown versions and kinds, and lengths past the input.
func decodeFrame(data []byte) (frame, error) {
	d := decoder{b: data}
	var f frame
	var h head
	if !d.transport(&h) {
		return f, d.err
	}
	f.kind, f.seq, f.tenure, f.base, f.hintSeq, f.hintStream = h.kind, h.seq, string(h.tenure), h.base, h.hintSeq, h.hintStream
	switch f.kind {
	case frameLost, frameSync:
		f.ev.SessionKey = d.string()
	case frameEvent, frameDelta:
		d.event(&f.ev)
	default:
		if d.err == nil {
			d.err = fmt.Errorf("%w: frame kind %d", errCorrupt, f.kind)
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", errCorrupt, len(d.b))
	}
	return f, d.err
}

// head is what a watcher reads of a frame before it decides whether to
// decode the frame whole (peekFrame): the transport's fields and, for an
// event or a delta, the few that its session's sequence needs. Its byte
// slices alias the message.
type head struct {
	kind                           frameKind
	seq, base, hintSeq, hintStream uint64
	tenure                         []byte
	key                            []byte // the session key
	evKind                         event.Kind
	runID                          []byte
	evSeq                          uint64
}

// peekFrame reads f's head without copying or allocating anything. It
// checks only the head: the rest of the frame is decodeFrame's to check.
func peekFrame(data []byte) (head, error) {
	d := decoder{b: data}
	var h head
	if !d.transport(&h) {
		return h, d.err
	}
	switch h.kind {
	case frameLost, frameSync:
		h.key = d.bytes()
	case frameEvent, frameDelta:
		h.evKind = event.Kind(d.byte())
		h.runID = d.bytes()
		h.key = d.bytes()
		d.bytes() // Channel
		d.bytes() // ChatRef
		h.evSeq = d.uvarint()
	default:
		if d.err == nil {
			d.err = fmt.Errorf("%w: frame kind %d", errCorrupt, h.kind)
		}
	}
	return h, d.err
}

// transport reads a frame's version and transport fields into h; false
// if the version is not wireVersion (d.err says why).
func (d *decoder) transport(h *head) bool {
	if v := d.byte(); v != wireVersion {
		if d.err == nil {
			d.err = fmt.Errorf("%w: version %d", errCorrupt, v)
		}
		return false
	}
	h.kind = frameKind(d.byte())
	h.seq = d.uvarint()
	h.tenure = d.bytes()
	h.base = d.uvarint()
	h.hintSeq = d.uvarint()
	h.hintStream = d.uvarint()
	return true
}

type decoder struct {
	b       []byte
	err     error
	scratch [binary.MaxVarintLen64]byte
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", errCorrupt, what)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.fail("short")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 || n != len(binary.AppendUvarint(d.scratch[:0], v)) {
		d.fail("bad uvarint") // past the end, overflowing, or not minimal
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 || n != len(binary.AppendVarint(d.scratch[:0], v)) {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string { return string(d.bytes()) }

// bytes is string without the copy: the slice aliases the input.
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) || n > maxString {
		d.fail("string past the end")
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}

func (d *decoder) time() time.Time {
	switch d.byte() {
	case 0:
		return time.Time{}
	case 1:
		sec := d.varint()
		nsec := d.uvarint()
		if sec > 1<<62 || sec < -(1<<62) {
			d.fail("seconds out of range")
			return time.Time{}
		}
		if nsec >= 1e9 {
			d.fail("nanoseconds out of range")
			return time.Time{}
		}
		t := time.Unix(sec, int64(nsec))
		if t.IsZero() {
			d.fail("zero time marked present")
		}
		return t
	default:
		d.fail("bad time tag")
		return time.Time{}
	}
}

func (d *decoder) step() event.Step {
	var s event.Step
	s.Kind = d.string()
	s.Name = d.string()
	seq := d.uvarint()
	if seq > math.MaxUint32 {
		d.fail("step seq out of range")
	}
	s.Seq = uint32(seq)
	s.StartedAt = d.time()
	return s
}

func (d *decoder) event(ev *event.Event) {
	ev.Kind = event.Kind(d.byte())
	if d.err == nil && ev.Kind.String() == "unknown" {
		d.fail(fmt.Sprintf("event kind %d", ev.Kind))
	}
	ev.RunID = d.string()
	ev.SessionKey = d.string()
	ev.Channel = d.string()
	ev.ChatRef = d.string()
	ev.Seq = d.uvarint()
	ev.Time = d.time()
	ev.Step = d.step()
	ev.LastStep = d.step()
	ev.StopReason = event.StopReason(d.string())
	ev.Elapsed = time.Duration(d.varint())
	ev.Text = d.string()
	ev.FullText = d.string()
	ev.Message = d.string()
	ev.Deadline = d.time()
	ev.Ceiling = d.time()
	ev.StepTimeout = time.Duration(d.varint())
	ev.Limit = time.Duration(d.varint())
	ev.ErrorID = d.string()
	n := d.uvarint()
	if n > uint64(len(d.b)) { // each entry takes at least its length byte
		d.fail("joined count past the end")
		return
	}
	if n > 0 {
		ev.Joined = make([]string, n)
		for i := range ev.Joined {
			ev.Joined[i] = d.string()
		}
	}
	ev.Approval = d.approval()
}

func (d *decoder) approval() *event.Approval {
	switch d.byte() {
	case 0:
		return nil
	case 1:
	default:
		d.fail("bad approval tag")
		return nil
	}
	a := &event.Approval{ID: d.string(), Title: d.string(), Detail: d.string(), Tool: d.string()}
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("option count past the end")
		return nil
	}
	for range n {
		a.Options = append(a.Options, event.ApprovalOption{ID: d.string(), Label: d.string(), Kind: d.string()})
	}
	a.CreatedAt = d.time()
	a.ExpiresAt = d.time()
	a.Outcome = d.string()
	a.OptionID = d.string()
	a.OptionKind = d.string()
	a.By = d.string()
	a.ResolvedAt = d.time()
	if d.err != nil {
		return nil
	}
	return a
}

// Subjects: a session's kept frames go to <prefix>.ev.<bucket>.<hash>,
// its deltas to <prefix>.dl.<bucket>.<hash>, so <prefix>.*.<bucket>.<hash>
// is one subscription that receives both in publication order.
//
// hash is the first 16 bytes of SHA-256 of the session key, in hex: any
// key (dots, spaces, wildcards, non-ASCII) becomes a valid single token of
// fixed length, and two sessions sharing a subject would need a 128-bit
// collision (a watcher checks the event's SessionKey anyway). bucket is
// the hash's first two hex digits (256 buckets): it costs no extra state,
// and lets a consumer of every session be split by bucket range
// (<prefix>.ev.0a.*), or the stream itself later be split into several
// streams (each with its own leader) by listing bucket subjects, without
// renaming a subject.
type subjects struct {
	kept, delta, both string
}

func subjectsFor(prefix, sessionKey string) subjects {
	h := sha256.Sum256([]byte(sessionKey))
	x := hex.EncodeToString(h[:16])
	tail := x[:2] + "." + x
	return subjects{
		kept:  prefix + ".ev." + tail,
		delta: prefix + ".dl." + tail,
		both:  prefix + ".*." + tail,
	}
}
