package gateway

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/timeout"
)

// askRunner asks one question once the turn starts (inside a tool step
// named after it), and replies with what it heard: "allowed by X",
// "denied (timeout)" and so on — what an agent would tell the person.
func askRunner(q runner.Question) runner.Runner {
	return runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		cb.StepStarted(event.StepTool, q.Tool)
		ans, err := turn.Ask(ctx, q)
		if err != nil {
			return runner.Result{Text: "stopped while asking"}, err
		}
		cb.StepCompleted(event.StepTool, q.Tool)
		if ans.Allowed() {
			return runner.Result{Text: "ran it: allowed (" + ans.OptionID + ") by " + ans.By}, nil
		}
		return runner.Result{Text: "did not run it: " + string(ans.Outcome) + " " + ans.OptionID}, nil
	})
}

var deployQuestion = runner.Question{Title: "Run `make deploy`", Detail: "in /srv/app", Tool: "shell",
	Options: []runner.Option{{ID: "yes", Label: "Allow once", Kind: runner.AllowOnce},
		{ID: "always", Label: "Always allow", Kind: runner.AllowAlways},
		{ID: "no", Label: "Deny", Kind: runner.RejectOnce}}}

// approvalEnv starts an engine whose turns run rn with a 2s liveness
// window, a 40s wall clock and approvals that wait 60s.
func approvalEnv(t *testing.T, rn runner.Runner, adjust func(*config.Config)) (*Engine, *sink) {
	t.Helper()
	c := testConfig(t, func(c *config.Config) {
		c.Agents.Defaults.Runner = config.RunnerDemo
		c.Agents.Defaults.StepTimeoutSeconds = secs(2)
		c.Agents.Defaults.TimeoutSeconds = secs(40)
		c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(0)
		c.Agents.Defaults.ApprovalTimeoutSeconds = secs(60)
		if adjust != nil {
			adjust(c)
		}
	})
	return startEngine(t, c, map[string]runner.Runner{config.RunnerDemo: rn})
}

// waitQuestion waits (in the bubble) until the session has an open question.
func waitQuestion(t *testing.T, e *Engine, session string) event.Approval {
	t.Helper()
	synctest.Wait()
	open := e.PendingApprovals(session)
	if len(open) != 1 {
		t.Fatalf("open questions of %s: %+v, want 1", session, open)
	}
	return open[0]
}

// elapse lets d pass on the bubble's fake clock (synctest: instant).
func elapse(d time.Duration) { <-time.After(d) }

func eventsOf(s *sink, k event.Kind) []event.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []event.Event
	for _, ev := range s.events {
		if ev.Kind == k {
			out = append(out, ev)
		}
	}
	return out
}

// TestApprovalAnswered: the person allows after 30s — far past the 2s
// liveness window, which is stopped while the question is open — and the
// turn goes on and finishes with the runner's words. The person read the
// question and then how it was settled, in words.
func TestApprovalAnswered(t *testing.T) {
	for _, tc := range []struct {
		option, want, settled string
	}{
		{"yes", "ran it: allowed (yes) by @alice", "✅ Allowed by @alice: Run `make deploy`"},
		{"always", "ran it: allowed (always) by @alice", "✅ Always allowed by @alice: Run `make deploy`"},
		{"no", "did not run it: selected no", "🚫 Denied by @alice: Run `make deploy`"},
	} {
		t.Run(tc.option, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e, s := approvalEnv(t, askRunner(deployQuestion), nil)
				if _, err := e.Send(context.Background(), SendRequest{SessionKey: "chat1", Channel: "telegram", RunID: "r1", Text: "deploy"}); err != nil {
					t.Fatal(err)
				}
				q := waitQuestion(t, e, "chat1")
				asked := eventsOf(s, event.ApprovalRequested)
				if len(asked) != 1 {
					t.Fatalf("ApprovalRequested events: %d", len(asked))
				}
				wantAsk := "🔐 Approval needed: Run `make deploy`\nin /srv/app\nAnswer within 1 min, or it will be denied."
				if asked[0].Message != wantAsk || asked[0].Step.Label() != "shell" {
					t.Fatalf("question shown as %q during step %q, want %q during shell", asked[0].Message, asked[0].Step.Label(), wantAsk)
				}
				if len(q.Options) != 3 || q.Options[1].Label != "Always allow" {
					t.Fatalf("options %+v", q.Options)
				}
				if l := e.Live(); len(l) != 1 || !l[0].Paused {
					t.Fatal("the turn is not paused while its question is open")
				}
				elapse(30 * time.Second) // the person takes their time
				res, err := e.Resolve(context.Background(), ResolveRequest{ApprovalID: q.ID, OptionID: tc.option, SessionKey: "chat1", By: "@alice"})
				if err != nil || res.Already {
					t.Fatalf("Resolve: %+v, %v", res, err)
				}
				out, ok := e.Wait(context.Background(), "r1")
				if !ok || out.StopReason != event.ReasonStop || out.Text != tc.want {
					t.Fatalf("outcome %+v, want stop %q; transcript:\n%s", out, tc.want, s.transcript())
				}
				settled := eventsOf(s, event.ApprovalResolved)
				if len(settled) != 1 || settled[0].Message != tc.settled {
					t.Fatalf("settled events %+v, want one saying %q", settled, tc.settled)
				}
				// A second answer changes nothing and says how it stood.
				again, err := e.Resolve(context.Background(), ResolveRequest{ApprovalID: q.ID, OptionID: "no", SessionKey: "chat1", By: "@bob"})
				if err != nil || !again.Already || again.Approval.OptionID != tc.option || again.Approval.By != "@alice" {
					t.Fatalf("second answer: %+v, %v", again, err)
				}
			})
		})
	}
}

