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
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"

	"github.com/turnguard/turnguard/internal/faketime"
)

// sink records the bus's events as a user-facing transcript.
type sink struct {
	mu     sync.Mutex
	start  time.Time
	events []event.Event
	lines  []string
}

func (s *sink) handle(ev event.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, ev)
	at := time.Since(s.start)
	var l string
	switch ev.Kind {
	case event.StepStarted, event.StepCompleted, event.Recovered:
		l = fmt.Sprintf("%s %s", ev.Kind, ev.Step.Label())
	case event.Delta:
		return
	case event.Progress, event.Aborted:
		l = fmt.Sprintf("%s %s %q", ev.Kind, ev.StopReason, ev.Message)
	case event.Finished:
		l = fmt.Sprintf("%s %s %q", ev.Kind, ev.StopReason, ev.FullText+ev.Message)
	default:
		l = ev.Kind.String()
		if ev.StopReason != "" {
			l += " " + string(ev.StopReason)
		}
	}
	s.lines = append(s.lines, fmt.Sprintf("%v %s", at, l))
}

func (s *sink) transcript() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

type env struct {
	e    *Engine
	sink *sink
	demo *demo.Runner
}

// newEnv starts an engine on the demo runner with the given YAML-ish
// adjustments applied to the defaults.
func newEnv(t *testing.T, adjust func(*config.Config)) *env {
	t.Helper()
	c := testConfig(t, adjust)
	d := demo.New()
	e, s := startEngine(t, c, map[string]runner.Runner{"demo": d})
	t.Cleanup(d.Release) // runs before startEngine's cleanup: stuck demo turns end, then the engine stops
	return &env{e: e, sink: s, demo: d}
}

// startEngine starts an engine with config c and runners, and a sink
// subscribed to all its events; the test's cleanup shuts it down.
func startEngine(t *testing.T, c *config.Config, runners map[string]runner.Runner) (*Engine, *sink) {
	t.Helper()
	return startEngineWith(t, Options{Config: config.NewSource(c), Runners: runners})
}

// startEngineWith is startEngine with every option.
func startEngineWith(t *testing.T, opts Options) (*Engine, *sink) {
	t.Helper()
	e, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.Start(ctx)
	s := &sink{start: time.Now()}
	unsub := e.Bus().Subscribe("", s.handle)
	t.Cleanup(func() {
		e.Shutdown(context.Background())
		unsub()
		cancel()
	})
	return e, s
}

// testConfig returns the default config with adjust applied, validated.
func testConfig(t testing.TB, adjust func(*config.Config)) *config.Config {
	t.Helper()
	c := config.Default()
	if adjust != nil {
		adjust(c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

func secs(v float64) *float64 { return &v }

// rejectWhenBusy sets busy mode reject (a message while busy is refused).
func rejectWhenBusy(c *config.Config) { c.Agents.Defaults.Busy.Mode = config.BusyReject }

func stepTimeout(sec float64) func(*config.Config) {
	return func(c *config.Config) {
		c.Agents.Defaults.StepTimeoutSeconds = secs(sec)
		c.Agents.Defaults.AbortGraceSeconds = secs(2)
		c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(0)
	}
}

func (v *env) send(t *testing.T, id, text string) Ack {
	t.Helper()
	ack, err := v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: id, Text: text, Owner: "conn1"})
	if err != nil {
		t.Fatalf("Send(%q): %v", text, err)
	}
	return ack
}

func TestHappyTurnTranscript(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, nil)
		if ack := v.send(t, "r1", "/steps web_search:300ms llm:1s say:Found_it"); ack.Status != StatusStarted || ack.RunID != "r1" {
			t.Fatalf("ack %+v", ack)
		}
		out, ok := v.e.Wait(context.Background(), "r1")
		if !ok || out.Status != StatusOK || out.Text != "Thinking about the next step. Found it" {
			t.Fatalf("outcome %+v", out)
		}
		synctest.Wait()
		want := `0s turn_started
0s step_started web_search
300ms step_completed web_search
300ms step_started demo
1.3s step_completed demo
1.3s finished stop "Thinking about the next step. Found it"`
		if got := v.sink.transcript(); got != want {
			t.Fatalf("transcript:\n%s\nwant:\n%s", got, want)
		}
		_, h, _ := v.e.History(context.Background(), "main", 0)
		if len(h) != 2 || h[0].Role != "user" || h[1].Text != out.Text {
			t.Fatalf("history %+v", h)
		}
	})
}

