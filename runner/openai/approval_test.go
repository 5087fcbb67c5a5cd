package openai

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner"
)

// approver is a test Approver: fn answers, every question is recorded.
type approver struct {
	fn    func(ctx context.Context, q runner.Question) (runner.Answer, error)
	mu    sync.Mutex
	asked []runner.Question
}

func (a *approver) Ask(ctx context.Context, q runner.Question) (runner.Answer, error) {
	a.mu.Lock()
	a.asked = append(a.asked, q)
	a.mu.Unlock()
	return a.fn(ctx, q)
}

func (a *approver) questions() []runner.Question {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.asked)
}

func answerWith(outcome runner.Outcome, id string, kind runner.OptionKind) func(context.Context, runner.Question) (runner.Answer, error) {
	return func(context.Context, runner.Question) (runner.Answer, error) {
		return runner.Answer{Outcome: outcome, OptionID: id, Kind: kind, By: "alice"}, nil
	}
}

// TestRequireApproval: a command tool marked requireApproval runs only when
// the person allows it; otherwise the model gets a denial as its result and
// the turn goes on. What is asserted is what the model and the person see.
func TestRequireApproval(t *testing.T) {
	long := `{"path":"` + strings.Repeat("é", 600) + `"}`
	tests := []struct {
		name    string
		args    string
		approve func(context.Context, runner.Question) (runner.Answer, error) // nil: the turn has no Approver
		detail  string                                                        // of the question
		ran     bool
		result  string // the tool result the model got
		events  []string
	}{{
		name:    "allowed: the tool runs and the model gets its output",
		args:    `{"path":"/srv"}`,
		approve: answerWith(runner.Selected, "allow", runner.AllowOnce),
		detail:  `{"path":"/srv"}`,
		ran:     true,
		result:  "42% used\n",
		events: []string{"start llm test-model", "done llm test-model",
			"start tool disk_usage", "done tool disk_usage",
			"start llm test-model", `delta "Done."`, "done llm test-model"},
	}, {
		name:    "denied: the tool does not run, the model is told",
		args:    `{"path":"/srv"}`,
		approve: answerWith(runner.Selected, "deny", runner.RejectOnce),
		detail:  `{"path":"/srv"}`,
		result:  "The user denied this tool call.",
		events:  []string{"start llm test-model", "done llm test-model", "start llm test-model", `delta "Done."`, "done llm test-model"},
	}, {
		name:    "no answer in time",
		args:    `{"path":"/srv"}`,
		approve: answerWith(runner.TimedOut, "deny", runner.RejectOnce),
		detail:  `{"path":"/srv"}`,
		result:  "No answer in time: the tool call was denied.",
		events:  []string{"start llm test-model", "done llm test-model", "start llm test-model", `delta "Done."`, "done llm test-model"},
	}, {
		name:   "no Approver: denied at once",
		args:   `{"path":"/srv"}`,
		result: "No answer in time: the tool call was denied.",
		events: []string{"start llm test-model", "done llm test-model", "start llm test-model", `delta "Done."`, "done llm test-model"},
	}, {
		name: "nobody can be asked",
		args: `{"path":"/srv"}`,
		approve: func(context.Context, runner.Question) (runner.Answer, error) {
			return runner.Answer{}, runner.ErrNoApprover
		},
		detail: `{"path":"/srv"}`,
		result: "Nobody could be asked for approval: the tool call was denied.",
		events: []string{"start llm test-model", "done llm test-model", "start llm test-model", `delta "Done."`, "done llm test-model"},
	}, {
		name:    "long arguments are cut in the question, not in the call",
		args:    long,
		approve: answerWith(runner.Selected, "allow", runner.AllowOnce),
		detail:  long[:999] + "…", // 1000 bytes would split an é
		ran:     true,
		result:  "42% used\n",
		events: []string{"start llm test-model", "done llm test-model",
			"start tool disk_usage", "done tool disk_usage",
			"start llm test-model", `delta "Done."`, "done llm test-model"},
	}, {
		name: "arguments that are not JSON: not asked, the model gets the error",
		args: `{"path":`,
		approve: func(_ context.Context, q runner.Question) (runner.Answer, error) {
			t.Errorf("asked %+v", q)
			return runner.Answer{}, errors.New("must not ask")
		},
		result: "error: the arguments are not valid JSON",
		events: []string{"start llm test-model", "done llm test-model",
			"start tool disk_usage", "done tool disk_usage",
			"start llm test-model", `delta "Done."`, "done llm test-model"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mark := filepath.Join(t.TempDir(), "ran")
				fake := newFake(t, callTool("c1", "disk_usage", tt.args), answer("Done."))
				r, _ := newTestRunner(t, config.OpenAI{Tools: config.OpenAITools{Commands: []config.CommandTool{{
					Name: "disk_usage", Argv: []string{"testdata/mark_tool.sh", mark}, RequireApproval: true,
				}}}}, fake)
				tr := turn
				var a *approver
				if tt.approve != nil {
					a = &approver{fn: tt.approve}
					tr.Approver = a
				}
				rec := newRecorder()
				res, err := r.Run(t.Context(), tr, rec)
				if err != nil {
					t.Fatal(err)
				}
				if res.Text != "Done." {
					t.Errorf("reply %q", res.Text)
				}
				if got := rec.events(); !slices.Equal(got, tt.events) {
					t.Errorf("events\n got %q\nwant %q", got, tt.events)
				}
				_, statErr := os.Stat(mark)
				if ran := statErr == nil; ran != tt.ran {
					t.Errorf("the tool ran: %v, want %v", ran, tt.ran)
				}
				reqs := fake.requests()
				if len(reqs) != 2 {
					t.Fatalf("%d model calls, want 2", len(reqs))
				}
				msgs := reqs[1].body.Messages
				if m := msgs[len(msgs)-1]; m.Role != "tool" || m.ToolCallID != "c1" || m.Content == nil || *m.Content != tt.result {
					t.Errorf("the model got %+v, want the result %q", m, tt.result)
				}
				if a != nil && tt.detail != "" {
					want := []runner.Question{{Title: "Run tool disk_usage", Detail: tt.detail, Tool: "disk_usage"}}
					if got := a.questions(); !slices.EqualFunc(got, want, func(x, y runner.Question) bool {
						return x.Title == y.Title && x.Detail == y.Detail && x.Tool == y.Tool && len(x.Options) == 0
					}) {
						t.Errorf("asked\n %+v\nwant\n %+v", got, want)
					}
				}
			})
		})
	}
}

