package demo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/runner"

	"github.com/turnguard/turnguard/internal/faketime"
)

const ms = time.Millisecond

// call is one callback as a client would see it: when (fake time since the
// turn started) and what.
type call struct {
	At time.Duration
	Ev string
}

func (c call) String() string { return fmt.Sprintf("%v %s", c.At, c.Ev) }

// recorder is runner.Callbacks that records every call with time.Now().
type recorder struct {
	t0    time.Time
	mu    sync.Mutex
	calls []call
}

func newRecorder() *recorder { return &recorder{t0: time.Now()} }

func (r *recorder) add(ev string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call{time.Since(r.t0), ev})
}

func (r *recorder) StepStarted(kind, name string)   { r.add("start " + kind + " " + name) }
func (r *recorder) StepCompleted(kind, name string) { r.add("done " + kind + " " + name) }
func (r *recorder) Delta(text string)               { r.add("delta " + strconv.Quote(text)) }
func (r *recorder) Heartbeat()                      { r.add("heartbeat") }
func (r *recorder) Pause(reason string)             { r.add("pause " + reason) }
func (r *recorder) Resume()                         { r.add("resume") }

func (r *recorder) snapshot() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]call(nil), r.calls...)
}

// deltas concatenates the recorded Delta texts.
func (r *recorder) deltas() string {
	var b strings.Builder
	for _, c := range r.snapshot() {
		if q, ok := strings.CutPrefix(c.Ev, "delta "); ok {
			s, err := strconv.Unquote(q)
			if err != nil {
				panic(err)
			}
			b.WriteString(s)
		}
	}
	return b.String()
}

func checkCalls(t *testing.T, got, want []call) {
	t.Helper()
	if len(got) == len(want) {
		same := true
		for i := range got {
			same = same && got[i] == want[i]
		}
		if same {
			return
		}
	}
	var b strings.Builder
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i].String()
		}
		if i < len(want) {
			w = want[i].String()
		}
		mark := "  "
		if g != w {
			mark = "!!"
		}
		fmt.Fprintf(&b, "%s got %-45s want %s\n", mark, g, w)
	}
	t.Errorf("callbacks differ:\n%s", b.String())
}

// outcome is what one Run produced.
type outcome struct {
	res runner.Result
	err error
	at  time.Duration // fake time at which Run returned
}

// start runs msg on r in a goroutine of the current bubble.
func start(ctx context.Context, r *Runner, msg string, rec *recorder) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		res, err := r.Run(ctx, runner.Turn{RunID: "r1", Message: msg}, rec)
		ch <- outcome{res, err, time.Since(rec.t0)}
	}()
	return ch
}

// checkText checks that the streamed deltas are exactly the returned text.
func checkText(t *testing.T, rec *recorder, o outcome, want string) {
	t.Helper()
	if o.res.Text != want {
		t.Errorf("Result.Text = %q, want %q", o.res.Text, want)
	}
	if d := rec.deltas(); d != o.res.Text {
		t.Errorf("deltas concatenate to %q, Result.Text is %q", d, o.res.Text)
	}
}

