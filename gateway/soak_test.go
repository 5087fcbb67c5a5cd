package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/faketime"
	"github.com/turnguard/turnguard/runner"
)

// Soak sizes: 50,000 turns over 100,000 distinct sessions (each turn's
// session, and one more only read), in batches that run concurrently.
const (
	soakTurns = 50_000
	soakBatch = 500
)

// soakRunner ends a turn the way its message says: finish, error, hang
// (until the step timeout or a user's abort cancels it) or stuck (ignores
// cancellation for 4s, so it is force-finalized after the 1s grace, then
// returns).
var soakRunner = runner.Func(func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
	cb.StepStarted("tool", "shell")
	switch turn.Message {
	case "finish":
		cb.Delta("done")
		cb.StepCompleted("tool", "shell")
		return runner.Result{Text: "done"}, nil
	case "error":
		return runner.Result{}, errors.New("exit status 1: stderr: boom")
	case "stuck":
		faketime.Advance(4 * time.Second) // the runner ignores its cancel this long
		return runner.Result{}, ctx.Err()
	default: // hang
		<-ctx.Done()
		return runner.Result{}, context.Cause(ctx)
	}
})

var soakOutcomes = [...]string{"finish", "error", "hang", "abort", "stuck"}

type soakSample struct {
	goroutines int
	heap       uint64
	sessions   int
}

func sample(e *Engine) soakSample {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return soakSample{goroutines: runtime.NumGoroutine(), heap: m.HeapAlloc, sessions: len(e.Sessions())}
}

// TestSoakGoroutinesAndHeapStayFlat runs 50,000 turns of mixed outcomes —
// finish, runner error, step timeout, user abort, and stuck runners that
// ignore cancellation for a bounded time (force-finalized, then return) —
// over 100,000 distinct sessions, in fake time. After a warm-up (the
// outcome cache, the error ring and the session cap are full), goroutines
// must come back to the same count and the live heap must not grow by more
// than 10% (+1 MiB for GC noise) by the end: nothing per turn or per session
// is kept beyond its bound. Figures: docs/performance.md ("Soak").
func TestSoakGoroutinesAndHeapStayFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test (about 20s with -race)")
	}
	synctest.Test(t, func(t *testing.T) {
		h := &storedHistory{}
		c := testConfig(t, func(c *config.Config) {
			stepTimeout(2)(c)
			c.Agents.Defaults.AbortGraceSeconds = secs(1)
			c.Server.IdempotencyTTLSeconds = 30
			c.Server.MaxSessions = 2000
			c.Server.SessionIdleSeconds = 60
			c.Server.MaxStuckRuns = soakBatch
		})
		e, err := New(Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": soakRunner}, History: h.load,
			Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		e.Start(context.Background())
		defer e.Shutdown(context.Background())
		var events, terminal atomic.Int64
		e.Bus().Subscribe("", func(ev event.Event) {
			events.Add(1)
			if ev.Kind.Terminal() {
				terminal.Add(1)
			}
		})
		ctx := context.Background()
		counts := map[Status]int{}
		var warm soakSample
		for b := range soakTurns / soakBatch {
			ids := make([]string, 0, soakBatch)
			for i := range soakBatch {
				n := b*soakBatch + i
				key := fmt.Sprintf("soak-%d", 2*n)
				e.History(ctx, fmt.Sprintf("soak-%d", 2*n+1), 10) // a session only read
				kind := soakOutcomes[n%len(soakOutcomes)]
				text := kind
				if kind == "abort" {
					text = "hang"
				}
				ack, err := e.Send(ctx, SendRequest{SessionKey: key, Channel: "ws", Text: text})
				if err != nil {
					t.Fatalf("turn %d: %v", n, err)
				}
				if kind == "abort" {
					if _, err := e.Abort(ctx, key, ack.RunID, event.ReasonUser, "", true); err != nil {
						t.Fatal(err)
					}
				}
				ids = append(ids, ack.RunID)
			}
			faketime.Advance(5 * time.Second) // every deadline, grace and stuck runner is over
			synctest.Wait()
			for _, id := range ids {
				out, ok := e.Wait(ctx, id)
				if !ok {
					t.Fatalf("run %s has no outcome", id)
				}
				counts[out.Status]++
			}
			if b == soakTurns/soakBatch/2-1 {
				warm = sample(e)
			}
		}
		end := sample(e)
		t.Logf("turns %d (%v), events %d, terminal %d, history loads %d", soakTurns, counts, events.Load(), terminal.Load(), h.calls.Load())
		t.Logf("after warm-up (25,000 turns): %d goroutines, heap %d B, %d sessions; end (50,000 turns): %d goroutines, heap %d B (%+.1f%%), %d sessions",
			warm.goroutines, warm.heap, warm.sessions, end.goroutines, end.heap, 100*(float64(end.heap)/float64(warm.heap)-1), end.sessions)
		if terminal.Load() != soakTurns {
			t.Errorf("%d terminal events for %d turns", terminal.Load(), soakTurns)
		}
		if want := soakTurns / len(soakOutcomes); counts[StatusOK] != want || counts[StatusError] != want || counts[StatusAborted] != 3*want {
			t.Errorf("outcomes %v, want %d ok, %d error, %d aborted", counts, want, want, 3*want)
		}
		if end.goroutines > warm.goroutines {
			t.Errorf("goroutines grew from %d to %d", warm.goroutines, end.goroutines)
		}
		if limit := warm.heap + warm.heap/10 + 1<<20; end.heap > limit {
			t.Errorf("heap grew from %d to %d bytes (limit %d)", warm.heap, end.heap, limit)
		}
		if end.sessions > c.Server.MaxSessions {
			t.Errorf("%d sessions kept, cap %d", end.sessions, c.Server.MaxSessions)
		}
		if s := e.StuckRuns(); len(s) != 0 || e.reg.Len() != 0 {
			t.Errorf("left behind: stuck %v, %d live runs", s, e.reg.Len())
		}
	})
}
