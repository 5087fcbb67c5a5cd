package exec_test

// Permission requests (agents.exec.permissions): testdata/permission.sh
// writes requests, reads the answers from its stdin and records what it
// read; the tests assert the questions the person was asked, the lines the
// agent read and the reply. Real processes; the tests wait on channels.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/exec"
)

// approver is a test Approver: fn answers, every question is recorded.
type approver struct {
	fn func(ctx context.Context, q runner.Question) (runner.Answer, error)

	mu       sync.Mutex
	asked    []runner.Question
	inFlight int
}

func (a *approver) Ask(ctx context.Context, q runner.Question) (runner.Answer, error) {
	a.mu.Lock()
	a.asked = append(a.asked, q)
	a.inFlight++
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.inFlight--
		a.mu.Unlock()
	}()
	return a.fn(ctx, q)
}

func (a *approver) open() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inFlight
}

func (a *approver) questions() []runner.Question {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.asked)
}

// choose answers every question with the option id.
func choose(id string) func(context.Context, runner.Question) (runner.Answer, error) {
	return func(_ context.Context, q runner.Question) (runner.Answer, error) {
		for _, o := range q.Options {
			if o.ID == id {
				return runner.Answer{Outcome: runner.Selected, OptionID: o.ID, Kind: o.Kind, By: "alice"}, nil
			}
		}
		return runner.Answer{}, errors.New("no option " + id)
	}
}

// permissionAgent returns a runner of testdata/permission.sh writing the
// requests, and the file it records its stdin in.
func permissionAgent(t *testing.T, requests string, answers string, perms bool) (*exec.Runner, *logBuffer, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "stdin")
	r, logs := newRunner(t, config.Exec{
		Command: script("permission.sh"), Permissions: perms,
		Env: map[string]string{"OUT": out, "PERM_REQUESTS": requests, "PERM_ANSWERS": answers},
	})
	return r, logs, out
}