func TestScriptSequence(t *testing.T) {
	tests := []struct {
		name  string
		msg   string
		want  []call
		reply string
	}{
		{
			name: "tool, streaming llm, tool, say",
			msg:  "/steps web_search:300ms llm:1s shell:2s say:All_good",
			want: []call{
				{0, "start tool web_search"},
				{300 * ms, "done tool web_search"},
				{300 * ms, "start llm demo"},
				{500 * ms, `delta "Thinking"`},
				{700 * ms, `delta " about"`},
				{900 * ms, `delta " the"`},
				{1100 * ms, `delta " next"`},
				{1300 * ms, `delta " step."`},
				{1300 * ms, "done llm demo"},
				{1300 * ms, "start tool shell"},
				{3300 * ms, "done tool shell"},
				{3300 * ms, `delta " All good"`},
			},
			reply: "Thinking about the next step. All good",
		},
		{
			name: "heartbeats while a tool runs",
			msg:  "/steps shell:1s:hb=300ms",
			want: []call{
				{0, "start tool shell"},
				{300 * ms, "heartbeat"},
				{600 * ms, "heartbeat"},
				{900 * ms, "heartbeat"},
				{1000 * ms, "done tool shell"},
				{1000 * ms, `delta "Done."`},
			},
			reply: "Done.",
		},
		{
			name: "no heartbeat at the instant the step completes",
			msg:  "/steps shell:1s:hb=250ms",
			want: []call{
				{0, "start tool shell"},
				{250 * ms, "heartbeat"},
				{500 * ms, "heartbeat"},
				{750 * ms, "heartbeat"},
				{1000 * ms, "done tool shell"},
				{1000 * ms, `delta "Done."`},
			},
			reply: "Done.",
		},
		{
			name: "heartbeat longer than the step never fires",
			msg:  "/steps build:1s:hb=5s",
			want: []call{
				{0, "start tool build"},
				{1000 * ms, "done tool build"},
				{1000 * ms, `delta "Done."`},
			},
			reply: "Done.",
		},
		{
			name: "llm with heartbeat: chunk before heartbeat at the same instant",
			msg:  "/steps llm:1s:hb=400ms say:ok",
			want: []call{
				{0, "start llm demo"},
				{200 * ms, `delta "Thinking"`},
				{400 * ms, `delta " about"`},
				{400 * ms, "heartbeat"},
				{600 * ms, `delta " the"`},
				{800 * ms, `delta " next"`},
				{800 * ms, "heartbeat"},
				{1000 * ms, `delta " step."`},
				{1000 * ms, "done llm demo"},
				{1000 * ms, `delta " ok"`},
			},
			reply: "Thinking about the next step. ok",
		},
		{
			name: "llm:0s streams everything at once",
			msg:  "/steps llm:0s",
			want: []call{
				{0, "start llm demo"},
				{0, `delta "Thinking"`},
				{0, `delta " about"`},
				{0, `delta " the"`},
				{0, `delta " next"`},
				{0, `delta " step."`},
				{0, "done llm demo"},
				{0, `delta " Done."`},
			},
			reply: "Thinking about the next step. Done.",
		},
		{
			name: "pause then say",
			msg:  "/steps pause:5s say:Approved",
			want: []call{
				{0, "pause waiting for approval"},
				{5 * time.Second, "resume"},
				{5 * time.Second, `delta "Approved"`},
			},
			reply: "Approved",
		},
		{
			name: "several says stream where they stand and concatenate with spaces",
			msg:  "/steps say:Looking... lookup:1m30s say:Found_it: say:42",
			want: []call{
				{0, `delta "Looking..."`},
				{0, "start tool lookup"},
				{90 * time.Second, "done tool lookup"},
				{90 * time.Second, `delta " Found it:"`},
				{90 * time.Second, `delta " 42"`},
			},
			reply: "Looking... Found it: 42",
		},
		{
			name: "zero duration, whitespace around the command",
			msg:  "  /steps\tshell:0s \n",
			want: []call{
				{0, "start tool shell"},
				{0, "done tool shell"},
				{0, `delta "Done."`},
			},
			reply: "Done.",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := newRecorder()
				o := <-start(t.Context(), New(), tt.msg, rec)
				if o.err != nil {
					t.Fatalf("Run: %v", o.err)
				}
				checkCalls(t, rec.snapshot(), tt.want)
				checkText(t, rec, o, tt.reply)
				if last := tt.want[len(tt.want)-1].At; o.at != last {
					t.Errorf("Run returned at %v, want %v", o.at, last)
				}
			})
		})
	}
}

