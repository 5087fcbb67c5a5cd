package natsbus

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

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