// TestApprovalUnansweredIsDenied: nobody answers; after
// approvalTimeoutSeconds (60s) the question is denied with its reject
// option, the person is told, and the turn goes on (the runner hears
// "timeout"). Nothing else stopped it meanwhile: not the 2s liveness window.
func TestApprovalUnansweredIsDenied(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, s := approvalEnv(t, askRunner(deployQuestion), func(c *config.Config) { c.Agents.Defaults.TimeoutSeconds = secs(120) })
		start := time.Now()
		if _, err := e.Send(context.Background(), SendRequest{SessionKey: "chat1", Channel: "telegram", RunID: "r1", Text: "deploy"}); err != nil {
			t.Fatal(err)
		}
		out, ok := e.Wait(context.Background(), "r1")
		if !ok || out.StopReason != event.ReasonStop || out.Text != "did not run it: timeout no" {
			t.Fatalf("outcome %+v; transcript:\n%s", out, s.transcript())
		}
		if took := time.Since(start); took != 60*time.Second {
			t.Errorf("denied after %v, want 60s", took)
		}
		settled := eventsOf(s, event.ApprovalResolved)
		want := "⌛ No answer within 1 min, so it was denied: Run `make deploy`"
		if len(settled) != 1 || settled[0].Message != want || settled[0].Approval.Outcome != event.ApprovalTimeout {
			t.Fatalf("settled %+v, want %q", settled, want)
		}
		if len(e.PendingApprovals("")) != 0 {
			t.Fatal("a denied question is still open")
		}
	})
}

// TestApprovalWallClockStillRuns: the wall clock is not paused by a
// question: a 40s turn waiting on a 60s question is stopped at 40s for its
// time limit, the runner's Ask returns, and the question is no longer open
// (a late answer is told it was cancelled).
func TestApprovalWallClockStillRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, s := approvalEnv(t, askRunner(deployQuestion), nil)
		start := time.Now()
		if _, err := e.Send(context.Background(), SendRequest{SessionKey: "chat1", Channel: "telegram", RunID: "r1", Text: "deploy"}); err != nil {
			t.Fatal(err)
		}
		q := waitQuestion(t, e, "chat1")
		out, _ := e.Wait(context.Background(), "r1")
		if out.StopReason != event.ReasonTimeout || time.Since(start) != 40*time.Second {
			t.Fatalf("outcome %+v after %v, want a timeout at 40s; transcript:\n%s", out, time.Since(start), s.transcript())
		}
		synctest.Wait()
		late, err := e.Resolve(context.Background(), ResolveRequest{ApprovalID: q.ID, OptionID: "yes", SessionKey: "chat1"})
		if err != nil || !late.Already || late.Approval.Outcome != event.ApprovalCancelled {
			t.Fatalf("late answer: %+v, %v", late, err)
		}
		if n := len(eventsOf(s, event.ApprovalResolved)); n != 0 {
			t.Errorf("%d ApprovalResolved events for a stopped turn; its ending speaks for it", n)
		}
	})
}

// TestApprovalStopWhileWaiting: /stop while the question is open stops the
// turn as the user's stop, at once.
func TestApprovalStopWhileWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, s := approvalEnv(t, askRunner(deployQuestion), nil)
		if _, err := e.Send(context.Background(), SendRequest{SessionKey: "chat1", Channel: "telegram", RunID: "r1", Text: "deploy"}); err != nil {
			t.Fatal(err)
		}
		waitQuestion(t, e, "chat1")
		elapse(5 * time.Second)
		if _, err := e.Stop(context.Background(), "chat1", "", false); err != nil {
			t.Fatal(err)
		}
		out, _ := e.Wait(context.Background(), "r1")
		if out.StopReason != event.ReasonUser || !strings.HasPrefix(out.Message, "⏹️ Stopped while shell was running after 5 s") {
			t.Fatalf("outcome %+v; transcript:\n%s", out, s.transcript())
		}
		if len(e.PendingApprovals("")) != 0 {
			t.Fatal("the stopped turn's question is still open")
		}
	})
}