func TestCancel(t *testing.T) {
	tests := []struct {
		name     string
		msg      string
		cancelAt time.Duration
		want     []call // everything until Run returns
		partial  string
	}{
		{
			name:     "hang returns at once with partial text",
			msg:      "/steps say:Looking shell:hang say:never",
			cancelAt: time.Hour,
			want: []call{
				{0, `delta "Looking"`},
				{0, "start tool shell"},
			},
			partial: "Looking",
		},
		{
			name:     "hang with heartbeats",
			msg:      "/steps shell:hang:hb=1s",
			cancelAt: 3500 * ms,
			want: []call{
				{0, "start tool shell"},
				{1 * time.Second, "heartbeat"},
				{2 * time.Second, "heartbeat"},
				{3 * time.Second, "heartbeat"},
			},
		},
		{
			name:     "timed tool interrupted is not completed",
			msg:      "/steps a:1s b:10s",
			cancelAt: 5 * time.Second,
			want: []call{
				{0, "start tool a"},
				{1 * time.Second, "done tool a"},
				{1 * time.Second, "start tool b"},
			},
		},
		{
			name:     "llm interrupted mid-stream keeps the chunks so far",
			msg:      "/steps say:Hi llm:1s",
			cancelAt: 500 * ms,
			want: []call{
				{0, `delta "Hi"`},
				{0, "start llm demo"},
				{200 * ms, `delta " Thinking"`},
				{400 * ms, `delta " about"`},
			},
			partial: "Hi Thinking about",
		},
		{
			name:     "llm:hang streams nothing",
			msg:      "/steps llm:hang",
			cancelAt: time.Minute,
			want:     []call{{0, "start llm demo"}},
		},
		{
			name:     "interrupted pause is not resumed",
			msg:      "/steps pause:hang say:Approved",
			cancelAt: 10 * time.Minute,
			want:     []call{{0, "pause waiting for approval"}},
		},
		{
			name:     "built-in scenario",
			msg:      "hello",
			cancelAt: 1500 * ms,
			want: []call{
				{0, "start tool web_search"},
				{1 * time.Second, "done tool web_search"},
				{1 * time.Second, "start tool fetch_page"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				rec := newRecorder()
				done := start(ctx, New(), tt.msg, rec)
				faketime.Advance(tt.cancelAt)
				synctest.Wait()
				select {
				case o := <-done:
					t.Fatalf("Run returned before cancel: %+v", o)
				default:
				}
				cancel()
				synctest.Wait()
				var o outcome
				select {
				case o = <-done:
				default:
					t.Fatal("Run did not return after cancel")
				}
				if !errors.Is(o.err, context.Canceled) {
					t.Errorf("err = %v, want context.Canceled", o.err)
				}
				if o.at != tt.cancelAt {
					t.Errorf("Run returned at %v, want %v (the cancel)", o.at, tt.cancelAt)
				}
				checkCalls(t, rec.snapshot(), tt.want)
				checkText(t, rec, o, tt.partial)
			})
		})
	}
}

func TestCancelledBeforeRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		rec := newRecorder()
		o := <-start(ctx, New(), "/steps shell:1s", rec)
		if !errors.Is(o.err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", o.err)
		}
		checkCalls(t, rec.snapshot(), nil)
		checkText(t, rec, o, "")
	})
}

func TestDeadlineError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		rec := newRecorder()
		o := <-start(ctx, New(), "/steps shell:hang", rec)
		if !errors.Is(o.err, context.DeadlineExceeded) || o.at != 2*time.Second {
			t.Errorf("Run = %v at %v, want context.DeadlineExceeded at 2s", o.err, o.at)
		}
	})
}

func TestStuckIgnoresCancelUntilRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		r := New()
		rec := newRecorder()
		done := start(ctx, r, "/steps say:partial shell:stuck:hb=1s say:never", rec)

		faketime.Advance(1500 * ms)
		cancel()
		faketime.Advance(8500 * ms) // to 10s
		synctest.Wait()
		select {
		case o := <-done:
			t.Fatalf("stuck step returned after cancel: %+v", o)
		default:
		}

		r.Release()
		synctest.Wait()
		var o outcome
		select {
		case o = <-done:
		default:
			t.Fatal("Run did not return after Release")
		}
		if !errors.Is(o.err, context.Canceled) || o.at != 10*time.Second {
			t.Errorf("Run = %v at %v, want context.Canceled at 10s", o.err, o.at)
		}
		want := []call{
			{0, `delta "partial"`},
			{0, "start tool shell"},
		}
		for s := 1; s <= 10; s++ { // a stuck step keeps beating after the cancel
			want = append(want, call{time.Duration(s) * time.Second, "heartbeat"})
		}
		checkCalls(t, rec.snapshot(), want)
		checkText(t, rec, o, "partial")
	})
}

