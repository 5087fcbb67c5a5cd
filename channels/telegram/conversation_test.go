package telegram

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
)

func secs(v float64) *float64 { return &v }

// step is one move of a scripted conversation with chat alice: a message
// from the user, or time passing.
type step struct {
	say  string
	wait time.Duration
}

func say(text string) step      { return step{say: text} }
func wait(d time.Duration) step { return step{wait: d} }

var busyText = (&gateway.BusyError{}).UserText()
var stoppingText = (&gateway.BusyError{Stopping: true}).UserText()

// TestConversations runs scripted conversations against the demo runner
// and compares what the user sees at the end, message by message.
func TestConversations(t *testing.T) {
	cases := []struct {
		name   string
		adjust func(*config.Config)
		script []step
		want   []string
	}{
		{
			name:   "happy path",
			script: []step{say("/steps web_search:300ms llm:1s say:Found_it"), wait(2 * time.Second)},
			want:   []string{"Thinking about the next step. Found it"},
		},
		{
			name:   "markdown reply rendered",
			script: []step{say("/steps say:**Done**_—_a<b_&&_c>d"), wait(time.Second)},
			want:   []string{"Done — a<b && c>d"},
		},
		{
			name:   "status with nothing running",
			script: []step{say("/status")},
			want:   []string{textIdle},
		},
		{
			name:   "status of a running step",
			script: []step{say("/steps web_search:300ms shell:hang"), wait(10 * time.Second), say("/status")},
			want: []string{"⏳ Working — step 2: shell, running for 9.7 s.\n" +
				"The request has run for 10 s.\n" +
				"🟢 Making progress.\n" +
				"Time left:\n" +
				"• 4 min 50 s before the no-progress limit (5 min)\n" +
				"• about 30 min before the time limit (30 min)\n" +
				"• about 1 h before the hard maximum (1 h)\n" +
				"Send /stop to stop it."},
		},
		{
			name:   "status while paused",
			script: []step{say("/steps pause:hang"), wait(4 * time.Second), say("/status")},
			want: []string{"⏳ Working — no step has started yet.\n" +
				"The request has run for 4 s.\n" +
				"⏸️ Paused — waiting for a person; the no-progress clock is stopped.\n" +
				"Time left:\n" +
				"• about 30 min before the time limit (30 min)\n" +
				"• about 1 h before the hard maximum (1 h)\n" +
				"Send /stop to stop it."},
		},
		{
			name:   "stop a running turn",
			script: []step{say("/steps web_search:300ms shell:hang"), wait(5 * time.Second), say("/stop")},
			want:   []string{"⏹️ Stopped while shell was running after 5 s."},
		},
		{
			name:   "stop keeps the partial reply",
			script: []step{say("/steps say:Half_done shell:hang"), wait(2 * time.Second), say("/stop"), wait(time.Second)},
			want:   []string{"Half done", "⏹️ Stopped while shell was running after 2 s."},
		},
		{
			name:   "stop with nothing running",
			script: []step{say("/stop")},
			want:   []string{textNothingToStop},
		},
		{
			name:   "busy session",
			adjust: rejectWhenBusy, // busy mode reject: today's refusal (queue mode's answers: channels/conv)
			script: []step{say("/steps shell:hang"), wait(time.Second), say("and another thing")},
			want:   []string{busyText},
		},
		{
			name:   "new conversation stops the running turn",
			script: []step{say("/steps shell:hang"), wait(3 * time.Second), say("/new"), wait(time.Second)},
			want:   []string{"⏹️ Stopped while shell was running after 3 s.", textNew},
		},
		{
			name:   "new conversation when idle",
			script: []step{say("/new")},
			want:   []string{textNew},
		},
		{
			name: "step timeout",
			adjust: func(c *config.Config) {
				c.Channels.Telegram.Timeouts.StepTimeoutSeconds = secs(5)
			},
			script: []step{say("/steps web_search:300ms shell:hang"), wait(10 * time.Second)},
			want: []string{"⚠️ No progress for 5 s — shell never finished (last completed: web_search). The task may be stuck. " +
				"Retry or ask for a simpler approach."},
		},
		{
			name: "heartbeats keep a long step alive",
			adjust: func(c *config.Config) {
				c.Channels.Telegram.Timeouts.StepTimeoutSeconds = secs(5)
			},
			script: []step{say("/steps build:20s:hb=2s say:Built"), wait(21 * time.Second)},
			want:   []string{"Built"},
		},
		{
			name: "wall clock",
			adjust: func(c *config.Config) {
				c.Channels.Telegram.Timeouts.TimeoutSeconds = secs(10)
			},
			script: []step{say("/steps build:1m:hb=1s"), wait(15 * time.Second)},
			want: []string{"⏳ Your request will be stopped in 2 s unless it finishes.", // budgetWarningRatio 0.8
				"⚠️ This request was stopped at its time limit of 10 s while build was running. " +
					"Try again, or ask for something smaller."},
		},
		{
			name: "ceiling",
			adjust: func(c *config.Config) {
				c.Channels.Telegram.Timeouts.MaxTurnTimeSeconds = secs(8)
				c.Channels.Telegram.Timeouts.TimeoutSeconds = secs(100)
			},
			script: []step{say("/steps build:1m:hb=1s"), wait(15 * time.Second)},
			want: []string{"⏳ Your request will be stopped in 1.6 s unless it finishes.", // budgetWarningRatio 0.8 of the ceiling
				"⚠️ This request reached the maximum time of 8 s while build was running. " +
					"It was stopped; please split it into smaller requests."},
		},
		{
			name: "stuck runner: busy while stopping, free after the grace",
			adjust: func(c *config.Config) {
				c.Channels.Telegram.Timeouts.StepTimeoutSeconds = secs(5)
				c.Channels.Telegram.Timeouts.AbortGraceSeconds = secs(3)
				rejectWhenBusy(c)
			},
			script: []step{
				say("/steps shell:stuck"), wait(6 * time.Second),
				say("hello?"), wait(3 * time.Second),
				say("/steps say:Back"), wait(time.Second),
			},
			want: []string{
				"⚠️ No progress for 5 s — shell never finished. The task may be stuck. Retry or ask for a simpler approach.",
				stoppingText,
				"Back",
			},
		},
		{
			name: "status while a stuck turn is stopping",
			adjust: func(c *config.Config) {
				c.Channels.Telegram.Timeouts.StepTimeoutSeconds = secs(5)
			},
			script: []step{say("/steps shell:stuck"), wait(6 * time.Second), say("/status")},
			want: []string{
				"⚠️ No progress for 5 s — shell never finished. The task may be stuck. Retry or ask for a simpler approach.",
				"⏹️ Stopping (no progress) — waiting for the work to end; the request has run for 6 s.\n🔴 Stuck: it is past its limit and the work has not stopped yet.",
			},
		},
		{
			name:   "stop twice",
			script: []step{say("/steps shell:stuck"), wait(time.Second), say("/stop"), wait(time.Second), say("/stop"), wait(time.Second)},
			want:   []string{"⏹️ Stopped while shell was running after 1 s.", textStillStopping},
		},
		{
			name:   "bad script is explained",
			script: []step{say("/steps shell:abc"), wait(time.Second)},
			want:   []string{`bad /steps script: token 1 "shell:abc": "abc" is not a duration (use 300ms, 2s, hang or stuck)`},
		},
		{
			name: "too long",
			adjust: func(c *config.Config) {
				c.Channels.Telegram.MaxInputChars = 20
			},
			script: []step{say("this is more than twenty characters"), say("/steps say:ok"), wait(time.Second)},
			want:   []string{tooLongText(35, 20), "ok"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, setup{adjust: tc.adjust})
				for _, s := range tc.script {
					if s.say != "" {
						h.say(alice, s.say)
					}
					if s.wait > 0 {
						h.advance(s.wait)
					}
				}
				h.wantScreen(alice, tc.want...)
			})
		})
	}
}