func readLinesOf(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

const (
	bashRequest = `{"type":"permission","id":"p1","title":"Run rm -rf build/","detail":"rm -rf build/ in /srv","tool":"Bash",` +
		`"options":[{"id":"yes","label":"Allow","kind":"allow_once"},{"id":"always","kind":"allow_always"},{"id":"no","label":"Deny","kind":"reject_once"}]}`
	messageLine = `{"type":"message","text":"clean up\nplease"}`
)

var bashQuestion = runner.Question{Title: "Run rm -rf build/", Detail: "rm -rf build/ in /srv", Tool: "Bash", Options: []runner.Option{
	{ID: "yes", Label: "Allow", Kind: runner.AllowOnce},
	{ID: "always", Label: "Always allow", Kind: runner.AllowAlways},
	{ID: "no", Label: "Deny", Kind: runner.RejectOnce},
}}

func TestPermissionRequests(t *testing.T) {
	tests := []struct {
		name     string
		requests string
		answers  string                                                                           // answers the agent reads; "" = 1
		approve  func(t *testing.T) func(context.Context, runner.Question) (runner.Answer, error) // nil: the turn has no Approver
		asked    []runner.Question
		stdin    []string // what the agent read after the message line
		text     string
		logs     []string
		malforms uint64
	}{{
		name:     "allowed",
		requests: bashRequest,
		approve:  func(*testing.T) func(context.Context, runner.Question) (runner.Answer, error) { return choose("yes") },
		asked:    []runner.Question{bashQuestion},
		stdin:    []string{`{"type":"permission_response","id":"p1","outcome":"selected","optionId":"yes","allowed":true}`},
		text:     "allowed",
		logs:     []string{"exec: agent asks for permission", "exec: permission answered"},
	}, {
		name:     "always allowed",
		requests: bashRequest,
		approve: func(*testing.T) func(context.Context, runner.Question) (runner.Answer, error) {
			return choose("always")
		},
		asked: []runner.Question{bashQuestion},
		stdin: []string{`{"type":"permission_response","id":"p1","outcome":"selected","optionId":"always","allowed":true}`},
		text:  "allowed",
	}, {
		name:     "denied",
		requests: bashRequest,
		approve:  func(*testing.T) func(context.Context, runner.Question) (runner.Answer, error) { return choose("no") },
		asked:    []runner.Question{bashQuestion},
		stdin:    []string{`{"type":"permission_response","id":"p1","outcome":"selected","optionId":"no","allowed":false}`},
		text:     "denied",
	}, {
		name:     "nobody answered in time",
		requests: bashRequest,
		approve: func(*testing.T) func(context.Context, runner.Question) (runner.Answer, error) {
			return func(context.Context, runner.Question) (runner.Answer, error) {
				return runner.Answer{Outcome: runner.TimedOut, OptionID: "no", Kind: runner.RejectOnce}, nil
			}
		},
		asked: []runner.Question{bashQuestion},
		stdin: []string{`{"type":"permission_response","id":"p1","outcome":"timeout","optionId":"no","allowed":false}`},
		text:  "denied",
	}, {
		name:     "no Approver denies at once with the default options",
		requests: `{"type":"permission","id":42,"title":"Edit main.go"}`,
		stdin:    []string{`{"type":"permission_response","id":42,"outcome":"timeout","optionId":"deny","allowed":false}`},
		text:     "denied",
	}, {
		name:     "options left out are the default pair; a numeric id is echoed",
		requests: `{"type":"permission","id":7,"title":"Edit main.go","tool":"Edit"}`,
		approve:  func(*testing.T) func(context.Context, runner.Question) (runner.Answer, error) { return choose("allow") },
		asked:    []runner.Question{{Title: "Edit main.go", Tool: "Edit", Options: runner.DefaultOptions}},
		stdin:    []string{`{"type":"permission_response","id":7,"outcome":"selected","optionId":"allow","allowed":true}`},
		text:     "allowed",
	}, {
		name:     "a field another event types differently does not hide the request",
		requests: `{"type":"permission","id":"n1","name":5,"title":"Fetch"}`,
		approve:  func(*testing.T) func(context.Context, runner.Question) (runner.Answer, error) { return choose("allow") },
		asked:    []runner.Question{{Title: "Fetch", Options: runner.DefaultOptions}},
		stdin:    []string{`{"type":"permission_response","id":"n1","outcome":"selected","optionId":"allow","allowed":true}`},
		text:     "allowed",
	}, {
		name:     "no title: refused without asking",
		requests: `{"type":"permission","id":"m1","detail":"?"}`,
		approve:  func(t *testing.T) func(context.Context, runner.Question) (runner.Answer, error) { return mustNotAsk(t) },
		stdin:    []string{`{"type":"permission_response","id":"m1","outcome":"refused","allowed":false,"reason":"\"title\" is required"}`},
		text:     "denied",
		logs:     []string{"exec: malformed output line", "exec: permission request refused"},
		malforms: 1,
	}, {
		name:     "unknown option kind: refused",
		requests: `{"type":"permission","id":"m2","title":"T","options":[{"id":"x","kind":"maybe"}]}`,
		approve:  func(t *testing.T) func(context.Context, runner.Question) (runner.Answer, error) { return mustNotAsk(t) },
		stdin:    []string{`{"type":"permission_response","id":"m2","outcome":"refused","allowed":false,"reason":"options[0].kind \"maybe\" is not allow_once, allow_always, reject_once or reject_always"}`},
		text:     "denied",
		malforms: 1,
	}, {
		name:     "duplicate option ids: refused",
		requests: `{"type":"permission","id":"m3","title":"T","options":[{"id":"x","kind":"allow_once"},{"id":"x","kind":"reject_once"}]}`,
		approve:  func(t *testing.T) func(context.Context, runner.Question) (runner.Answer, error) { return mustNotAsk(t) },
		stdin:    []string{`{"type":"permission_response","id":"m3","outcome":"refused","allowed":false,"reason":"options[1].id \"x\" is not unique"}`},
		text:     "denied",
		malforms: 1,
	}, {
		name:     "no id: refused with a null id",
		requests: `{"type":"permission","title":"T"}`,
		approve:  func(t *testing.T) func(context.Context, runner.Question) (runner.Answer, error) { return mustNotAsk(t) },
		stdin:    []string{`{"type":"permission_response","id":null,"outcome":"refused","allowed":false,"reason":"\"id\" must be a non-empty string or a number"}`},
		text:     "denied",
		malforms: 1,
	}, {
		name:     "an Approver that cannot ask: refused",
		requests: bashRequest,
		approve: func(*testing.T) func(context.Context, runner.Question) (runner.Answer, error) {
			return func(context.Context, runner.Question) (runner.Answer, error) {
				return runner.Answer{}, runner.ErrNoApprover
			}
		},
		asked: []runner.Question{bashQuestion},
		stdin: []string{`{"type":"permission_response","id":"p1","outcome":"refused","allowed":false,"reason":"nobody can be asked"}`},
		text:  "denied",
		logs:  []string{"exec: permission request could not be asked; denied"},
	}, {
		// a waits until b is answered: asked one after the other, this
		// would never end.
		name: "questions are open at once and answered in any order",
		requests: `{"type":"permission","id":"a","title":"A"}` + "\n" +
			`{"type":"permission","id":"b","title":"B"}`,
		answers: "2",
		asked:   []runner.Question{{Title: "A", Options: runner.DefaultOptions}, {Title: "B", Options: runner.DefaultOptions}},
		approve: func(*testing.T) func(context.Context, runner.Question) (runner.Answer, error) {
			bDone := make(chan struct{})
			return func(ctx context.Context, q runner.Question) (runner.Answer, error) {
				if q.Title == "B" {
					defer close(bDone)
					return runner.Answer{Outcome: runner.Selected, OptionID: "deny", Kind: runner.RejectOnce}, nil
				}
				select {
				case <-bDone:
				case <-ctx.Done():
					return runner.Answer{}, ctx.Err()
				}
				return runner.Answer{Outcome: runner.Selected, OptionID: "allow", Kind: runner.AllowOnce}, nil
			}
		},
		stdin: []string{ // sorted
			`{"type":"permission_response","id":"a","outcome":"selected","optionId":"allow","allowed":true}`,
			`{"type":"permission_response","id":"b","outcome":"selected","optionId":"deny","allowed":false}`,
		},
		text: "allowed",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, logs, out := permissionAgent(t, tt.requests, tt.answers, true)
			turn := runner.Turn{RunID: "run-1", Message: "clean up\nplease"}
			var a *approver
			if tt.approve != nil {
				a = &approver{fn: tt.approve(t)}
				turn.Approver = a
			}
			ch := make(chan outcome, 1)
			go func() {
				res, err := r.Run(t.Context(), turn, newRecorder())
				ch <- outcome{res: res, err: err}
			}()
			o := await(t, ch)
			if o.err != nil {
				t.Fatalf("Run: %v\n%s", o.err, logs)
			}
			if o.res.Text != tt.text {
				t.Errorf("reply %q, want %q", o.res.Text, tt.text)
			}
			want := append([]string{"perms=1", messageLine}, tt.stdin...)
			got := readLinesOf(t, out)
			if len(got) > 2 {
				slices.Sort(got[2:]) // answers come as the person answers
			}
			if !slices.Equal(got, want) {
				t.Errorf("the agent read\n %q\nwant\n %q", got, want)
			}
			if a != nil {
				got := a.questions() // in the order asked: sorted, as questions may be asked at once
				slices.SortFunc(got, func(x, y runner.Question) int { return strings.Compare(x.Title, y.Title) })
				if !questionsEqual(got, tt.asked) {
					t.Errorf("asked\n %+v\nwant\n %+v", got, tt.asked)
				}
				if a.open() != 0 {
					t.Errorf("%d questions still open after Run returned", a.open())
				}
			}
			if got := r.Malformed(); got != tt.malforms {
				t.Errorf("malformed = %d, want %d", got, tt.malforms)
			}
			for _, l := range tt.logs {
				if !strings.Contains(logs.String(), l) {
					t.Errorf("log lacks %q:\n%s", l, logs)
				}
			}
		})
	}
}