// TestStuckGivesUpAfterBound: a stuck step ignores its cancellation only for
// the runner's stuck time, then its turn's goroutine ends (synctest.Test
// fails on a goroutine left blocked in the bubble), so clients cannot pile
// up stuck turns.
func TestStuckGivesUpAfterBound(t *testing.T) {
	tests := []struct {
		name  string
		opts  []Option
		bound time.Duration
	}{
		{"default: beyond the default abort grace", nil, 15 * time.Second},
		{"WithStuckFor", []Option{WithStuckFor(time.Minute)}, time.Minute},
		{"WithStuckFor(0) keeps the default", []Option{WithStuckFor(0)}, DefaultStuckFor},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				rec := newRecorder()
				done := start(ctx, New(tt.opts...), "/steps say:partial shell:stuck say:never", rec)
				faketime.Advance(2 * time.Second)
				cancel()
				faketime.Advance(tt.bound - time.Millisecond)
				synctest.Wait()
				select {
				case o := <-done:
					t.Fatalf("stuck step gave up %v after the cancel, before %v: %+v", o.at-2*time.Second, tt.bound, o)
				default:
				}
				faketime.Advance(time.Millisecond)
				synctest.Wait()
				select {
				case o := <-done:
					if !errors.Is(o.err, context.Canceled) || o.at != 2*time.Second+tt.bound {
						t.Errorf("Run = %v at %v, want context.Canceled at %v", o.err, o.at, 2*time.Second+tt.bound)
					}
					checkText(t, rec, o, "partial")
				default:
					t.Fatalf("stuck step still running %v after the cancel", tt.bound)
				}
			})
		})
	}
}

func TestReleasedStuckBehavesLikeHang(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		r := New()
		rec := newRecorder()
		done := start(ctx, r, "/steps shell:stuck", rec)
		faketime.Advance(time.Second)
		r.Release()
		r.Release() // idempotent
		faketime.Advance(time.Hour)
		synctest.Wait()
		select {
		case o := <-done:
			t.Fatalf("released stuck step returned without cancel: %+v", o)
		default:
		}
		cancel()
		o := <-done
		if !errors.Is(o.err, context.Canceled) || o.at != time.Hour+time.Second {
			t.Errorf("Run = %v at %v, want context.Canceled at 1h0m1s", o.err, o.at)
		}

		// A stuck step started after Release returns on cancel too.
		ctx, cancel = context.WithCancel(t.Context())
		rec = newRecorder()
		done = start(ctx, r, "/steps shell:stuck", rec)
		faketime.Advance(time.Minute)
		cancel()
		if o := <-done; !errors.Is(o.err, context.Canceled) || o.at != time.Minute {
			t.Errorf("Run = %v at %v, want context.Canceled at 1m", o.err, o.at)
		}
	})
}

