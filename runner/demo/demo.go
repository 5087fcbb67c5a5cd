// Package demo owns the embedded default runner of the turnguard gateway: a
// runner that does no real work but reports steps, streamed text, heartbeats
// and pauses on a schedule, so that timeouts, progress notices and aborts can
// be watched and tested without a model. It also owns the /steps script
// grammar (Parse).
//
// What a user types (web chat, TUI, Telegram):
//
//   - "/help", "/start" or an empty message: a reply explaining /steps; no steps.
//   - "/steps TOKEN TOKEN …": a scripted turn, see below.
//   - anything else: the built-in scenario — tools web_search, fetch_page and
//     shell, an llm call, tool memory_lookup (about a second each, see
//     WithScenarioStep), then a reply quoting the message.
//
// A /steps script is whitespace-separated tokens, run in order:
//
//	NAME:DUR            tool NAME ([a-z_]+, ≤ 64 chars) that completes after DUR
//	NAME:hang           tool that never completes; the turn ends only when cancelled
//	NAME:stuck          tool that never completes and ignores cancellation
//	                    for a while (it gives up StuckFor after the cancel)
//	NAME:DUR:hb=EVERY   tool that calls Heartbeat every EVERY while it runs
//	                    (also NAME:hang:hb=EVERY and NAME:stuck:hb=EVERY)
//	llm:DUR             LLM call (step kind "llm", name "demo") streaming
//	                    LLMText word by word over DUR; llm:hang, llm:stuck and
//	                    llm:DUR:hb=EVERY work as for tools (hang/stuck stream nothing)
//	pause:DUR           Pause("waiting for approval"), wait DUR, Resume();
//	                    pause:hang waits until cancelled
//	ask:NAME            ask the person whether tool NAME may run (an
//	                    approval, Allow / Deny); allowed, NAME runs (0s)
//	say:TEXT            stream TEXT (every "_" becomes a space; no way to
//	                    write a literal "_") as reply text at this point
//
// DUR is a Go duration (300ms, 2s, 1m30s) between 0 and 24h; EVERY is between
// 100ms and 24h. A script has at most 100 tokens. The whole script is parsed
// before anything runs; a bad one makes Run return a *runner.UserError naming
// the token, e.g.
//
//	bad /steps script: token 2 "shell:abc": "abc" is not a duration (use 300ms, 2s, hang or stuck)
//
// The reply is all the text streamed by Delta, in order: each llm step's text
// and each say text, separated by single spaces (several say tokens
// concatenate). A script without a say token ends by saying "Done.".
//
// Examples:
//
//	/steps web_search:300ms shell:hang
//	/steps web_search:300ms llm:2s say:Found_it
//	/steps say:Building... build:10m:hb=5s say:Built
//	/steps pause:30s say:Approved
//
// Steering (busy mode steer): the demo runner is a runner.Steerer. Between
// its steps (and before it returns) a turn shows each message steered into
// it as reply text, "📨 Noted: TEXT", so the reply mentions it.
//
// Budget warnings: a note of the gateway in the inbox ("N left, wrap up",
// runner.Inbox.TakeNotes) is taken at the same points. The turn shows it as
// reply text, "🧭 " and the note (WrapUpPrefix), and wraps up: it starts no
// further step of its script but still says its say texts, so it finishes
// before the gateway stops it.
//
// Cancellation: every wait also waits for the context, except a stuck
// step's: it ignores the cancellation for the runner's stuck time
// (WithStuckFor; default DefaultStuckFor, a bit beyond the default abort
// grace, so the gateway force-finalizes the turn first) and then gives up,
// or until Release. So a client cannot pile up stuck turns: each one's
// goroutine ends a bounded time after its abort. On cancellation Run returns
// the text streamed so far and ctx.Err(); the interrupted step is not
// reported complete and an interrupted pause is not resumed.
package demo

import (
	"context"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/timeout"
)

// DefaultStuckFor is how long a stuck step ignores its cancellation by
// default: the default abortGraceSeconds and 5 s more.
const DefaultStuckFor = timeout.DefaultAbortGraceSeconds*time.Second + 5*time.Second