func TestSilentStepTimesOutWithToolNameAndFreesSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, stepTimeout(2))
		v.send(t, "r1", "/steps web_search:300ms shell:hang")
		out, _ := v.e.Wait(context.Background(), "r1")
		want := "⚠️ No progress for 2 s — shell never finished (last completed: web_search). The task may be stuck. Retry or ask for a simpler approach."
		if out.Status != StatusAborted || out.StopReason != event.ReasonStepTimeout || out.Message != want {
			t.Fatalf("outcome %+v", out)
		}
		synctest.Wait()
		if !strings.Contains(v.sink.transcript(), "2.3s aborted step_timeout") {
			t.Fatalf("transcript:\n%s", v.sink.transcript())
		}
		if _, busy := v.e.Active("main"); busy {
			t.Fatal("session still busy after the runner returned")
		}
		// The notice is in the history as assistant text.
		_, h, _ := v.e.History(context.Background(), "main", 0)
		if last := h[len(h)-1]; last.Role != "assistant" || last.Text != want {
			t.Fatalf("history %+v", h)
		}
	})
}

// TestStepTimeoutPartialReplyHasNoStopReason: a turn stopped for a step
// timeout after part of its reply keeps the partial reply in the history
// without a stop reason and the notice with it, so a client counting
// notices by stop reason finds one (issue 22: it found two).
func TestStepTimeoutPartialReplyHasNoStopReason(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, stepTimeout(2))
		v.send(t, "r1", "/steps say:Half_done shell:hang")
		out, _ := v.e.Wait(context.Background(), "r1")
		if out.StopReason != event.ReasonStepTimeout {
			t.Fatalf("outcome %+v", out)
		}
		_, h, _ := v.e.History(context.Background(), "main", 0)
		var notices []string
		for _, m := range h {
			if m.StopReason != "" {
				notices = append(notices, m.Text)
			}
		}
		if len(h) != 3 || h[1].Text != "Half done" || h[1].StopReason != "" || len(notices) != 1 || notices[0] != out.Message {
			t.Fatalf("history %+v; want the user's message, the partial reply without a stop reason, the notice with it", h)
		}
	})
}

func TestStuckRunnerForceFinalizedThenSessionFree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, func(c *config.Config) { stepTimeout(2)(c); rejectWhenBusy(c) })
		v.send(t, "r1", "/steps shell:stuck")
		faketime.Advance(3 * time.Second)
		synctest.Wait()
		_, err := v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: "r2", Text: "hi"})
		var busy *BusyError
		if !errors.As(err, &busy) || !busy.Stopping {
			t.Fatalf("during grace: %v, want busy (stopping)", err)
		}
		faketime.Advance(2 * time.Second)
		synctest.Wait()
		if !strings.Contains(v.sink.transcript(), "4s force_finalized step_timeout") {
			t.Fatalf("transcript:\n%s", v.sink.transcript())
		}
		if ack := v.send(t, "r2", "/steps say:hello"); ack.Status != StatusStarted {
			t.Fatalf("after force-finalize: %+v", ack)
		}
	})
}

func TestBusyAndIdempotency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, rejectWhenBusy)
		v.send(t, "r1", "/steps shell:1s")
		if ack := v.send(t, "r1", "/steps shell:1s"); ack.Status != StatusInFlight {
			t.Fatalf("repeat while running: %+v", ack)
		}
		_, err := v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: "r2", Text: "other"})
		var busy *BusyError
		if !errors.As(err, &busy) || busy.RunID != "r1" || !strings.Contains(busy.UserText(), "/stop") {
			t.Fatalf("second message while running: %v", err)
		}
		v.e.Wait(context.Background(), "r1")
		ack := v.send(t, "r1", "/steps shell:1s")
		if ack.Status != StatusOK || ack.Outcome == nil || ack.Outcome.Text != "Done." {
			t.Fatalf("repeat after finish: %+v", ack)
		}
		synctest.Wait()
		if n := strings.Count(v.sink.transcript(), "turn_started"); n != 1 {
			t.Fatalf("%d turns started for one key", n)
		}
		// After the dedupe window the key starts a new turn.
		faketime.Advance(6 * time.Minute)
		if ack := v.send(t, "r1", "/steps say:again"); ack.Status != StatusStarted {
			t.Fatalf("after TTL: %+v", ack)
		}
	})
}