func questionsEqual(a, b []runner.Question) bool {
	return slices.EqualFunc(a, b, func(x, y runner.Question) bool {
		return x.Title == y.Title && x.Detail == y.Detail && x.Tool == y.Tool && slices.Equal(x.Options, y.Options)
	})
}

func mustNotAsk(t *testing.T) func(context.Context, runner.Question) (runner.Answer, error) {
	return func(_ context.Context, q runner.Question) (runner.Answer, error) {
		t.Errorf("asked %+v", q)
		return runner.Answer{}, errors.New("must not ask")
	}
}

// blockUntilDone is an Approver whose questions stay open until the turn
// ends; asked receives each question.
func blockUntilDone(asked chan<- runner.Question) *approver {
	return &approver{fn: func(ctx context.Context, q runner.Question) (runner.Answer, error) {
		asked <- q
		<-ctx.Done()
		return runner.Answer{}, ctx.Err()
	}}
}

// TestPermissionAbort: a turn stopped while its question is open ends the
// usual way (SIGTERM to the agent, the context's error); nothing is written
// to the agent.
func TestPermissionAbort(t *testing.T) {
	r, logs, out := permissionAgent(t, bashRequest, "", true)
	asked := make(chan runner.Question, 1)
	a := blockUntilDone(asked)
	ctx, cancel := context.WithCancel(t.Context())
	ch := make(chan outcome, 1)
	go func() {
		res, err := r.Run(ctx, runner.Turn{RunID: "run-1", Message: "clean up\nplease", Approver: a}, newRecorder())
		ch <- outcome{res: res, err: err}
	}()
	<-asked
	cancel()
	o := await(t, ch)
	if !errors.Is(o.err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", o.err)
	}
	if o.res.Text != "" {
		t.Errorf("reply %q", o.res.Text)
	}
	if want, got := []string{"perms=1", messageLine}, readLinesOf(t, out); !slices.Equal(got, want) {
		t.Errorf("the agent read %q, want %q", got, want)
	}
	if a.open() != 0 {
		t.Errorf("%d questions still open after Run returned", a.open())
	}
	for _, l := range []string{"exec: stopping agent", "reason=aborted", "exec: permission request withdrawn"} {
		if !strings.Contains(logs.String(), l) {
			t.Errorf("log lacks %q:\n%s", l, logs)
		}
	}
}