// Runner is the demo runner. It is safe for concurrent use by many turns.
type Runner struct {
	scenarioStep time.Duration
	stuckFor     time.Duration
	release      chan struct{}
	releaseOnce  sync.Once
}

var _ runner.Steerer = (*Runner)(nil)

// Steers reports true: between its steps a turn takes the messages steered
// into it (busy mode steer) and shows each as reply text, "📨 Noted: TEXT",
// so the reply mentions it; messages steered during its last step are shown
// before it returns.
func (r *Runner) Steers() bool { return true }

// NotedPrefix starts the reply text that shows a steered message.
const NotedPrefix = "📨 Noted: "

// WrapUpPrefix starts the reply text that shows a note of the gateway (a
// budget warning) the turn took.
const WrapUpPrefix = "🧭 "

// Option configures a Runner.
type Option func(*Runner)

// WithScenarioStep sets how long each step of the built-in scenario takes
// (default 1s; negative is treated as 0).
func WithScenarioStep(d time.Duration) Option {
	return func(r *Runner) { r.scenarioStep = max(d, 0) }
}

// WithStuckFor sets how long a stuck step ignores its turn's cancellation
// before it gives up (default DefaultStuckFor; ≤ 0 is treated as the
// default). The gateway sets it a bit beyond its abort grace, so a stuck
// turn is still force-finalized.
func WithStuckFor(d time.Duration) Option {
	return func(r *Runner) {
		if d > 0 {
			r.stuckFor = d
		}
	}
}