// TestApprovalOnlyForMarkedTools: tools without requireApproval are not
// asked about.
func TestApprovalOnlyForMarkedTools(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := newFake(t, callTool("c1", "current_time", `{}`), answer("Noon."))
		r, _ := newTestRunner(t, config.OpenAI{Tools: config.OpenAITools{CurrentTime: true}}, fake)
		tr := turn
		tr.Approver = &approver{fn: func(_ context.Context, q runner.Question) (runner.Answer, error) {
			t.Errorf("asked %+v", q)
			return runner.Answer{}, errors.New("must not ask")
		}}
		if _, err := r.Run(t.Context(), tr, newRecorder()); err != nil {
			t.Fatal(err)
		}
		msgs := fake.requests()[1].body.Messages
		if m := msgs[len(msgs)-1]; !strings.Contains(*m.Content, `"utc":`) {
			t.Errorf("the model got %q", *m.Content)
		}
	})
}

// TestAbortWhileAsking: a turn stopped while the person is asked returns
// the context's error; the tool does not run and no other model call is
// made.
func TestAbortWhileAsking(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mark := filepath.Join(t.TempDir(), "ran")
		fake := newFake(t, stream(textChunk("Checking."), toolStartChunk(0, "c1", "disk_usage"), toolArgsChunk(0, `{}`), finishChunk("tool_calls")), answer("never"))
		r, _ := newTestRunner(t, config.OpenAI{Tools: config.OpenAITools{Commands: []config.CommandTool{{
			Name: "disk_usage", Argv: []string{"testdata/mark_tool.sh", mark}, RequireApproval: true,
		}}}}, fake)
		ctx, cancel := context.WithCancel(t.Context())
		tr := turn
		tr.Approver = &approver{fn: func(ctx context.Context, q runner.Question) (runner.Answer, error) {
			cancel() // the person stops the turn instead of answering
			<-ctx.Done()
			return runner.Answer{}, ctx.Err()
		}}
		rec := newRecorder()
		res, err := r.Run(ctx, tr, rec)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if res.Text != "Checking." {
			t.Errorf("reply %q, want the partial text", res.Text)
		}
		if _, err := os.Stat(mark); err == nil {
			t.Error("the tool ran")
		}
		want := []string{"start llm test-model", `delta "Checking."`, "done llm test-model"}
		if got := rec.events(); !slices.Equal(got, want) {
			t.Errorf("events %q, want %q", got, want)
		}
		if n := len(fake.requests()); n != 1 {
			t.Errorf("%d model calls, want 1", n)
		}
	})
}

// TestHTTPGetRequireApproval: http_get can be marked too; a denied fetch
// is not made.
func TestHTTPGetRequireApproval(t *testing.T) {
	r, err := New(config.OpenAI{Model: "m", Tools: config.OpenAITools{HTTPGet: config.HTTPGetTool{
		Enabled: true, Allow: []string{"https://example.com/"}, RequireApproval: true,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	a := &approver{fn: answerWith(runner.Selected, "deny", runner.RejectOnce)}
	got, err := r.approve(t.Context(), runner.Turn{Approver: a}, ToolHTTPGet, `{"url":"https://example.com/x"}`)
	if err != nil || got != DeniedResult {
		t.Fatalf("approve = %q, %v", got, err)
	}
	if q := a.questions(); len(q) != 1 || q[0].Title != "Run tool http_get" || q[0].Detail != `{"url":"https://example.com/x"}` {
		t.Errorf("asked %+v", q)
	}
}