// TestPermissionAgentAnswersWithoutWaiting: an agent that gives its final
// answer (and exits) with a question open ends the turn normally; the
// question is withdrawn, not left hanging.
func TestPermissionAgentAnswersWithoutWaiting(t *testing.T) {
	r, _, _ := permissionAgent(t, bashRequest, "0", true)
	a := blockUntilDone(make(chan runner.Question, 1))
	ch := make(chan outcome, 1)
	go func() {
		res, err := r.Run(t.Context(), runner.Turn{RunID: "run-1", Message: "x", Approver: a}, newRecorder())
		ch <- outcome{res: res, err: err}
	}()
	o := await(t, ch)
	if o.err != nil || o.res.Text != "denied" {
		t.Fatalf("Run = %q, %v", o.res.Text, o.err)
	}
	if a.open() != 0 {
		t.Errorf("%d questions still open after Run returned", a.open())
	}
}

// TestPermissionsOff: without agents.exec.permissions the message is on
// stdin as before and stdin ends; a request is logged, nobody is asked, and
// the agent reads the end of stdin.
func TestPermissionsOff(t *testing.T) {
	r, logs, out := permissionAgent(t, bashRequest, "", false)
	a := &approver{fn: mustNotAsk(t)}
	ch := make(chan outcome, 1)
	go func() {
		res, err := r.Run(t.Context(), runner.Turn{RunID: "run-1", Message: "clean up", Approver: a}, newRecorder())
		ch <- outcome{res: res, err: err}
	}()
	o := await(t, ch)
	if o.err != nil || o.res.Text != "no answer" {
		t.Fatalf("Run = %q, %v", o.res.Text, o.err)
	}
	if want, got := []string{"perms=", "clean up"}, readLinesOf(t, out); !slices.Equal(got, want) {
		t.Errorf("the agent read %q, want %q", got, want)
	}
	if !strings.Contains(logs.String(), "agents.exec.permissions is off") {
		t.Errorf("log lacks the warning:\n%s", logs)
	}
	if r.Malformed() != 0 {
		t.Errorf("malformed = %d", r.Malformed())
	}
}

func TestPermissionsNeedJSONL(t *testing.T) {
	_, err := exec.New(config.Exec{Command: "cat", Format: exec.FormatClaude, Permissions: true}, grace, nil)
	if err == nil || !strings.Contains(err.Error(), "claude-code-acp") {
		t.Fatalf("err = %v", err)
	}
}