// TestHelp checks /help and /start: the commands, the limits in force and,
// for the demo runner, its /steps help.
func TestHelp(t *testing.T) {
	for _, cmd := range []string{"/help", "/start"} {
		t.Run(cmd, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, setup{adjust: func(c *config.Config) {
					c.Channels.Telegram.Timeouts.StepTimeoutSeconds = secs(120)
				}})
				h.say(alice, cmd)
				got := h.last(alice)
				for _, want := range []string{"/stop — stop the request", "/status", "/new", "/help",
					"A request is stopped after 30 min, or after 2 min without progress.", "/steps web_search:300ms shell:hang"} {
					if !strings.Contains(got, want) {
						t.Errorf("help lacks %q:\n%s", want, got)
					}
				}
			})
		})
	}
}

// TestShutdownNotice: a turn running when the gateway stops ends with the
// shutdown notice, delivered before Close returns.
func TestShutdownNotice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		h.say(alice, "/steps web_search:1s shell:hang")
		h.advance(5 * time.Second)
		h.stop()
		h.wantScreen(alice, "⚠️ The gateway is shutting down, so your request was stopped after 5 s while shell was running. "+
			"Please send it again in a minute.")
		if got := h.outbox.states(); strings.Join(got, ",") != "notice:delivered" {
			t.Errorf("outbox = %v, want the notice delivered", got)
		}
	})
}

// TestConfiguredTexts: the notices are the operator's templates from the
// configuration file.
func TestConfiguredTexts(t *testing.T) {
	cases := []struct {
		name   string
		script []step
		want   []string
	}{
		{"step timeout", []step{say("/steps shell:hang"), wait(10 * time.Second)}, []string{"🛑 Nothing happened for 5 s (shell hung)."}},
		{"wall clock", []step{say("/steps build:1m:hb=1s"), wait(25 * time.Second)}, []string{"⌛ 4 s left.", "🛑 Out of time after 20 s."}},
		{"stop", []step{say("/steps shell:hang"), wait(time.Second), say("/stop"), wait(time.Second)}, []string{"🛑 You stopped it."}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, setup{file: "messages.yaml"})
				for _, s := range tc.script {
					if s.say != "" {
						h.say(alice, s.say)
					}
					h.advance(s.wait)
				}
				h.wantScreen(alice, tc.want...)
			})
		})
	}
}

// rejectWhenBusy sets busy mode reject: a message while busy is refused.
func rejectWhenBusy(c *config.Config) { c.Channels.Telegram.Busy.Mode = config.BusyReject }
