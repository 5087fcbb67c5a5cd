package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/internal/faketime"
	"github.com/turnguard/turnguard/runner"
)

// stuckEnv is an engine whose runner ignores cancellation for the message
// "stuck" until release, and records what the operator hook was told.
type stuckEnv struct {
	e       *Engine
	c       *config.Config
	release func()
	mu      sync.Mutex
	told    []string
}

// newStuckEnv starts it with server.maxStuckRuns limit, a 1s step timeout
// and a 1s abort grace. Call inside a synctest bubble.
func newStuckEnv(t *testing.T, limit int) *stuckEnv {
	unstick := make(chan struct{})
	var once sync.Once
	v := &stuckEnv{release: func() { once.Do(func() { close(unstick) }) }}
	t.Cleanup(v.release)
	rn := runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
		if turn.Message == "stuck" {
			cb.StepStarted("tool", "shell")
			<-unstick // ignores ctx
		}
		return runner.Result{Text: "ok"}, nil
	})
	v.c = testConfig(t, func(c *config.Config) {
		stepTimeout(1)(c)
		c.Agents.Defaults.AbortGraceSeconds = secs(1)
		c.Server.MaxStuckRuns = limit
	})
	e, err := New(Options{Config: config.NewSource(v.c), Runners: map[string]runner.Runner{"demo": rn},
		StuckRuns: func(runner string, stuck, limit int, saturated bool) {
			v.mu.Lock()
			v.told = append(v.told, fmt.Sprintf("%s %d/%d %v", runner, stuck, limit, saturated))
			v.mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	t.Cleanup(func() { e.Shutdown(context.Background()) })
	v.e = e
	return v
}

func (v *stuckEnv) send(key, text string) error {
	_, err := v.e.Send(context.Background(), SendRequest{SessionKey: key, Channel: "ws", Text: text})
	return err
}

// stick starts a stuck turn in session key and lets it be force-finalized.
func (v *stuckEnv) stick(t *testing.T, key string) {
	t.Helper()
	if err := v.send(key, "stuck"); err != nil {
		t.Fatal(err)
	}
	faketime.Advance(3 * time.Second) // step timeout at 1s, force-finalized at 2s
	synctest.Wait()
}

func (v *stuckEnv) operatorTold() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return strings.Join(v.told, "; ")
}

// wantStuckRefusal fails unless err is the refusal a user sees at the cap.
func wantStuckRefusal(t *testing.T, err error) {
	t.Helper()
	var se *RunnerStuckError
	if !errors.As(err, &se) || !errors.Is(err, ErrRunnerStuck) || !strings.Contains(se.UserText(), "try again later") {
		t.Fatalf("at the cap: %v, want a RunnerStuckError", err)
	}
}

// TestStuckRunsCapRefusesNewTurnsAndAlertsOnce: runs whose runner ignores
// cancellation are force-finalized but keep running. At
// server.maxStuckRuns of them the runner's new turns are refused with a
// message for the user, and the operator hook is told once; when one
// returns, it is told the runner recovered and turns are accepted again.
func TestStuckRunsCapRefusesNewTurnsAndAlertsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newStuckEnv(t, 2)
		for i := range 2 {
			v.stick(t, fmt.Sprint("s", i))
			if i == 0 {
				if err := v.send("other", "hi"); err != nil {
					t.Fatalf("below the cap: %v", err)
				}
			}
		}
		wantStuckRefusal(t, v.send("new", "hi"))
		if got := v.e.StuckRuns()["demo"]; got != 2 {
			t.Fatalf("stuck runs %d, want 2", got)
		}
		v.release()
		synctest.Wait()
		if err := v.send("new", "hi"); err != nil {
			t.Fatalf("after the stuck runners returned: %v", err)
		}
		if got := v.operatorTold(); got != "demo 2/2 true; demo 1/2 false" {
			t.Fatalf("operator told %q, want one saturation and one recovery", got)
		}
	})
}

// TestStuckRunsCapFollowsReload: an operator lowers server.maxStuckRuns to
// the number of stuck runs by a hot reload. New turns are refused and the
// operator is told at once (not only at the next stuck run); raising it
// again accepts turns and closes the alert.
func TestStuckRunsCapFollowsReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newStuckEnv(t, 5)
		v.stick(t, "s0")
		v.stick(t, "s1")
		if err := v.send("other", "hi"); err != nil {
			t.Fatalf("below the cap: %v", err)
		}
		reload := func(limit int) {
			next := *v.c
			next.Server.MaxStuckRuns = limit
			v.e.ConfigChanged(&next)
		}
		reload(2)
		wantStuckRefusal(t, v.send("new", "hi"))
		if got := v.operatorTold(); got != "demo 2/2 true" {
			t.Fatalf("after lowering the cap to 2: operator told %q, want a saturation", got)
		}
		reload(3)
		if err := v.send("new", "hi"); err != nil {
			t.Fatalf("after raising the cap to 3: %v", err)
		}
		if got := v.operatorTold(); got != "demo 2/2 true; demo 2/3 false" {
			t.Fatalf("after raising the cap: operator told %q, want a recovery", got)
		}
		reload(3) // no change: nothing more to tell
		if got := v.operatorTold(); got != "demo 2/2 true; demo 2/3 false" {
			t.Fatalf("after an unchanged reload: operator told %q", got)
		}
	})
}

// TestStuckCountSettlesWhenRunnerReturnsAsItIsForceFinalized: runners that
// return at the very moment their grace ends race the force-finalization.
// Whichever wins, no stuck run is left counted (-race, 400 turns).
func TestStuckCountSettlesWhenRunnerReturnsAsItIsForceFinalized(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rn := runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
			cb.StepStarted("tool", "shell")
			<-ctx.Done()
			faketime.Advance(time.Second) // exactly the grace
			return runner.Result{}, ctx.Err()
		})
		c := testConfig(t, func(c *config.Config) {
			stepTimeout(1)(c)
			c.Agents.Defaults.AbortGraceSeconds = secs(1)
			c.Server.MaxStuckRuns = 1000
		})
		e, err := New(Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": rn}})
		if err != nil {
			t.Fatal(err)
		}
		e.Start(context.Background())
		defer e.Shutdown(context.Background())
		for i := range 400 {
			if _, err := e.Send(context.Background(), SendRequest{SessionKey: fmt.Sprint("s", i), Channel: "ws", Text: "x"}); err != nil {
				t.Fatal(err)
			}
		}
		faketime.Advance(5 * time.Second)
		synctest.Wait()
		if s := e.StuckRuns(); len(s) != 0 {
			t.Fatalf("stuck runs left counted after every runner returned: %v", s)
		}
	})
}
