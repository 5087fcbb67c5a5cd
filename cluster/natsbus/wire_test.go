package natsbus

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnguard/turnguard/event"
)

// fullEvent sets every Event field but Locals.
func fullEvent() event.Event {
	at := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	return event.Event{
		Kind: event.Aborted, RunID: "run-1", SessionKey: "agent:main:telegram:42 ünï.*>", Channel: "telegram",
		ChatRef: "-100123", Seq: 17, Time: at,
		Step:       event.Step{Kind: event.StepTool, Name: "shell", Seq: 3, StartedAt: at.Add(-time.Second)},
		LastStep:   event.Step{Kind: event.StepLLM, Seq: 2, StartedAt: at.Add(-2 * time.Second)},
		StopReason: event.ReasonStepTimeout, Elapsed: 95 * time.Second, Text: "hi", FullText: "partial",
		Message: "⚠️ No progress", Deadline: at.Add(time.Minute), Ceiling: at.Add(time.Hour),
		StepTimeout: 30 * time.Second, Limit: -time.Second, ErrorID: "e-1", Joined: []string{"r2", ""},
		Approval: &event.Approval{ID: "ap_1", Title: "Run `rm -rf build/` ✓", Detail: "in /srv", Tool: "shell",
			Options:   []event.ApprovalOption{{ID: "y", Label: "Allow", Kind: "allow_once"}, {ID: "n", Label: "Deny", Kind: "reject_once"}},
			CreatedAt: at.Add(-time.Minute), ExpiresAt: at.Add(4 * time.Minute), Outcome: event.ApprovalSelected,
			OptionID: "y", OptionKind: "allow_once", By: "@alice", ResolvedAt: at},
	}
}

// sameEvent compares two events, times by instant (the location does not
// travel).
func sameEvent(t *testing.T, got, want event.Event) {
	t.Helper()
	norm := func(e event.Event) event.Event {
		ts := []*time.Time{&e.Time, &e.Deadline, &e.Ceiling, &e.Step.StartedAt, &e.LastStep.StartedAt}
		if e.Approval != nil {
			a := *e.Approval
			e.Approval = &a
			ts = append(ts, &a.CreatedAt, &a.ExpiresAt, &a.ResolvedAt)
		}
		for _, p := range ts {
			if !p.IsZero() {
				*p = p.UTC()
			}
		}
		e.Locals = nil
		return e
	}
	if g, w := norm(got), norm(want); !reflect.DeepEqual(g, w) {
		t.Fatalf("event differs:\n got %+v\nwant %+v", g, w)
	}
}

// TestFrameRoundTrip checks every Event field but Locals survives the
// wire, for each frame kind, and that a zero event does too.
func TestFrameRoundTrip(t *testing.T) {
	ev := fullEvent()
	ev.Locals = new(event.Locals)
	for _, f := range []frame{
		{kind: frameEvent, seq: 9, tenure: "T.1", base: 4, hintSeq: 8, hintStream: 1 << 40, ev: ev},
		{kind: frameDelta, seq: 9, tenure: "T.1", ev: event.Event{Kind: event.Delta, SessionKey: "s", Text: "x"}},
		{kind: frameEvent, seq: 1, ev: event.Event{Kind: event.SessionReset}},
		{kind: frameLost, seq: 10, tenure: "T.2", base: 9, ev: event.Event{SessionKey: "s"}},
		{kind: frameSync, seq: 11, tenure: "T.2", base: 9, ev: event.Event{SessionKey: "s"}},
	} {
		b := appendFrame(nil, &f)
		g, err := decodeFrame(b)
		if err != nil {
			t.Fatalf("kind %d: decode: %v", f.kind, err)
		}
		if g.kind != f.kind || g.seq != f.seq || g.tenure != f.tenure || g.base != f.base ||
			g.hintSeq != f.hintSeq || g.hintStream != f.hintStream {
			t.Fatalf("header: got %+v want %+v", g, f)
		}
		sameEvent(t, g.ev, f.ev)
		// The head a watcher reads before deciding to decode agrees.
		h, err := peekFrame(b)
		if err != nil || h.kind != f.kind || h.seq != f.seq || string(h.tenure) != f.tenure || h.base != f.base ||
			h.hintSeq != f.hintSeq || h.hintStream != f.hintStream || string(h.key) != f.ev.SessionKey ||
			(f.kind == frameEvent || f.kind == frameDelta) && (h.evKind != f.ev.Kind || string(h.runID) != f.ev.RunID || h.evSeq != f.ev.Seq) {
			t.Fatalf("kind %d: head %+v, %v; want the frame's %+v", f.kind, h, err, f)
		}
	}
}

// TestDecodeRejects checks the decoder refuses truncated, padded and
// unknown input with errCorrupt.
func TestDecodeRejects(t *testing.T) {
	f := frame{kind: frameEvent, seq: 1, ev: fullEvent()}
	good := appendFrame(nil, &f)
	bad := map[string][]byte{
		"empty":       nil,
		"version":     append([]byte{wireVersion + 1}, good[1:]...),
		"old version": append([]byte{wireVersion - 1}, good[1:]...),
		"kind":        append([]byte{wireVersion, 9}, good[2:]...),
		"trailing":    append(bytes.Clone(good), 0),
		"event 0":     appendFrame(nil, &frame{kind: frameEvent}),
		"long text":   append([]byte{wireVersion, byte(frameSync), 1, 0xff, 0xff, 0xff, 0x7f}, strings.Repeat("x", 10)...),
	}
	for i := 1; i < len(good); i++ {
		bad["truncated "+string(rune('a'+i%26))+string(rune('0'+i%10))] = good[:i]
	}
	for name, b := range bad {
		if _, err := decodeFrame(b); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: err = %v, want errCorrupt", name, err)
		}
	}
}

