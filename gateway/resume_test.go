package gateway

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
)

// TestResumedTurn: a resumed attempt (SendRequest.Resume, as a restored
// queued message carries it). Cut off in a model call, its runner runs at
// once and reads the gateway's note before the person's words, while the
// history keeps their words alone. Cut off in a tool call, the person is
// asked first — Resume / Cancel — and the runner runs only on Resume; on
// Cancel, or no answer within approvalTimeoutSeconds, the turn ends with
// "Not resumed" and the runner never ran.
func TestResumedTurn(t *testing.T) {
	model := event.Step{Kind: event.StepLLM, Name: "gpt"}
	shell := event.Step{Kind: event.StepTool, Name: "shell"}
	note := messages.ResumeNote(model, 2, 3)
	for _, tc := range []struct {
		name   string
		resume Resume
		answer string // "": nobody answers
		want   string
		ran    bool
	}{
		{"model step: at once", Resume{Attempt: 2, MaxAttempts: 3, Step: model}, "", "heard: " + note + "\n\nsummarise", true},
		{"tool step: Resume", Resume{Attempt: 2, MaxAttempts: 3, Step: shell, Confirm: true}, "resume",
			"heard: " + messages.ResumeNote(shell, 2, 3) + "\n\nsummarise", true},
		{"tool step: Cancel", Resume{Attempt: 2, MaxAttempts: 3, Step: shell, Confirm: true}, "cancel", messages.ResumeCancelled, false},
		{"tool step: no answer", Resume{Attempt: 2, MaxAttempts: 3, Step: shell, Confirm: true}, "", messages.ResumeCancelled, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var ran atomic.Bool
				rn := runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
					ran.Store(true)
					return runner.Result{Text: "heard: " + turn.Message}, nil
				})
				e, s := approvalEnv(t, rn, func(c *config.Config) { c.Agents.Defaults.TimeoutSeconds = secs(120) }) // past the question's 60 s
				r := tc.resume
				if _, err := e.Send(context.Background(), SendRequest{SessionKey: "chat1", Channel: "telegram", RunID: "r1-attempt-2",
					Text: "summarise", Resume: &r}); err != nil {
					t.Fatal(err)
				}
				if r.Confirm {
					q := waitQuestion(t, e, "chat1")
					if q.Title != messages.ResumeQuestion(shell) || len(q.Options) != 2 ||
						q.Options[0].Label != messages.ResumeOption || q.Options[1].Label != messages.CancelOption {
						t.Fatalf("the question %q with %+v, want %q with Resume / Cancel", q.Title, q.Options, messages.ResumeQuestion(shell))
					}
					if ran.Load() {
						t.Fatal("the runner ran before the person answered")
					}
					if tc.answer != "" {
						if _, err := e.Resolve(context.Background(), ResolveRequest{ApprovalID: q.ID, OptionID: tc.answer, SessionKey: "chat1", By: "@alice"}); err != nil {
							t.Fatal(err)
						}
					} else {
						elapse(61 * time.Second) // approvalTimeoutSeconds: 60
					}
				}
				out, ok := e.Wait(context.Background(), "r1-attempt-2")
				if !ok || out.StopReason != event.ReasonStop || out.Text != tc.want || ran.Load() != tc.ran {
					t.Fatalf("outcome %+v (runner ran: %v), want stop %q (runner ran: %v); transcript:\n%s", out, ran.Load(), tc.want, tc.ran, s.transcript())
				}
				_, h, err := e.History(context.Background(), "chat1", 10)
				if err != nil || len(h) != 2 || h[0].Text != "summarise" || h[1].Text != tc.want {
					t.Fatalf("history %+v, %v; want the person's words, then %q", h, err, tc.want)
				}
			})
		})
	}
}