// TestPermissionFloodBounded: an agent that writes 20,000 refused requests
// (a repeated id) without reading its answers costs the gateway no
// goroutine per request and a bounded log: the refusals are counted, the
// first are logged, one record sums them up. Measured while the agent
// still reads nothing (it waits for the FIFO the last question opens).
// Before, each refusal was a goroutine blocked on the full stdin pipe, and
// the stdout reader itself stalled behind them: the turn never ended.
func TestPermissionFloodBounded(t *testing.T) {
	const n = 20000
	dir := t.TempDir()
	fifo, out := filepath.Join(dir, "fifo"), filepath.Join(dir, "stdin")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	r, logs := newRunner(t, config.Exec{
		Command: script("permission_flood.sh"), Permissions: true,
		Env: map[string]string{"N": strconv.Itoa(n), "FIFO": fifo, "OUT": out},
	})
	before := runtime.NumGoroutine()
	a := &approver{fn: func(ctx context.Context, q runner.Question) (runner.Answer, error) {
		if q.Title == "Q" { // open until the turn ends: its repeats are refused
			<-ctx.Done()
			return runner.Answer{}, ctx.Err()
		}
		if grew := runtime.NumGoroutine() - before; grew > maxOpenGoroutines {
			t.Errorf("%d goroutines more while %d requests were refused, want at most %d", grew, n, maxOpenGoroutines)
		}
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0) // lets the agent read its answers
		if err != nil {
			return runner.Answer{}, err
		}
		f.Close()
		return choose("allow")(ctx, q)
	}}
	o := await(t, startTurn(t.Context(), r, runner.Turn{RunID: "run-1", Message: "go", Approver: a}, newRecorder()))
	if o.err != nil || o.res.Text != "done" {
		t.Fatalf("Run = %q, %v\n%s", o.res.Text, o.err, logs)
	}
	if got := r.Refused(); got != n {
		t.Errorf("Refused() = %d, want %d", got, n)
	}
	answers := readLinesOf(t, out)
	last := answers[len(answers)-1]
	if want := `{"type":"permission_response","id":"last","outcome":"selected","optionId":"allow","allowed":true}`; last != want {
		t.Errorf("the agent's last answer %q, want %q", last, want)
	}
	if want := `{"type":"permission_response","id":"q","outcome":"refused","allowed":false,"reason":"a request with this id is still open"}`; answers[0] != want {
		t.Errorf("the agent's first answer %q, want %q", answers[0], want)
	}
	log := logs.String()
	if got := strings.Count(log, `msg="exec: permission request refused"`); got > 50 {
		t.Errorf("%d refusals logged one by one, want at most 50", got)
	}
	if !strings.Contains(log, `msg="exec: permission requests refused" run_id=run-1 count=20000 unanswered=`) {
		t.Errorf("log lacks the summary:\n%s", cut(log, 4000))
	}
	if lines := strings.Count(log, "\n"); lines > 100 {
		t.Errorf("%d log records for one turn", lines)
	}
}

// maxOpenGoroutines bounds the goroutines one turn's permission requests
// may add: the open questions, the answer writer and the test's own.
const maxOpenGoroutines = 30

func cut(s string, n int) string { return s[:min(len(s), n)] }

// TestGatewayNoteOnStdin: with permissions on, a note of the gateway (a
// budget warning) reaches the agent as a {"type":"note"} line on its
// stdin, while it works (here: while its question is open); without
// permissions the runner takes no notes (stdin has ended).
func TestGatewayNoteOnStdin(t *testing.T) {
	r, _, out := permissionAgent(t, bashRequest, "1", true)
	if !r.TakesNotes() {
		t.Fatal("TakesNotes() = false with permissions on")
	}
	if off, _, _ := permissionAgent(t, bashRequest, "1", false); off.TakesNotes() {
		t.Error("TakesNotes() = true with permissions off")
	}
	asked := make(chan runner.Question, 1)
	a := blockUntilDone(asked)
	inbox := runner.NotesOnly()
	ch := make(chan outcome, 1)
	go func() {
		res, err := r.Run(t.Context(), runner.Turn{RunID: "run-1", Message: "clean up\nplease", Approver: a, Inbox: inbox}, newRecorder())
		ch <- outcome{res: res, err: err}
	}()
	<-asked
	inbox.Note("2 min left, wrap up")
	o := await(t, ch)
	if o.err != nil || o.res.Text != "denied" {
		t.Fatalf("Run = %q, %v", o.res.Text, o.err)
	}
	want := []string{"perms=1", messageLine, `{"type":"note","text":"2 min left, wrap up"}`}
	if got := readLinesOf(t, out); !slices.Equal(got, want) {
		t.Errorf("the agent read %q, want %q", got, want)
	}
}