// TestApprovalWhoMayAnswer: only the chat the turn belongs to, or an
// operator, may answer; an unknown option or question is refused with a
// typed error and changes nothing.
func TestApprovalWhoMayAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, s := approvalEnv(t, askRunner(deployQuestion), nil)
		if _, err := e.Send(context.Background(), SendRequest{SessionKey: "chat1", Channel: "telegram", RunID: "r1", Text: "deploy"}); err != nil {
			t.Fatal(err)
		}
		q := waitQuestion(t, e, "chat1")
		for _, tc := range []struct {
			name string
			req  ResolveRequest
			want error
		}{
			{"another chat", ResolveRequest{ApprovalID: q.ID, OptionID: "yes", SessionKey: "chat2", By: "@mallory"}, ErrApprovalForbidden},
			{"no such option", ResolveRequest{ApprovalID: q.ID, OptionID: "sudo", SessionKey: "chat1"}, ErrApprovalOption},
			{"no such question", ResolveRequest{ApprovalID: "ap_nope", OptionID: "yes", SessionKey: "chat1"}, ErrApprovalNotFound},
		} {
			if _, err := e.Resolve(context.Background(), tc.req); !errors.Is(err, tc.want) {
				t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
			}
		}
		if len(e.PendingApprovals("chat1")) != 1 {
			t.Fatal("a refused answer settled the question")
		}
		res, err := e.Resolve(context.Background(), ResolveRequest{ApprovalID: q.ID, OptionID: "yes", Operator: true})
		if err != nil || res.Approval.By != "an operator" {
			t.Fatalf("operator's answer: %+v, %v", res, err)
		}
		out, _ := e.Wait(context.Background(), "r1")
		if out.Text != "ran it: allowed (yes) by an operator" {
			t.Fatalf("outcome %+v; transcript:\n%s", out, s.transcript())
		}
	})
}

// TestApprovalDefaultsAndBounds: a question with no options gets Allow and
// Deny; an over-long title is cut; a question without a title is refused
// (the runner learns it could not ask).
func TestApprovalDefaultsAndBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		long := strings.Repeat("x", 1000)
		e, _ := approvalEnv(t, askRunner(runner.Question{Title: long, Tool: "shell"}), nil)
		if _, err := e.Send(context.Background(), SendRequest{SessionKey: "chat1", Channel: "ws", RunID: "r1", Text: "go"}); err != nil {
			t.Fatal(err)
		}
		q := waitQuestion(t, e, "chat1")
		if len([]rune(q.Title)) != maxApprovalTitle || !strings.HasSuffix(q.Title, "…") {
			t.Errorf("title of %d characters", len([]rune(q.Title)))
		}
		if len(q.Options) != 2 || q.Options[0].Label != "Allow" || q.Options[1].Label != "Deny" {
			t.Errorf("default options %+v", q.Options)
		}
		_, err := (&approver{e: e}).Ask(context.Background(), runner.Question{})
		if !errors.Is(err, runner.ErrNoApprover) {
			t.Errorf("a question without a title: %v", err)
		}
	})
}

// TestActivityWithoutWords: an agent's thoughts (runner.ActivityReporter)
// keep a turn alive only under livenessResetOn: activity, and show the
// person nothing.
func TestActivityWithoutWords(t *testing.T) {
	thinker := runner.Func(func(ctx context.Context, _ runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		cb.StepStarted(event.StepLLM, "agent")
		for range 5 {
			select {
			case <-ctx.Done():
				return runner.Result{}, ctx.Err()
			case <-time.After(time.Second):
			}
			cb.(runner.ActivityReporter).Activity()
		}
		cb.StepCompleted(event.StepLLM, "agent")
		return runner.Result{Text: "thought it through"}, nil
	})
	for _, tc := range []struct {
		mode   timeout.LivenessMode
		reason event.StopReason
	}{{timeout.LivenessActivity, event.ReasonStop}, {timeout.LivenessStep, event.ReasonStepTimeout}} {
		t.Run(string(tc.mode), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e, s := approvalEnv(t, thinker, func(c *config.Config) { c.Agents.Defaults.LivenessResetOn = tc.mode })
				if _, err := e.Send(context.Background(), SendRequest{SessionKey: "c", Channel: "ws", RunID: "r1", Text: "think"}); err != nil {
					t.Fatal(err)
				}
				out, _ := e.Wait(context.Background(), "r1")
				if out.StopReason != tc.reason {
					t.Fatalf("outcome %+v, want %s; transcript:\n%s", out, tc.reason, s.transcript())
				}
				if n := len(eventsOf(s, event.Delta)); n != 0 {
					t.Errorf("%d delta events: thoughts reached the person", n)
				}
			})
		})
	}
}