func TestAbortAuthorization(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, nil)
		v.send(t, "r1", "/steps web_search:1s shell:hang")
		ctx := context.Background()
		if _, err := v.e.Abort(ctx, "main", "r1", event.ReasonUser, "someone-else", false); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("stranger abort: %v", err)
		}
		if _, err := v.e.Abort(ctx, "other", "r1", event.ReasonUser, "conn1", false); !errors.Is(err, ErrWrongSession) {
			t.Fatalf("wrong session: %v", err)
		}
		faketime.Advance(1500 * time.Millisecond)
		res, err := v.e.Abort(ctx, "main", "", event.ReasonUser, "conn1", false)
		if err != nil || !res.Aborted || len(res.RunIDs) != 1 || res.RunIDs[0] != "r1" {
			t.Fatalf("owner abort: %+v %v", res, err)
		}
		out, _ := v.e.Wait(ctx, "r1")
		if out.StopReason != event.ReasonUser || out.Message != "⏹️ Stopped while shell was running after 1.5 s." {
			t.Fatalf("outcome %+v", out)
		}
		res, err = v.e.Abort(ctx, "main", "", event.ReasonUser, "conn1", false)
		if err != nil || res.Aborted {
			t.Fatalf("abort with nothing running: %+v %v", res, err)
		}
	})
}

func TestProgressNoticeAndRecovered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, func(c *config.Config) {
			c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(30)
			c.Agents.Defaults.ProgressRepeatSeconds = secs(60)
		})
		v.send(t, "r1", "/steps shell:100s say:ok")
		v.e.Wait(context.Background(), "r1")
		synctest.Wait()
		want := `0s turn_started
0s step_started shell
30s progress  "⏳ Still working — shell has been running for 30 s…"
1m30s progress  "⏳ Still working — shell has been running for 1 min 30 s…"
1m40s step_completed shell
1m40s recovered shell
1m40s finished stop "ok"`
		if got := v.sink.transcript(); got != want {
			t.Fatalf("transcript:\n%s\nwant:\n%s", got, want)
		}
	})
}

func TestHeartbeatsKeepLongStepAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, stepTimeout(5))
		v.send(t, "r1", "/steps build:1m:hb=2s say:built")
		out, _ := v.e.Wait(context.Background(), "r1")
		if out.Status != StatusOK || out.Text != "built" {
			t.Fatalf("outcome %+v", out)
		}
	})
}

func TestRequestTimeoutOverrideClampedToCeiling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, func(c *config.Config) {
			c.Agents.Defaults.MaxTurnTimeSeconds = secs(10)
			c.Agents.Defaults.StepTimeoutSeconds = secs(0)
		})
		ctx := context.Background()
		v.e.Send(ctx, SendRequest{SessionKey: "main", Channel: "ws", RunID: "r1", Text: "/steps shell:hang", Timeout: time.Hour})
		out, _ := v.e.Wait(ctx, "r1")
		if out.StopReason != event.ReasonMaxTurnTime || out.EndedAt.Sub(out.StartedAt) != 10*time.Second {
			t.Fatalf("outcome %+v", out)
		}
		synctest.Wait() // the runner returns and frees the session
		v.e.Send(ctx, SendRequest{SessionKey: "main", Channel: "ws", RunID: "r2", Text: "/steps shell:hang", Timeout: 3 * time.Second})
		out, _ = v.e.Wait(ctx, "r2")
		if out.StopReason != event.ReasonTimeout || out.EndedAt.Sub(out.StartedAt) != 3*time.Second {
			t.Fatalf("outcome %+v", out)
		}
	})
}

func TestBadScriptAndBadInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, func(c *config.Config) { c.Server.MaxMessageChars = 50 })
		v.send(t, "r1", "/steps shell:abc")
		out, _ := v.e.Wait(context.Background(), "r1")
		if out.Status != StatusError || !strings.Contains(out.Message, `token 1 "shell:abc"`) {
			t.Fatalf("outcome %+v", out)
		}
		ctx := context.Background()
		if _, err := v.e.Send(ctx, SendRequest{SessionKey: "main", Channel: "ws", Text: "   "}); !errors.Is(err, ErrEmpty) {
			t.Fatalf("blank: %v", err)
		}
		if _, err := v.e.Send(ctx, SendRequest{SessionKey: "main", Channel: "ws", Text: strings.Repeat("x", 51)}); !errors.Is(err, ErrTooLong) {
			t.Fatalf("long: %v", err)
		}
	})
}

func TestPanickingRunnerIsAnError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := config.Default()
		e, _ := New(Options{Config: config.NewSource(c), Runners: map[string]runner.Runner{"demo": runner.Func(
			func(ctx context.Context, turn runner.Turn, cb runner.Callbacks) (runner.Result, error) {
				cb.StepStarted("tool", "shell")
				panic("boom")
			})}})
		e.Start(context.Background())
		defer e.Shutdown(context.Background())
		e.Send(context.Background(), SendRequest{SessionKey: "s", Channel: "ws", RunID: "p", Text: "hi"})
		out, _ := e.Wait(context.Background(), "p")
		if out.Status != StatusError || !strings.Contains(out.Message, "during shell") {
			t.Fatalf("outcome %+v", out)
		}
	})
}

func TestShutdownAbortsRunningTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, nil)
		v.send(t, "r1", "/steps web_search:1s shell:hang")
		faketime.Advance(2 * time.Second)
		v.e.Shutdown(context.Background())
		out, _ := v.e.Wait(context.Background(), "r1")
		if out.StopReason != event.ReasonShutdown || !strings.Contains(out.Message, "shutting down") {
			t.Fatalf("outcome %+v", out)
		}
		if _, err := v.e.Send(context.Background(), SendRequest{SessionKey: "x", Channel: "ws", Text: "hi"}); !errors.Is(err, ErrShutdown) {
			t.Fatalf("send after shutdown: %v", err)
		}
	})
}

// TestNextMessageRightAfterFinalIsAccepted: a client that sends its next
// message the instant it sees the final reply must not be told "busy".
func TestNextMessageRightAfterFinalIsAccepted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, nil)
		errs := make(chan error, 1)
		unsub := v.e.Bus().Subscribe("main", func(ev event.Event) {
			if ev.Kind == event.Finished && ev.RunID == "r1" {
				// Synchronously, as the fastest possible client would.
				_, err := v.e.Send(context.Background(), SendRequest{SessionKey: "main", Channel: "ws", RunID: "r2", Text: "/steps say:next"})
				errs <- err
			}
		})
		defer unsub()
		v.send(t, "r1", "/steps say:first")
		if err := <-errs; err != nil {
			t.Fatalf("send right after final: %v", err)
		}
	})
}

func TestResetClearsHistoryAndIsPublished(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newEnv(t, nil)
		v.send(t, "r1", "/steps say:one")
		v.e.Wait(context.Background(), "r1")
		idBefore, h, _ := v.e.History(context.Background(), "main", 0)
		if len(h) != 2 {
			t.Fatalf("history %+v", h)
		}
		v.e.Reset("main")
		idAfter, h, _ := v.e.History(context.Background(), "main", 0)
		if len(h) != 0 || idAfter == idBefore {
			t.Fatalf("after reset: id %q (was %q), history %+v", idAfter, idBefore, h)
		}
		v.sink.mu.Lock()
		defer v.sink.mu.Unlock()
		last := v.sink.events[len(v.sink.events)-1]
		if last.Kind != event.SessionReset || last.SessionKey != "main" || last.RunID != "" {
			t.Fatalf("last event %+v, want a SessionReset of main", last)
		}
	})
}
