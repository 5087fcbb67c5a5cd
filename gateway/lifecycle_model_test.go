// The harness the lifecycle model tests share — TestLifecycleModel on one
// engine (lifecycle_test.go) and TestLifecycleModelCluster on the
// in-process cluster (lifecycle_cluster_test.go): the puppet runner the
// model drives and the runner actions drawn for it, time passing, the
// configuration whose deadlines the drawn waits reach, the invariant that a
// run's terminal event is its one and last, and the loop that draws steps
// and checks the invariants after each. Its names are exported for the
// cluster model, which is in package gateway_test (cluster/inproc imports
// the engine).

package gateway

import (
	"context"
	"fmt"
	"sync"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
)

// ModelPuppet is a runner a model test drives: each turn's runner goroutine
// carries out the commands the test sends it, in order, from its own
// goroutine (as a real runner calls its callbacks).
type ModelPuppet struct {
	mu    sync.Mutex
	turns map[string]*ModelTurn // runner calls that have not returned, by run id
	heard []runner.Turn         // every turn's input, in start order
	quit  chan struct{}         // closed at the end: every runner returns
	// steers: the puppet is a runner.Steerer that steers (busy mode steer
	// puts messages in its turns' inboxes; action "take" takes them).
	steers bool
	taken  map[string][]string // steered texts each turn took, by run id
}

// NewModelPuppet returns a puppet; steers: it is a runner.Steerer that
// steers.
func NewModelPuppet(steers bool) *ModelPuppet {
	return &ModelPuppet{turns: map[string]*ModelTurn{}, quit: make(chan struct{}), taken: map[string][]string{}, steers: steers}
}

func (p *ModelPuppet) Steers() bool { return p.steers }

// ModelTurn is one runner call of a ModelPuppet.
type ModelTurn struct {
	ctx    context.Context
	turn   runner.Turn
	cmds   chan func(runner.Callbacks)
	ret    chan error
	ignore bool // ignores its context's cancellation
	// The model of its liveness clock's reasons.
	paused bool
	asking int
}

func (p *ModelPuppet) Run(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
	pt := &ModelTurn{ctx: ctx, turn: turn, cmds: make(chan func(runner.Callbacks), 16), ret: make(chan error, 1)}
	p.mu.Lock()
	p.turns[turn.RunID] = pt
	p.heard = append(p.heard, turn)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.turns, turn.RunID)
		p.mu.Unlock()
	}()
	done := ctx.Done()
	for {
		select {
		case f := <-pt.cmds:
			f(cb)
		case err := <-pt.ret:
			return runner.Result{Text: "reply to " + turn.Message}, err
		case <-done:
			p.mu.Lock()
			ignore := pt.ignore
			p.mu.Unlock()
			if !ignore {
				return runner.Result{}, ctx.Err()
			}
			done = nil // goes on until told to return
		case <-p.quit:
			return runner.Result{}, context.Canceled
		}
	}
}

// Active returns session key's active run on e and the puppet turn running
// it: nil when its runner returned; "", nil when the session is free.
func (p *ModelPuppet) Active(e *Engine, key string) (string, *ModelTurn) {
	run, ok := e.Active(key)
	if !ok {
		return "", nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return run.ID, p.turns[run.ID]
}

// Running is how many runner calls have not returned.
func (p *ModelPuppet) Running() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.turns)
}

// ReturnAll tells every running turn to return and reports whether any
// ran.
func (p *ModelPuppet) ReturnAll() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pt := range p.turns {
		select {
		case pt.ret <- nil:
		default:
		}
	}
	return len(p.turns) > 0
}

// Quit has every runner return: the end of an interleaving.
func (p *ModelPuppet) Quit() { close(p.quit) }