// New returns a demo runner.
func New(opts ...Option) *Runner {
	r := &Runner{scenarioStep: time.Second, stuckFor: DefaultStuckFor, release: make(chan struct{})}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Release un-sticks stuck steps, now and later: from then on every stuck
// step of this Runner behaves like a hang step, returning as soon as its
// turn's context is cancelled (at once if it already is). It exists so tests
// can end turns that ignored cancellation early; otherwise a stuck step gives
// up StuckFor after its cancellation. Release is idempotent and safe for concurrent use.
func (r *Runner) Release() {
	r.releaseOnce.Do(func() { close(r.release) })
}

func (r *Runner) released() bool {
	select {
	case <-r.release:
		return true
	default:
		return false
	}
}

// HelpText is the reply to "/help".
const HelpText = `This is the turnguard demo runner: it pretends to work, so you can watch timeouts, progress notices and stops.

Any message runs a short built-in scenario (web_search, fetch_page, shell, llm, memory_lookup — about a second each).

Script a turn with /steps and tokens that run in order:
  NAME:DUR — tool NAME (a-z and _) that takes DUR (300ms, 2s, 1m30s)
  NAME:hang — tool that never finishes; only a stop or timeout ends the turn
  NAME:stuck — tool that never finishes and ignores stop requests (for a while)
  NAME:DUR:hb=EVERY — tool that sends a heartbeat every EVERY (also NAME:hang:hb=EVERY)
  llm:DUR — LLM call that streams text over DUR
  pause:DUR — wait DUR for a human (the no-progress clock stops); pause:hang waits until stopped
  ask:NAME — ask you whether tool NAME may run (Allow / Deny buttons); allowed, it runs
  say:TEXT — reply TEXT (_ for spaces); without say the reply is "Done."
At most 100 tokens; durations up to 24h; heartbeats at least 100ms apart.

Examples:
/steps web_search:300ms llm:2s say:Found_it
/steps web_search:300ms shell:hang
/steps say:Building... build:10m:hb=5s say:Built
/steps pause:30s say:Approved
/steps ask:deploy say:Finished`

// ScriptOf reports whether message is a /steps command and returns its
// script (the text after "/steps"). Leading and trailing whitespace is
// ignored; "/steps" must be followed by whitespace or the end.
func ScriptOf(message string) (script string, ok bool) {
	m := strings.TrimSpace(message)
	rest, ok := strings.CutPrefix(m, "/steps")
	if !ok {
		return "", false
	}
	if c, _ := utf8.DecodeRuneInString(rest); rest != "" && !unicode.IsSpace(c) {
		return "", false // "/stepsfoo" is not the command
	}
	return rest, true
}

// Run runs one turn: the help text, a /steps script or the built-in
// scenario (see the package doc). A bad script returns a *runner.UserError
// before any callback is made.
func (r *Runner) Run(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
	var steps []Step
	// A note of the gateway's (a resumed attempt's) comes before the
	// person's message: the reply shows it, as it shows a steered message.
	note, msg := messages.SplitGatewayNote(turn.Message)
	msg = strings.TrimSpace(msg)
	if script, ok := ScriptOf(msg); ok {
		var err error
		if steps, err = Parse(script); err != nil {
			return runner.Result{}, &runner.UserError{Message: err.Error()}
		}
		if !hasSay(steps) {
			steps = append(steps, Step{Kind: KindSay, Text: DefaultReply})
		}
	} else if msg == "" || msg == "/help" || msg == "/start" {
		steps = []Step{{Kind: KindSay, Text: HelpText}}
	} else {
		steps = r.scenario(msg)
	}
	t := &turnState{r: r, cb: cb, inbox: turn.Inbox, turn: turn}
	if note != "" {
		t.note([]string{note})
	}
	err := t.run(ctx, steps)
	if err == nil && t.inbox != nil {
		t.note(t.inbox.Close())
	}
	return runner.Result{Text: t.text.String()}, err
}

// ScenarioHint ends the built-in scenario's reply.
const ScenarioHint = "(demo runner — start a message with /steps to script a turn; see /help)"

// scenario is the built-in turn for an ordinary message.
func (r *Runner) scenario(msg string) []Step {
	d := r.scenarioStep
	quoted := clip(strings.Join(strings.Fields(msg), " "), 200)
	return []Step{
		{Kind: KindTool, Name: "web_search", Dur: d},
		{Kind: KindTool, Name: "fetch_page", Dur: d},
		{Kind: KindTool, Name: "shell", Dur: d},
		{Kind: KindLLM, Name: LLMName, Dur: d, Text: `You said: "` + quoted + `".`},
		{Kind: KindTool, Name: "memory_lookup", Dur: d},
		{Kind: KindSay, Text: ScenarioHint},
	}
}

func hasSay(steps []Step) bool {
	for _, s := range steps {
		if s.Kind == KindSay {
			return true
		}
	}
	return false
}

// maxChunks caps the number of Delta calls of one llm step.
const maxChunks = 16

// turnState is the state of one Run: the text streamed so far.
type turnState struct {
	r     *Runner
	cb    runner.Callbacks
	inbox *runner.Inbox // nil: nothing is steered into this turn
	turn  runner.Turn   // for its Approver
	text  strings.Builder
	// wrapUp: the gateway warned that time runs out; only say steps run.
	wrapUp bool
}

// takeNotes shows the gateway's notes as reply text; any note means wrap
// up.
func (t *turnState) takeNotes() {
	for _, n := range t.inbox.TakeNotes() {
		t.say(WrapUpPrefix + n)
		t.wrapUp = true
	}
}

// note shows steered messages as reply text.
func (t *turnState) note(msgs []string) {
	for _, m := range msgs {
		t.say(NotedPrefix + clip(strings.Join(strings.Fields(m), " "), 200))
	}
}

func (t *turnState) run(ctx context.Context, steps []Step) error {
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		if t.inbox != nil {
			t.note(t.inbox.Take())
			t.takeNotes()
		}
		if t.wrapUp && s.Kind != KindSay {
			continue
		}
		var err error
		switch s.Kind {
		case KindSay:
			t.say(s.Text)
		case KindAsk:
			err = t.ask(ctx, s.Name)
		case KindPause:
			t.cb.Pause("waiting for approval")
			err = t.timed(ctx, s, nil)
			if err == nil {
				t.cb.Resume()
			}
		default:
			var chunks []string
			if s.Kind == KindLLM && !s.Hang && !s.Stuck {
				chunks = t.chunks(s.Text)
			}
			t.cb.StepStarted(s.Kind, s.Name)
			err = t.timed(ctx, s, chunks)
			if err == nil {
				t.cb.StepCompleted(s.Kind, s.Name)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ask asks whether tool may run (an approval), then runs it as an instant
// step and says so, or says it was not allowed.
func (t *turnState) ask(ctx context.Context, tool string) error {
	ans, err := t.turn.Ask(ctx, runner.Question{Title: "Run " + tool, Tool: tool})
	if err != nil {
		return err
	}
	if !ans.Allowed() {
		if ans.Outcome == runner.TimedOut {
			t.say(tool + " was not run: no answer in time.")
		} else {
			t.say(tool + " was not run: denied.")
		}
		return nil
	}
	t.cb.StepStarted(KindTool, tool)
	t.cb.StepCompleted(KindTool, tool)
	t.say(tool + " ran (allowed).")
	return nil
}

// say streams text as one piece of the reply.
func (t *turnState) say(text string) {
	if t.text.Len() > 0 {
		text = " " + text
	}
	t.emit(text)
}

func (t *turnState) emit(chunk string) {
	t.text.WriteString(chunk)
	t.cb.Delta(chunk)
}

// chunks splits text into at most maxChunks word groups whose concatenation,
// appended to the reply so far, separates it from earlier text by a space.
func (t *turnState) chunks(text string) []string {
	words := strings.Fields(text)
	n := min(len(words), maxChunks)
	out := make([]string, 0, n)
	for j := range n {
		c := strings.Join(words[j*len(words)/n:(j+1)*len(words)/n], " ")
		if j > 0 || t.text.Len() > 0 {
			c = " " + c
		}
		out = append(out, c)
	}
	return out
}

// timed runs the clock of a step that started now: chunk j of chunks is
// streamed at Dur*(j+1)/len(chunks); a heartbeat is sent every s.Heartbeat
// strictly before the end; the step ends after s.Dur (never for hang and
// stuck). It returns ctx.Err() when ctx is cancelled first (stuck steps
// ignore the cancellation for the runner's stuckFor, or until the Runner is
// released).
func (t *turnState) timed(ctx context.Context, s Step, chunks []string) error {
	start := time.Now()
	endless := s.Hang || s.Stuck
	chunkAt := func(j int) time.Duration {
		return time.Duration(int64(s.Dur) * int64(j+1) / int64(len(chunks)))
	}
	next := 0         // next chunk
	hb := s.Heartbeat // next heartbeat offset
	hbLive := func() bool { return s.Heartbeat > 0 && (endless || hb < s.Dur) }
	var (
		timer      *time.Timer
		cancelSeen = time.Duration(-1) // when a stuck step saw its cancellation
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		// Cancellation wins over events due at the same instant (a step is
		// never completed after its context was cancelled), except that a
		// stuck step ignores it until Release.
		now := time.Since(start)
		ignoreCtx := s.Stuck && !t.r.released()
		if err := ctx.Err(); err != nil {
			if ignoreCtx && cancelSeen < 0 {
				cancelSeen = now
			}
			if !ignoreCtx || now-cancelSeen >= t.r.stuckFor {
				return err
			}
		}
		for next < len(chunks) && chunkAt(next) <= now {
			t.emit(chunks[next])
			next++
		}
		if hbLive() && hb <= now {
			t.cb.Heartbeat()
			hb = (now/s.Heartbeat + 1) * s.Heartbeat // skip beats missed by a late wake-up
		}
		if !endless && now >= s.Dur && next == len(chunks) {
			return nil
		}

		wake := time.Duration(-1) // -1: no timer
		if !endless {
			wake = s.Dur
		}
		if next < len(chunks) {
			wake = chunkAt(next)
		}
		if hbLive() && (wake < 0 || hb < wake) {
			wake = hb
		}
		if ignoreCtx && cancelSeen >= 0 && (wake < 0 || cancelSeen+t.r.stuckFor < wake) {
			wake = cancelSeen + t.r.stuckFor // give up
		}
		var timerC <-chan time.Time
		if wake >= 0 {
			d := time.Until(start.Add(wake))
			if timer == nil {
				timer = time.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			timerC = timer.C
		}
		done := ctx.Done()
		var released <-chan struct{}
		if ignoreCtx {
			released = t.r.release
			if cancelSeen >= 0 {
				done = nil // already seen; the give-up time is on the timer
			}
		}
		select {
		case <-timerC:
		case <-done: // a stuck step looks again: it notes the time
			if !ignoreCtx {
				return ctx.Err()
			}
		case <-released: // look again: from now on ctx counts
		}
	}
}
