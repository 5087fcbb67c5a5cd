package messages_test

import (
	"regexp"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
)

// goDuration matches a duration as Go's time.Duration.String writes it
// (5m0s, 1h0m0s, 3.9s, 450ms): a number glued to its unit.
var goDuration = regexp.MustCompile(`\d+(\.\d+)?(h|m|s|ms|µs|ns)(\d|\b)`)

// TestNoGoDurationReachesPeople renders every built-in text — each
// template, the approval questions and their endings — over durations from
// milliseconds to hours, and fails on any duration written the Go way
// (issue 22: "Answer within 5m0s", "(1h0m0s)", "4m59s").
func TestNoGoDurationReachesPeople(t *testing.T) {
	set := messages.MustDefault()
	shell := event.Step{Kind: event.StepTool, Name: "shell"}
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, d := range []time.Duration{0, 450 * time.Millisecond, 3900 * time.Millisecond, 15 * time.Second,
		90 * time.Second, 4*time.Minute + 59*time.Second, 5 * time.Minute, 12*time.Minute + 20*time.Second,
		time.Hour, 90 * time.Minute, 2*time.Hour + 5*time.Minute + 10*time.Second} {
		for name := range messages.Defaults {
			got := set.Render(name, messages.Fields{Elapsed: messages.Duration(d), StepTimeout: messages.Duration(d),
				Limit: messages.Duration(d), Left: messages.Duration(d), CurrentStep: "shell", LastStep: "web_search", ErrorID: "E7K2QX"})
			if m := goDuration.FindString(got); m != "" {
				t.Errorf("%s with %v shows %q: %q", name, d, m, got)
			}
		}
		a := &event.Approval{Title: "Run deploy", Tool: "deploy", CreatedAt: start, ExpiresAt: start.Add(d),
			Options: []event.ApprovalOption{{ID: "allow", Label: "Allow", Kind: "allow_once"}}}
		for _, ev := range []event.Event{
			{Kind: event.ApprovalRequested, Approval: a},
			{Kind: event.ApprovalResolved, Approval: &event.Approval{Title: a.Title, CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt,
				Outcome: event.ApprovalTimeout}},
			{Kind: event.Progress, Step: shell, Elapsed: d},
			{Kind: event.BudgetWarning, Step: shell, Elapsed: d, Limit: d},
		} {
			if got := messages.Render(nil, ev); goDuration.MatchString(got) {
				t.Errorf("%v with %v shows a Go duration: %q", ev.Kind, d, got)
			}
		}
		if got := messages.RunnerBudgetNote(d); goDuration.MatchString(got) {
			t.Errorf("the runner's budget note with %v shows a Go duration: %q", d, got)
		}
	}
}

// TestIssue23Words: how the budget warning and the provider switch read
// (issue 23). The warning names what will be stopped ("Your request", as
// the other notices do: on Telegram it is a message of its own, with no
// "this" to point at) and the time in words; the switch names the models
// as Markdown code spans, shown as code by Telegram and the web chat
// whatever characters they hold.
func TestIssue23Words(t *testing.T) {
	if got, want := messages.Render(nil, event.Event{Kind: event.BudgetWarning, Limit: 90 * time.Second}),
		"⏳ Your request will be stopped in 1 min 30 s unless it finishes."; got != want {
		t.Errorf("budget warning %q, want %q", got, want)
	}
	for _, tc := range []struct {
		from, to string
		timedOut bool
		want     string
	}{
		{"gpt-4o-mini", "llama3.2", true, "↪️ The model `gpt-4o-mini` did not answer in time; switched to `llama3.2`."},
		{"my*model*v2", "backup_v1", false, "↪️ The model `my*model*v2` failed; switched to `backup_v1`."},
		{"odd`name", "b", false, "↪️ The model `odd'name` failed; switched to `b`."},
	} {
		if got := messages.ProviderSwitched(tc.from, tc.to, tc.timedOut); got != tc.want {
			t.Errorf("ProviderSwitched(%q, %q) = %q, want %q", tc.from, tc.to, got, tc.want)
		}
	}
}

// TestApprovalSettledWords: how a settled question reads, per option kind
// and per channel's answerer (issue 22: "✅ Allow by web chat: Run deploy").
func TestApprovalSettledWords(t *testing.T) {
	opts := []event.ApprovalOption{{ID: "allow", Label: "Allow", Kind: "allow_once"},
		{ID: "always", Label: "Allow always", Kind: "allow_always"}, {ID: "deny", Label: "Deny", Kind: "reject_once"},
		{ID: "never", Label: "Never", Kind: "reject_always"}, {ID: "skip", Label: "Skip"}}
	for _, tc := range []struct{ option, kind, by, want string }{
		{"allow", "allow_once", "web chat", "✅ Allowed in the web chat: Run deploy"},
		{"allow", "allow_once", "TUI", "✅ Allowed in the TUI: Run deploy"},
		{"allow", "allow_once", "@alice", "✅ Allowed by @alice: Run deploy"},
		{"deny", "reject_once", "operator", "🚫 Denied by the operator: Run deploy"},
		{"deny", "reject_once", "an operator", "🚫 Denied by an operator: Run deploy"},
		{"always", "allow_always", "WebSocket client", "✅ Always allowed by a WebSocket client: Run deploy"},
		{"never", "reject_always", "Alice", "🚫 Always denied by Alice: Run deploy"},
		{"skip", "", "@bob", "🚫 “Skip” chosen by @bob: Run deploy"},
		{"allow", "allow_once", "", "✅ Allowed: Run deploy"},
	} {
		a := &event.Approval{Title: "Run deploy", Options: opts, Outcome: event.ApprovalSelected,
			OptionID: tc.option, OptionKind: tc.kind, By: tc.by}
		if got := messages.ApprovalSettled(a); got != tc.want {
			t.Errorf("%s by %q: got %q, want %q", tc.option, tc.by, got, tc.want)
		}
	}
}