// Do has pt's runner do a drawn runner action: "delta", "stepStart",
// "stepDone" (through its callbacks, from its goroutine), "return" (ok),
// "fail" (a user error) or "ignoreCancel" (it goes on after its context is
// cancelled, until told to return).
func (p *ModelPuppet) Do(pt *ModelTurn, action string) {
	switch action {
	case "delta":
		pt.cmds <- func(cb runner.Callbacks) { cb.Delta("x") }
	case "stepStart":
		pt.cmds <- func(cb runner.Callbacks) { cb.StepStarted(event.StepTool, "shell") }
	case "stepDone":
		pt.cmds <- func(cb runner.Callbacks) { cb.StepCompleted(event.StepTool, "shell") }
	case "return", "fail":
		var err error
		if action == "fail" {
			err = &runner.UserError{Message: "model failure"}
		}
		select {
		case pt.ret <- err:
		default:
		}
	case "ignoreCancel":
		p.mu.Lock()
		pt.ignore = true
		p.mu.Unlock()
	default:
		panic("unknown runner action " + action)
	}
}

// ask has the runner ask a question in the background, as runner/exec
// does, counting it open in the model until Ask returns.
func (pt *ModelTurn) ask(p *ModelPuppet) {
	p.mu.Lock()
	pt.asking++
	p.mu.Unlock()
	go func() {
		_, _ = pt.turn.Ask(pt.ctx, deployQuestion)
		p.mu.Lock()
		pt.asking--
		p.mu.Unlock()
	}()
}

// ModelElapse lets one of waits pass on the bubble's clock (drawn).
func ModelElapse(t *rapid.T, waits ...time.Duration) string {
	d := rapid.SampledFrom(waits).Draw(t, "for")
	time.Sleep(d) // real time: no — inside the synctest bubble this advances the fake clock
	return fmt.Sprintf("elapse %v", d)
}

// ModelConfig is the configuration of a model test's engines, with step as
// the step timeout (seconds): every deadline is within the reach of the
// drawn waits, and a runner ignoring cancellation, drawn often, does not
// fill the stuck runs. Busy mode is the caller's.
func ModelConfig(step float64) *config.Config {
	c := config.Default()
	d := &c.Agents.Defaults
	d.Runner, d.StepTimeoutSeconds, d.TimeoutSeconds = config.RunnerDemo, secs(step), secs(30)
	d.AbortGraceSeconds, d.ProgressNotifyAfterSeconds = secs(1), secs(0)
	c.Server.MaxStuckRuns = 1000
	return c
}

// TerminalOrder checks, event by event in the order subscribers saw them,
// that a run has one terminal event and that it is the run's last
// (ForceFinalized aside). It maps a run id to who published its terminal
// event.
type TerminalOrder map[string]string

// See checks ev, published by from; it returns the violation, "" if none.
func (o TerminalOrder) See(from string, ev event.Event) string {
	switch {
	case ev.RunID == "" || ev.Kind == event.ForceFinalized:
	case o[ev.RunID] != "" && ev.Kind.Terminal():
		return fmt.Sprintf("run %s: a second terminal event (%s from %s, after %s's)", ev.RunID, ev.Kind, from, o[ev.RunID])
	case o[ev.RunID] != "":
		return fmt.Sprintf("run %s: %s from %s after its terminal event", ev.RunID, ev.Kind, from)
	case ev.Kind.Terminal():
		o[ev.RunID] = from
	}
	return ""
}

// RunModel draws how many steps an interleaving has (1 to maxSteps) and
// does each, waits until the bubble's goroutines are durably blocked and
// checks the invariants, stopping at the first that does not hold. It
// returns the steps done and the violation ("" if none).
func RunModel(t *rapid.T, maxSteps int, step func(*rapid.T) string, check func() string) (trail []string, violation string) {
	n := rapid.IntRange(1, maxSteps).Draw(t, "steps")
	for range n {
		trail = append(trail, step(t))
		synctest.Wait()
		if violation = check(); violation != "" {
			break
		}
	}
	return trail, violation
}
