package main

// Resume after a crash (agents.defaults.resume): the built binary is killed
// with SIGKILL in the middle of a turn and started again on the same
// SQLite file; what the person reads afterwards is checked. Resume off
// (the default) is TestCrashInterruptedNoticeOnce and
// TestCrashTelegramInterruptedNoticeOnce: today's notice, nothing run again.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/fakebot"
	"github.com/turnguard/turnguard/messages"
	"github.com/turnguard/turnguard/ops/metrics"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/storetest"
)

// withResume turns resume on, with maxAttempts attempts, in a crashConfig
// (or telegramConfig).
func withResume(cfg string, maxAttempts int) string {
	return strings.Replace(cfg, "    abortGraceSeconds: 5\n",
		fmt.Sprintf("    abortGraceSeconds: 5\n    resume:\n      enabled: true\n      maxAttempts: %d\n", maxAttempts), 1)
}

// killIn kills the gateway p once the store file records run in step
// current (so the kill cannot race the asynchronous writer).
func killIn(t *testing.T, p *gatewayProc, db, run, current string) {
	t.Helper()
	waitCurrentStep(t, db, run, current)
	p.signal(syscall.SIGKILL)
	p.wait(5 * time.Second)
}

// stopClean stops the gateway p with SIGTERM and fails unless it exits 0.
func stopClean(t *testing.T, p *gatewayProc) {
	t.Helper()
	p.signal(syscall.SIGTERM)
	if code := p.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// TestResumeAfterSIGKILL: a WebSocket turn cut off by a SIGKILL while the
// model was answering (replay-safe) runs again at the next start, as its
// attempt 2 of 3: its person finds in chat.history the resuming notice,
// their message, and the reply of the resumed attempt — whose agent was
// told that its previous attempt was interrupted while the model was
// running. A further restart runs nothing again.
func TestResumeAfterSIGKILL(t *testing.T) {
	dir := t.TempDir()
	cfg := withResume(crashConfig(dir), 3)
	db := filepath.Join(dir, "gateway.db")
	const run, session, ask = "run-resume", "main", "/steps llm:5s say:Resumed_fine"
	next := store.ResumeRunID(run, 2)

	p := startGateway(t, dir, cfg)
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, session, run, ask)
	killIn(t, p, db, run, "demo")

	for restart := 1; restart <= 2; restart++ {
		p := startGateway(t, dir, cfg)
		waitTurn(t, db, next, "finished", func(tr store.Turn) bool { return tr.State == store.TurnFinished })
		cl := dialGateway(t, p.addr, testToken)
		var got []string
		for _, m := range history(t, cl, session) {
			for _, c := range m.Content {
				got = append(got, m.Role+"/"+m.StopReason+": "+c.Text)
			}
		}
		if len(got) != 4 || got[0] != "user/: "+ask || got[2] != "user/: "+ask ||
			got[1] != "assistant/interrupted: 🔄 Your request was interrupted by a server problem while the model was running — resuming it (attempt 2 of 3)…" ||
			!strings.HasPrefix(got[3], "assistant/stop: 📨 Noted: [Gateway note: this is attempt 2 of 3 of the request below. "+
				"The previous attempt was interrupted by a server restart while the model was running.") ||
			!strings.HasSuffix(got[3], "Resumed fine") {
			t.Fatalf("after restart %d the history reads:\n%s", restart, strings.Join(got, "\n"))
		}
		if n := strings.Count(p.log(), "is resumed"); n != map[int]int{1: 1, 2: 0}[restart] {
			t.Errorf("restart %d logged %d resumed turns", restart, n)
		}
		stopClean(t, p)
	}
}

