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

// TestStuckRunsCapRefusesNewTurnsAndAlertsOnce: runs whose runner ignores
// cancellation are force-finalized but keep running. At
// server.maxStuckRuns of them the runner's new turns are refused with a
// message for the user, and the operator hook is told once; when one
// returns, it is told the runner recovered and turns are accepted again.
func TestStuckRunsCapRefusesNewTurnsAndAlertsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		unstick := make(chan struct{})
		var once sync.Once
		release := func() { once.Do(func() { close(unstick) }) }
		defer release()
		rn := runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
			if turn.Message == "stuck" {
				cb.StepStarted("tool", "shell")
				<-unstick // ignores ctx
			}
			return runner.Result{Text: "ok"}, nil
		})
		var mu sync.Mutex
		var told []string
		c := testConfig(t, func(c *config.Config) {
			stepTimeout(1)(c)
			c.Agents.Defaults.AbortGraceSeconds = secs(1)
			c.Server.MaxStuckRuns = 2
		})
		e, err := New(Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": rn},
			StuckRuns: func(runner string, stuck, limit int, saturated bool) {
				mu.Lock()
				told = append(told, fmt.Sprintf("%s %d/%d %v", runner, stuck, limit, saturated))
				mu.Unlock()
			}})
		if err != nil {
			t.Fatal(err)
		}
		e.Start(context.Background())
		defer e.Shutdown(context.Background())
		ctx := context.Background()
		send := func(key, text string) error {
			_, err := e.Send(ctx, SendRequest{SessionKey: key, Channel: "ws", Text: text})
			return err
		}
		for i := range 2 {
			if err := send(fmt.Sprint("s", i), "stuck"); err != nil {
				t.Fatal(err)
			}
			faketime.Advance(3 * time.Second) // step timeout at 1s, force-finalized at 2s
			synctest.Wait()
			if i == 0 {
				if err := send("other", "hi"); err != nil {
					t.Fatalf("below the cap: %v", err)
				}
			}
		}
		err = send("new", "hi")
		var se *RunnerStuckError
		if !errors.As(err, &se) || !errors.Is(err, ErrRunnerStuck) || !strings.Contains(se.UserText(), "try again later") {
			t.Fatalf("at the cap: %v, want a RunnerStuckError", err)
		}
		if got := e.StuckRuns()["demo"]; got != 2 {
			t.Fatalf("stuck runs %d, want 2", got)
		}
		release()
		synctest.Wait()
		if err := send("new", "hi"); err != nil {
			t.Fatalf("after the stuck runners returned: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if got := strings.Join(told, "; "); got != "demo 2/2 true; demo 1/2 false" {
			t.Fatalf("operator told %q, want one saturation and one recovery", got)
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
