package acp

import (
	"fmt"
	"slices"
	"testing"

	"github.com/turnguard/turnguard/runner"
)

// TestGrants: the rules of a conversation's "always" answers, alone. The
// agent only ever gets a "once" option; an "always" option without one is
// not offered; a conversation keeps at most maxGrants.
func TestGrants(t *testing.T) {
	allowOnce := runner.Option{ID: "once", Kind: runner.AllowOnce}
	allowAlways := runner.Option{ID: "always", Kind: runner.AllowAlways}
	rejectOnce := runner.Option{ID: "no", Kind: runner.RejectOnce}
	rejectAlways := runner.Option{ID: "never", Kind: runner.RejectAlways}
	all := []runner.Option{allowOnce, allowAlways, rejectOnce, rejectAlways}
	q := func(title string, opts ...runner.Option) runner.Question {
		return runner.Question{Title: title, Tool: "execute", Options: opts}
	}

	t.Run("offered", func(t *testing.T) {
		tests := []struct {
			in, want []runner.Option
		}{
			{all, all},
			{[]runner.Option{allowAlways, rejectOnce}, []runner.Option{rejectOnce}},
			{[]runner.Option{allowOnce, allowAlways, rejectAlways}, []runner.Option{allowOnce, allowAlways}},
			{[]runner.Option{allowAlways, rejectAlways}, []runner.Option{}},
		}
		for _, tc := range tests {
			if got := scopedOptions(tc.in); !slices.Equal(got, tc.want) {
				t.Errorf("scopedOptions(%v) = %v, want %v", tc.in, got, tc.want)
			}
		}
	})

	t.Run("answers", func(t *testing.T) {
		var g grants
		tests := []struct {
			q                   runner.Question
			chosen              string // "": not asked (recalled)
			sent                string
			recalled, recallsOk bool
		}{
			{q: q("Run ls", all...), chosen: "once", sent: "once"},
			{q: q("Run ls", all...), chosen: "always", sent: "once"},
			{q: q("Run ls", all...), recalled: true, sent: "once", recallsOk: true},
			{q: q("Run pwd", all...), chosen: "never", sent: "no"},
			{q: q("Run pwd", all...), recalled: true, sent: "no", recallsOk: true},
			{q: q("Run ls", allowAlways, rejectOnce), recalled: true, recallsOk: false}, // no "once" to send: ask
			{q: q("Run rm", all...), chosen: "no", sent: "no"},
		}
		for i, tc := range tests {
			opt, ok := g.recall(tc.q)
			if tc.recalled {
				if ok != tc.recallsOk || (ok && opt != tc.sent) {
					t.Errorf("%d: recall(%s) = %q, %v; want %q, %v", i, tc.q.Title, opt, ok, tc.sent, tc.recallsOk)
				}
				continue
			}
			if ok {
				t.Errorf("%d: recall(%s) = %q, want the person asked", i, tc.q.Title, opt)
			}
			if got := g.settle(tc.q, tc.chosen); got != tc.sent {
				t.Errorf("%d: %s answered %q: the agent gets %q, want %q", i, tc.q.Title, tc.chosen, got, tc.sent)
			}
		}
	})

	t.Run("bounded", func(t *testing.T) {
		var g grants
		for i := range maxGrants + 10 {
			if got := g.settle(q(fmt.Sprint("Run ", i), all...), "always"); got != "once" {
				t.Fatalf("answer %d sent %q", i, got)
			}
		}
		if n := len(g.m); n != maxGrants {
			t.Errorf("%d grants kept, want at most %d", n, maxGrants)
		}
		if _, ok := g.recall(q(fmt.Sprint("Run ", maxGrants+5), all...)); ok {
			t.Error("an answer past the bound was kept")
		}
	})
}
