package gateway

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"unicode/utf8"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
)

// TestReplyCap: whatever a runner streams or returns, the reply the user
// gets (final event, Wait, history) is at most agents.defaults.maxReplyChars
// characters and, when cut, says so at its end.
func TestReplyCap(t *testing.T) {
	big := strings.Repeat("x", 150_000)
	tests := []struct {
		name    string
		max     int // 0 = the default
		deltas  []string
		final   string
		want    string
		maxFull int // longest FullText of a delta event, in characters
	}{
		{"final text over the default cap", 0, nil, big,
			strings.Repeat("x", 100_000) + "\n\n[… reply truncated at 100,000 characters]", 0},
		{"streamed text only, cut in a chunk", 0, strings.Split(strings.Repeat("abcd", 37_500), "d"), "",
			strings.Repeat("abc", 33_333) + "a" + "\n\n[… reply truncated at 100,000 characters]", 100_000 + 41},
		{"characters, not bytes", 10, []string{"ééééé", "ééééé", "é"}, strings.Repeat("é", 20),
			"éééééééééé\n\n[… reply truncated at 10 characters]", 10 + 37},
		{"at the cap exactly: no marker", 10, []string{"0123456789"}, "0123456789", "0123456789", 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := config.Default()
				if tt.max > 0 {
					c.Agents.Defaults.MaxReplyChars = tt.max
				}
				if err := c.Validate(); err != nil {
					t.Fatal(err)
				}
				rn := runner.Func(func(ctx context.Context, _ runner.Turn, cb runner.Callbacks) (runner.Result, error) {
					for _, d := range tt.deltas {
						cb.Delta(d)
					}
					return runner.Result{Text: tt.final}, nil
				})
				e, err := New(Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": rn}})
				if err != nil {
					t.Fatal(err)
				}
				e.Start(t.Context())
				defer e.Shutdown(context.Background())
				maxFull, finished, streamed := 0, "", ""
				unsub := e.Bus().Subscribe("", func(ev event.Event) {
					switch ev.Kind {
					case event.Delta:
						maxFull = max(maxFull, utf8.RuneCountInString(ev.FullText))
						streamed += ev.Text
					case event.Finished:
						finished = ev.FullText
					}
				})
				defer unsub()
				if _, err := e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: "r1", Text: "go", Owner: "c"}); err != nil {
					t.Fatal(err)
				}
				out, ok := e.Wait(context.Background(), "r1")
				synctest.Wait()
				if !ok || out.Text != tt.want || finished != tt.want {
					t.Fatalf("reply (%d chars) ends %q; finished event ends %q; want %d chars ending %q",
						utf8.RuneCountInString(out.Text), tail(out.Text), tail(finished), utf8.RuneCountInString(tt.want), tail(tt.want))
				}
				if n := utf8.RuneCountInString(tt.want); maxFull > n {
					t.Errorf("a delta event carried %d characters of full text, want at most %d", maxFull, n)
				}
				// The chunks a watcher receives add up to the capped text:
				// nothing streams past the cap.
				if tt.deltas != nil && streamed != tt.want {
					t.Errorf("streamed chunks (%d chars) end %q, want the capped reply ending %q",
						utf8.RuneCountInString(streamed), tail(streamed), tail(tt.want))
				}
				if _, h, _ := e.History(context.Background(), "main", 0); len(h) != 2 || h[1].Text != tt.want {
					t.Errorf("history does not hold the capped reply")
				}
			})
		})
	}
}

func tail(s string) string {
	if len(s) > 60 {
		return "…" + s[len(s)-60:]
	}
	return s
}