func TestScenario(t *testing.T) {
	hint := ScenarioHint
	tests := []struct {
		name  string
		opts  []Option
		msg   string
		want  []call
		reply string
	}{
		{
			name: "default durations",
			msg:  "  hello \n there ",
			want: []call{
				{0, "start tool web_search"},
				{1 * time.Second, "done tool web_search"},
				{1 * time.Second, "start tool fetch_page"},
				{2 * time.Second, "done tool fetch_page"},
				{2 * time.Second, "start tool shell"},
				{3 * time.Second, "done tool shell"},
				{3 * time.Second, "start llm demo"},
				{3250 * ms, `delta "You"`},
				{3500 * ms, `delta " said:"`},
				{3750 * ms, `delta " \"hello"`},
				{4000 * ms, `delta " there\"."`},
				{4 * time.Second, "done llm demo"},
				{4 * time.Second, "start tool memory_lookup"},
				{5 * time.Second, "done tool memory_lookup"},
				{5 * time.Second, "delta " + strconv.Quote(" "+hint)},
			},
			reply: `You said: "hello there". ` + hint,
		},
		{
			name: "WithScenarioStep",
			opts: []Option{WithScenarioStep(300 * ms)},
			msg:  "hi",
			want: []call{
				{0, "start tool web_search"},
				{300 * ms, "done tool web_search"},
				{300 * ms, "start tool fetch_page"},
				{600 * ms, "done tool fetch_page"},
				{600 * ms, "start tool shell"},
				{900 * ms, "done tool shell"},
				{900 * ms, "start llm demo"},
				{1000 * ms, `delta "You"`},
				{1100 * ms, `delta " said:"`},
				{1200 * ms, `delta " \"hi\"."`},
				{1200 * ms, "done llm demo"},
				{1200 * ms, "start tool memory_lookup"},
				{1500 * ms, "done tool memory_lookup"},
				{1500 * ms, "delta " + strconv.Quote(" "+hint)},
			},
			reply: `You said: "hi". ` + hint,
		},
		{
			name: "not a /steps command",
			opts: []Option{WithScenarioStep(0)},
			msg:  "/stepsweb_search:1s",
			want: []call{
				{0, "start tool web_search"},
				{0, "done tool web_search"},
				{0, "start tool fetch_page"},
				{0, "done tool fetch_page"},
				{0, "start tool shell"},
				{0, "done tool shell"},
				{0, "start llm demo"},
				{0, `delta "You"`},
				{0, `delta " said:"`},
				{0, `delta " \"/stepsweb_search:1s\"."`},
				{0, "done llm demo"},
				{0, "start tool memory_lookup"},
				{0, "done tool memory_lookup"},
				{0, "delta " + strconv.Quote(" "+hint)},
			},
			reply: `You said: "/stepsweb_search:1s". ` + hint,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := newRecorder()
				o := <-start(t.Context(), New(tt.opts...), tt.msg, rec)
				if o.err != nil {
					t.Fatalf("Run: %v", o.err)
				}
				checkCalls(t, rec.snapshot(), tt.want)
				checkText(t, rec, o, tt.reply)
			})
		})
	}
}

func TestScenarioLongMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		msg := strings.Repeat("word ", 1000)
		rec := newRecorder()
		o := <-start(t.Context(), New(), msg, rec)
		if o.err != nil {
			t.Fatalf("Run: %v", o.err)
		}
		quoted := clip(strings.TrimSpace(msg), 200)
		checkText(t, rec, o, `You said: "`+quoted+`". `+ScenarioHint)
		if !strings.HasSuffix(quoted, "…") {
			t.Errorf("long message not clipped: %q", quoted)
		}
		n := 0
		for _, c := range rec.snapshot() {
			if strings.HasPrefix(c.Ev, "delta ") {
				n++
			}
		}
		if n > maxChunks+1 {
			t.Errorf("%d deltas, want at most %d llm chunks + the hint", n, maxChunks)
		}
		if o.at != 5*time.Second {
			t.Errorf("scenario took %v, want 5s", o.at)
		}
	})
}

func TestHelp(t *testing.T) {
	for _, msg := range []string{"/help", "", "   ", " /help\n", "/start"} {
		t.Run(strconv.Quote(msg), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := newRecorder()
				o := <-start(t.Context(), New(), msg, rec)
				if o.err != nil {
					t.Fatalf("Run: %v", o.err)
				}
				checkCalls(t, rec.snapshot(), []call{{0, "delta " + strconv.Quote(HelpText)}})
				checkText(t, rec, o, HelpText)
			})
		})
	}
}

// Every example the help text shows is a valid script.
func TestHelpExamplesParse(t *testing.T) {
	n := 0
	for line := range strings.Lines(HelpText) {
		script, ok := ScriptOf(line)
		if !ok {
			continue
		}
		n++
		if _, err := Parse(script); err != nil {
			t.Errorf("help example %q: %v", strings.TrimSpace(line), err)
		}
	}
	if n < 3 {
		t.Errorf("help shows %d /steps examples, want at least 3", n)
	}
}

func TestBadScriptIsUserError(t *testing.T) {
	tests := []struct {
		msg  string
		want string // the whole user-facing message
	}{
		{"/steps web_search:1s shell:abc", `bad /steps script: token 2 "shell:abc": "abc" is not a duration (use 300ms, 2s, hang or stuck)`},
		{"/steps", `bad /steps script: the script is empty — try /steps web_search:1s llm:2s say:Found_it (see /help)`},
		{"/steps shell:1s:hb=10ms", `bad /steps script: token 1 "shell:1s:hb=10ms": heartbeat interval "10ms" is shorter than 100ms`},
	}
	for _, tt := range tests {
		t.Run(tt.msg, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := newRecorder()
				o := <-start(t.Context(), New(), tt.msg, rec)
				u, ok := runner.AsUserError(o.err)
				if !ok {
					t.Fatalf("err = %#v, want *runner.UserError", o.err)
				}
				if u.Message != tt.want {
					t.Errorf("message\n got %s\nwant %s", u.Message, tt.want)
				}
				// Parsed before running: nothing was reported.
				checkCalls(t, rec.snapshot(), nil)
				checkText(t, rec, o, "")
			})
		})
	}
}