// TestResumeAttemptsExhaustedTelegram: with two attempts, a Telegram turn
// cut off twice (the model hangs each time) is resumed once — the chat
// reads "resuming it (attempt 2 of 2)" — and then ended for good with the
// usual interrupted notice and its Retry button; the resuming notice has
// none (a tap would run the request twice). Each notice reaches the
// chat once; a further restart sends nothing.
func TestResumeAttemptsExhaustedTelegram(t *testing.T) {
	dir := t.TempDir()
	bot := fakebot.New(t)
	cfg := withResume(telegramConfig(dir, bot), 2)
	db := filepath.Join(dir, "gateway.db")
	const within = 30 * time.Second
	const resuming = "🔄 Your request was interrupted by a server problem while the model was running — resuming it (attempt 2 of 2)…"
	const interrupted = "⚠️ Your request was interrupted by a server problem — last action was the model. Please send it again."

	p := startGateway(t, dir, cfg)
	msgID := bot.Say("/steps llm:hang")
	run := fmt.Sprintf("tg-%d-%d", crashChat, msgID)
	killIn(t, p, db, run, "demo")

	p = startGateway(t, dir, cfg)
	if n := bot.WaitShown(within, "the resuming notice", func(s fakebot.Shown) bool { return s.Text == resuming }); n.Buttons != nil {
		t.Errorf("the resuming notice offers %q: a tap would run the request a second time", n.Labels())
	}
	killIn(t, p, db, store.ResumeRunID(run, 2), "demo")

	p = startGateway(t, dir, cfg)
	notice := bot.WaitShown(within, "the interrupted notice with Retry", func(s fakebot.Shown) bool {
		return s.Text == interrupted && s.Buttons != nil
	})
	if got := notice.Labels(); !slices.Equal(got, []string{"🔁 Retry"}) {
		t.Errorf("the interrupted notice's buttons %q, want [🔁 Retry]", got)
	}
	stopClean(t, p)

	startGateway(t, dir, cfg)
	bot.Say("/steps say:Marker")
	bot.WaitShown(within, "the marker", func(s fakebot.Shown) bool { return s.Text == "Marker" })
	for _, text := range []string{resuming, interrupted} {
		if n := bot.Count(text); n != 1 {
			t.Errorf("%q reached the chat %d times, want once:%s", text, n, bot)
		}
	}
	if tr, err := storeTurn(t, db, store.ResumeRunID(run, 3)); err == nil {
		t.Errorf("a third attempt ran: %+v", tr)
	}
}

// TestResumeToolStepAsksTelegram: a Telegram turn cut off while a tool ran
// (a possible side effect) is not run again at once: the chat reads why,
// then a question with Resume and Cancel buttons. Resume runs it (the
// reply once); Cancel does not (the tool's reply never comes, the person
// reads that it was not resumed).
func TestResumeToolStepAsksTelegram(t *testing.T) {
	const within = 30 * time.Second
	const why = "⚠️ Your request was interrupted by a server problem while shell was running. " +
		"That step may already have had an effect, so I will ask before resuming it."
	const question = "🔐 Approval needed: Resume your interrupted request? It stopped while shell was running, which may already have had an effect."
	for _, tc := range []struct {
		press, reply, absent string
	}{
		{messages.ResumeOption, "Shell done", messages.ResumeCancelled},
		{messages.CancelOption, messages.ResumeCancelled, "Shell done"},
	} {
		t.Run(tc.press, func(t *testing.T) {
			dir := t.TempDir()
			bot := fakebot.New(t)
			cfg := withResume(telegramConfig(dir, bot), 3)
			db := filepath.Join(dir, "gateway.db")

			p := startGateway(t, dir, cfg)
			msgID := bot.Say("/steps shell:5s say:Shell_done")
			killIn(t, p, db, fmt.Sprintf("tg-%d-%d", crashChat, msgID), "shell")

			p = startGateway(t, dir, cfg)
			if n := bot.WaitShown(within, "why it asks", func(s fakebot.Shown) bool { return s.Text == why }); n.Buttons != nil {
				t.Errorf("the notice offers %q besides the question", n.Labels())
			}
			q := bot.WaitShown(within, "the question", func(s fakebot.Shown) bool {
				return strings.HasPrefix(s.Text, question) && s.Buttons != nil
			})
			if got := q.Labels(); !slices.Equal(got, []string{messages.ResumeOption, messages.CancelOption}) {
				t.Fatalf("the question's buttons %q, want [Resume Cancel]:%s", got, bot)
			}
			bot.WaitAnswer(within, bot.Press(fakebot.User{ID: fakebot.Chat, FirstName: "User"}, q.ID, q.Button(tc.press)))
			bot.WaitShown(within, tc.reply, func(s fakebot.Shown) bool { return strings.Contains(s.Text, tc.reply) })
			bot.Say("/steps say:Marker")
			bot.WaitShown(within, "the marker", func(s fakebot.Shown) bool { return s.Text == "Marker" })
			if n := bot.Count(tc.reply); n != 1 {
				t.Errorf("%q reached the chat %d times, want once:%s", tc.reply, n, bot)
			}
			if n := bot.Count(tc.absent); n != 0 {
				t.Errorf("%q reached the chat:%s", tc.absent, bot)
			}
			if t.Failed() {
				t.Logf("gateway log:\n%s", p.log())
			}
		})
	}
}