// TestSubjects checks any session key becomes valid, fixed-form subjects.
func TestSubjects(t *testing.T) {
	for _, key := range []string{"", "a", "agent:main:x y.z*>", strings.Repeat("é", 500)} {
		s := subjectsFor("tg", key)
		for _, subj := range []string{s.kept, s.delta} {
			tok := strings.Split(subj, ".")
			if len(tok) != 4 || len(tok[2]) != 2 || len(tok[3]) != 32 || !strings.HasPrefix(tok[3], tok[2]) {
				t.Fatalf("key %q: subject %q", key, subj)
			}
			if strings.ContainsAny(subj, " *>\t") {
				t.Fatalf("key %q: subject %q has wildcards or spaces", key, subj)
			}
		}
	}
	if subjectsFor("tg", "a").kept == subjectsFor("tg", "b").kept {
		t.Fatal("two keys share a subject")
	}
}

// FuzzFrame: the decoder never panics, and whatever it accepts encodes
// back to the same bytes.
func FuzzFrame(f *testing.F) {
	f.Add(appendFrame(nil, &frame{kind: frameEvent, seq: 3, tenure: "t", ev: fullEvent()}))
	f.Add(appendFrame(nil, &frame{kind: frameDelta, seq: 3, ev: event.Event{Kind: event.Delta, Text: "a"}}))
	f.Add(appendFrame(nil, &frame{kind: frameLost, seq: 4, ev: event.Event{SessionKey: "k"}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = peekFrame(data) // never panics either
		g, err := decodeFrame(data)
		if err != nil {
			return
		}
		again := appendFrame(nil, &g)
		if !bytes.Equal(again, data) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", data, again)
		}
	})
}

// TestFramesInSequenceAreNeverHeld (issue 21): a frame that is the next of
// its session while none waits is passed at once — never put in the
// session's ahead map, whose insertions cost more than the rest of the
// frame — and one of SkipOrigin's costs no allocation at all (its head
// is read in place); a frame ahead of a missing one still waits for it.
func TestFramesInSequenceAreNeverHeld(t *testing.T) {
	var got []string
	opt := WatchOptions{SkipOrigin: "me"}.withDefaults()
	w := &Watcher{opt: opt, h: func(ev event.Event) { got = append(got, ev.Text) },
		sessions: map[string]*watchSession{}, live: map[string]*watchSession{}}
	msg := func(origin string, seq uint64) *nats.Msg {
		f := frame{kind: frameEvent, seq: seq, tenure: origin + ".1",
			ev: event.Event{Kind: event.StepCompleted, RunID: "r", SessionKey: "k", Seq: seq, Text: strconv.FormatUint(seq, 10)}}
		return &nats.Msg{Data: appendFrame(nil, &f)}
	}
	var own []*nats.Msg
	for seq := uint64(1); seq <= 102; seq++ {
		own = append(own, msg("me", seq))
	}
	w.receive(own[0])
	i := 1 // AllocsPerRun calls once more than it counts: 101 calls
	if a := testing.AllocsPerRun(100, func() { w.receive(own[i]); i++ }); a != 0 {
		t.Errorf("a SkipOrigin frame in sequence allocates %.1f times; want 0", a)
	}
	s := w.sessions["k"]
	if s == nil || s.d != 102 || s.ahead != nil || len(got) != 0 {
		t.Fatalf("after 102 own frames: session %+v, delivered %q; want d 102, nothing held or delivered", s, got)
	}
	// Another owner continues the session: in sequence, passed at once.
	next := func(seq uint64) *nats.Msg {
		f := frame{kind: frameEvent, seq: seq, tenure: "other.1", base: 102,
			ev: event.Event{Kind: event.StepCompleted, RunID: "r2", SessionKey: "k", Seq: seq, Text: strconv.FormatUint(seq, 10)}}
		return &nats.Msg{Data: appendFrame(nil, &f)}
	}
	w.receive(next(103))
	if s.ahead != nil || !slices.Equal(got, []string{"103"}) {
		t.Fatalf("the next owner's first frame: held %v, delivered %q; want delivered at once", s.ahead, got)
	}
	// 105 before 104: 105 waits, then both go in order.
	w.live = map[string]*watchSession{} // repair would ask the stream: none here, and none needed
	s.ahead = map[uint64]frame{}
	w.offer(s, mustDecode(t, next(105).Data))
	if len(s.ahead) != 1 {
		t.Fatalf("a frame ahead of a missing one is not held: %v", s.ahead)
	}
	w.offer(s, mustDecode(t, next(104).Data))
	w.drain(s)
	if !slices.Equal(got, []string{"103", "104", "105"}) || len(s.ahead) != 0 {
		t.Fatalf("delivered %q, held %v; want 103 104 105 in order, nothing held", got, s.ahead)
	}
}

func mustDecode(t *testing.T, b []byte) frame {
	t.Helper()
	f, err := decodeFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