// Many turns share one Runner.
func TestConcurrentTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New()
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				rec := newRecorder()
				msg := fmt.Sprintf("/steps t:%dms:hb=100ms llm:1s say:n%d", 100*i, i)
				res, err := r.Run(t.Context(), runner.Turn{Message: msg}, rec)
				want := fmt.Sprintf("Thinking about the next step. n%d", i)
				if err != nil || res.Text != want || rec.deltas() != want {
					t.Errorf("%s: %q, %v", msg, res.Text, err)
				}
				if el := time.Since(rec.t0); el != time.Duration(100*i)*ms+time.Second {
					t.Errorf("%s took %v", msg, el)
				}
			})
		}
		wg.Wait()
	})
}

func TestScriptOf(t *testing.T) {
	tests := []struct {
		msg    string
		script string
		ok     bool
	}{
		{"/steps a:1s", " a:1s", true},
		{"  /steps\ta:1s b:2s  ", "\ta:1s b:2s", true},
		{"/steps", "", true},
		{"/steps\u00a0a:1s", "\u00a0a:1s", true},
		{"/stepsa:1s", "", false},
		{"/Steps a:1s", "", false},
		{"hello /steps a:1s", "", false},
		{"/help", "", false},
	}
	for _, tt := range tests {
		script, ok := ScriptOf(tt.msg)
		if script != tt.script || ok != tt.ok {
			t.Errorf("ScriptOf(%q) = %q, %v; want %q, %v", tt.msg, script, ok, tt.script, tt.ok)
		}
	}
}

// answerer is an Approver that gives a fixed answer and records the
// questions it was asked.
type answerer struct {
	ans   runner.Answer
	asked []runner.Question
}

func (a *answerer) Ask(ctx context.Context, q runner.Question) (runner.Answer, error) {
	a.asked = append(a.asked, q)
	return a.ans, nil
}

// TestAsk: ask:NAME asks whether NAME may run; the reply says what came of
// it, and the tool runs as a step only when allowed.
func TestAsk(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ans   runner.Answer
		reply string
		steps int
	}{
		{"allowed", runner.Answer{Outcome: runner.Selected, OptionID: "allow", Kind: runner.AllowOnce}, "deploy ran (allowed). Finished", 1},
		{"denied", runner.Answer{Outcome: runner.Selected, OptionID: "deny", Kind: runner.RejectOnce}, "deploy was not run: denied. Finished", 0},
		{"timed out", runner.Answer{Outcome: runner.TimedOut, OptionID: "deny", Kind: runner.RejectOnce}, "deploy was not run: no answer in time. Finished", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ap := &answerer{ans: tc.ans}
			var steps int
			cb := stepCounter{n: &steps}
			res, err := New().Run(context.Background(), runner.Turn{Message: "/steps ask:deploy say:Finished", Approver: ap}, cb)
			if err != nil || res.Text != tc.reply {
				t.Fatalf("reply %q, %v; want %q", res.Text, err, tc.reply)
			}
			if len(ap.asked) != 1 || ap.asked[0].Title != "Run deploy" || ap.asked[0].Tool != "deploy" {
				t.Fatalf("asked %+v", ap.asked)
			}
			if steps != tc.steps {
				t.Fatalf("%d tool steps, want %d", steps, tc.steps)
			}
		})
	}
	if _, err := Parse("ask:"); err == nil || !strings.Contains(err.Error(), "ask needs a tool name") {
		t.Fatalf("ask without a name: %v", err)
	}
}

type stepCounter struct {
	runner.Nop
	n *int
}

func (s stepCounter) StepCompleted(kind, name string) { *s.n++ }
