package acp_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/turnguard/turnguard/runner"
)

// TestElicitation: the Node agent's elicitation/create becomes the
// person's question when buttons can answer it, and the answer goes back
// to the agent (which says what it got); one that needs typing is declined
// without asking, and nobody answering is "cancel".
func TestElicitation(t *testing.T) {
	r, _, _ := newRunner(t, grace, nil)
	pick := func(label string) func(runner.Question) (runner.Answer, error) {
		return func(q runner.Question) (runner.Answer, error) {
			for _, o := range q.Options {
				if o.Label == label {
					return runner.Answer{Outcome: runner.Selected, OptionID: o.ID, Kind: o.Kind, By: "alice"}, nil
				}
			}
			return runner.Answer{}, errors.New("no such option")
		}
	}
	timedOut := func(q runner.Question) (runner.Answer, error) {
		return runner.Answer{Outcome: runner.TimedOut, OptionID: "decline", Kind: runner.RejectOnce}, nil
	}
	tests := []struct {
		msg     string
		answer  func(runner.Question) (runner.Answer, error)
		title   string
		detail  string
		options []string // the labels the person saw; nil: not asked
		reply   string
	}{
		{"elicit color", pick("green"), "Pick a color", "Color", []string{"red", "green", "blue", "Decline"},
			`elicited {"action":"accept","content":{"color":"green"}}`},
		{"elicit color", pick("Decline"), "Pick a color", "Color", []string{"red", "green", "blue", "Decline"},
			`elicited {"action":"decline"}`},
		{"elicit color", timedOut, "Pick a color", "Color", []string{"red", "green", "blue", "Decline"},
			`elicited {"action":"cancel"}`},
		{"elicit confirm", pick("No"), "Pick a confirm", "Deploy to production?", []string{"Yes", "No"},
			`elicited {"action":"accept","content":{"sure":false}}`},
		{"elicit ok", pick("Accept"), "Pick a ok", "", []string{"Accept", "Decline"},
			`elicited {"action":"accept"}`},
		{"elicit link", pick("Done"), "Sign in to the tracker", "https://tracker.example/login?code=42", []string{"Done", "Decline"},
			`elicited {"action":"accept"}`},
		{"elicit name", pick("x"), "", "", nil, `elicited {"action":"decline"}`},
	}
	c := &conv{key: "k", id: "c"}
	for _, tc := range tests {
		t.Run(tc.msg, func(t *testing.T) {
			ap := &approver{answer: tc.answer}
			turn := c.turn(tc.msg)
			turn.Approver = ap
			if got := mustSay(t, r, turn); got != tc.reply {
				t.Errorf("reply %q, want %q", got, tc.reply)
			}
			qs := ap.questions()
			if tc.options == nil {
				if len(qs) != 0 {
					t.Errorf("asked %+v, want nothing asked", qs)
				}
				return
			}
			if len(qs) != 1 {
				t.Fatalf("asked %d questions, want 1", len(qs))
			}
			q := qs[0]
			var labels []string
			for _, o := range q.Options {
				labels = append(labels, o.Label)
			}
			if q.Title != tc.title || q.Detail != tc.detail || !slices.Equal(labels, tc.options) {
				t.Errorf("question %q / %q / %q, want %q / %q / %q", q.Title, q.Detail, labels, tc.title, tc.detail, tc.options)
			}
		})
	}
}