// storeTurn reads run's turn from the store file (the gateway may hold it).
func storeTurn(t *testing.T, path, run string) (store.Turn, error) {
	t.Helper()
	st, err := store.Open(t.Context(), path, store.Options{Unlocked: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	return st.Turn(t.Context(), run)
}

// TestRecoverInterruptedResumes: the start-up recovery on SQLite and on
// PostgreSQL, resume on with two attempts. A turn cut off in a model call
// gets its attempt 2 queued with the person's text and sender, and ends
// with the resuming notice (history and outbox); one cut off in a tool call
// gets an attempt that asks first, and the notice that says so; one whose
// first attempt is older than maxAgeSeconds ends with the interrupted
// notice. Each decision is counted in resume_decisions_total by outcome
// (resumed, asked, skipped; exhausted after the last attempt).
// When attempt 2 is cut off too, it was the last: the interrupted
// notice, no attempt 3.
func TestRecoverInterruptedResumes(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	cfg := config.Default()
	cfg.Agents.Defaults.Resume = config.Resume{Enabled: true, MaxAttempts: 2, MaxAgeSeconds: 3600}
	const interrupted = "⚠️ Your request was interrupted by a server problem"
	llm, shell := event.Step{Kind: event.StepLLM, Name: "gpt"}, event.Step{Kind: event.StepTool, Name: "shell"}
	for _, tc := range reopeners(quiet) {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			open := tc.open(t)
			s := open()
			now := time.Now()
			cutOff := func(run, session, text string, at time.Time, step event.Step) {
				tr := storetest.NewTurn(run, session)
				storetest.HandleAll(s,
					tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text, e.Sender, e.Time = text, "telegram-user:7", at }),
					tr.Ev(event.StepStarted, 0, func(e *event.Event) { e.Step, e.Time = step, at }))
			}
			cutOff("run-llm", "telegram:1", "summarise", now, llm)
			cutOff("run-tool", "telegram:2", "deploy", now, shell)
			cutOff("run-old", "telegram:3", "ancient", now.Add(-2*time.Hour), llm)
			storetest.Flush(t, s)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}

			s = open()
			m := metrics.New("test")
			decisions := func(want map[string]float64) {
				t.Helper()
				got, err := m.Values("turnguard_resume_decisions_total", "outcome")
				if err != nil || !maps.Equal(got, want) {
					t.Errorf("resume_decisions_total %v, %v; want %v", got, err, want)
				}
			}
			recoverInterrupted(ctx, s, cfg, quiet, m.ResumeDecision)
			decisions(map[string]float64{"resumed": 1, "asked": 1, "exhausted": 0, "skipped": 1})
			q, err := s.Queued(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range q {
				got = append(got, m.RunID+"="+m.Text+" by "+m.Owner)
			}
			slices.Sort(got)
			storetest.EqStrings(t, "queued", got, []string{"run-llm-attempt-2=summarise by telegram-user:7", "run-tool-attempt-2=deploy by telegram-user:7"})
			for run, confirm := range map[string]bool{"run-llm-attempt-2": false, "run-tool-attempt-2": true} {
				if r, err := s.Resume(ctx, run); err != nil || r.Attempt != 2 || r.Confirm != confirm {
					t.Errorf("Resume(%s) = %+v, %v; want attempt 2, confirm %v", run, r, err, confirm)
				}
			}
			last := func(session string) string {
				h := storetest.MustHistory(t, s, session)
				return h[len(h)-1].Text
			}
			for session, want := range map[string]string{
				"telegram:1": messages.Resuming(llm, 2, 2), "telegram:2": messages.ResumeAsk(shell),
			} {
				if got := last(session); got != want {
					t.Errorf("%s's history ends %q, want %q", session, got, want)
				}
			}
			if got := last("telegram:3"); !strings.HasPrefix(got, interrupted) {
				t.Errorf("the too old turn's history ends %q, want the interrupted notice", got)
			}
			pending, err := s.Pending(ctx, "telegram", 10)
			if err != nil || len(pending) != 3 {
				t.Fatalf("outbox %+v, %v; want the 3 notices", pending, err)
			}

			// Attempt 2 of run-llm starts, and is cut off too: its last.
			tr := storetest.NewTurn("run-llm-attempt-2", "telegram:1")
			storetest.HandleAll(s,
				tr.Ev(event.TurnStarted, 0, func(e *event.Event) { e.Text, e.Time = "summarise", now }),
				tr.Ev(event.StepStarted, 0, func(e *event.Event) { e.Step, e.Time = llm, now }))
			storetest.Flush(t, s)
			recoverInterrupted(ctx, s, cfg, quiet, m.ResumeDecision)
			decisions(map[string]float64{"resumed": 1, "asked": 1, "exhausted": 1, "skipped": 1})
			if got := last("telegram:1"); !strings.HasPrefix(got, interrupted) {
				t.Errorf("after the last attempt the history ends %q, want the interrupted notice", got)
			}
			if _, err := s.Resume(ctx, "run-llm-attempt-3"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("an attempt 3: %v", err)
			}
			storetest.EqStrings(t, "queued after the last attempt", storetest.QueuedTexts(t, s), []string{"run-tool-attempt-2=deploy"})
		})
	}
}
