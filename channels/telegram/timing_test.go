package telegram

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/channels/conv"
	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
)

// callLine renders a call as "12s sendMessage #1 text" for comparisons.
// Times are rounded to 100ms: the shared limiter spaces calls by 1/30 s,
// so a message may go a few tens of milliseconds after a typing action.
func callLine(c apiCall) string {
	s := fmt.Sprintf("%v %s", c.At.Round(100*time.Millisecond), c.Method)
	if c.MsgID != 0 {
		s += fmt.Sprintf(" #%d", c.MsgID)
	}
	if c.Text != "" {
		s += " " + c.Text
	}
	if c.Fault != "" {
		s += " !" + c.Fault
	}
	return s
}

func callLines(calls []apiCall, methods ...string) []string {
	var out []string
	for _, c := range calls {
		if len(methods) == 0 || slices.Contains(methods, c.Method) {
			out = append(out, callLine(c))
		}
	}
	return out
}

func wantLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\n%s\nwant:\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestNoticeEditedInPlace: the "still working" notice is one message,
// edited at each repeat, and turned into a closing line when its step
// ends — or when the turn is stopped first.
func TestNoticeEditedInPlace(t *testing.T) {
	cases := []struct {
		name   string
		adjust func(*config.Config)
		script string
		run    time.Duration
		want   []string // sendMessage and editMessageText calls
		screen []string
	}{
		{
			name:   "step finishes",
			script: "/steps shell:3m tidy:2s say:Done",
			run:    4 * time.Minute,
			want: []string{
				"30s sendMessage #1 ⏳ Still working — shell has been running for 30 s…",
				"1m30s editMessageText #1 ⏳ Still working — shell has been running for 1 min 30 s…",
				"2m30s editMessageText #1 ⏳ Still working — shell has been running for 2 min 30 s…",
				"3m0s editMessageText #1 ✅ shell finished after 3 min.",
				"3m2s sendMessage #2 Done",
			},
			screen: []string{"✅ shell finished after 3 min.", "Done"},
		},
		{
			name: "turn stopped by the liveness limit",
			adjust: func(c *config.Config) {
				c.Channels.Telegram.Timeouts.StepTimeoutSeconds = secs(100)
			},
			script: "/steps shell:hang",
			run:    2 * time.Minute,
			want: []string{
				"30s sendMessage #1 ⏳ Still working — shell has been running for 30 s…",
				"1m30s editMessageText #1 ⏳ Still working — shell has been running for 1 min 30 s…",
				// The live view closes before the notice: the chat reads in order.
				"1m40s editMessageText #1 ⏹️ shell stopped after 1 min 40 s.",
				"1m41s sendMessage #2 ⚠️ No progress for 1 min 40 s — shell never finished. The task may be stuck. Retry or ask for a simpler approach.",
			},
			screen: []string{"⏹️ shell stopped after 1 min 40 s.",
				"⚠️ No progress for 1 min 40 s — shell never finished. The task may be stuck. Retry or ask for a simpler approach."},
		},
		{
			name: "a second slow step gets its own notice",
			adjust: func(c *config.Config) {
				c.Channels.Telegram.Timeouts.ProgressNotifyAfterSeconds = secs(10)
			},
			script: "/steps fetch:15s shell:12s tidy:1s say:ok",
			run:    time.Minute,
			want: []string{
				"10s sendMessage #1 ⏳ Still working — fetch has been running for 10 s…",
				"15s editMessageText #1 ✅ fetch finished after 15 s.",
				"25s sendMessage #2 ⏳ Still working — shell has been running for 10 s…",
				"27s editMessageText #2 ✅ shell finished after 12 s.",
				"28s sendMessage #3 ok",
			},
			screen: []string{"✅ fetch finished after 15 s.", "✅ shell finished after 12 s.", "ok"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, setup{adjust: tc.adjust})
				h.say(alice, tc.script)
				h.advance(tc.run)
				got := callLines(h.api.allCalls(), "sendMessage", "editMessageText")
				wantLines(t, "messages and edits", got, tc.want)
				h.wantScreen(alice, tc.screen...)
			})
		})
	}
}

// TestTypingCadence: while a turn runs the typing action is sent every 4 s
// (Telegram shows it for about 5 s), again right after a new message
// (which clears it), and never after the turn ended.
func TestTypingCadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		h.say(alice, "/steps work:37s say:Done")
		h.advance(time.Minute)
		got := callLines(h.api.callsTo("sendChatAction", alice))
		var want []string
		for _, s := range []int{0, 4, 8, 12, 16, 20, 24, 28, 30, 34} {
			want = append(want, fmt.Sprintf("%v sendChatAction", time.Duration(s)*time.Second))
		}
		wantLines(t, "typing actions", got, want)
		for _, c := range h.api.callsTo("sendChatAction", alice) {
			if c.Action != "typing" {
				t.Errorf("chat action %q, want typing", c.Action)
			}
		}
		h.wantScreen(alice, "✅ work finished after 37 s.", "Done")
	})
}

// TestTypingPausedWhileWaitingForAPerson: a paused turn shows no typing.
func TestTypingPausedWhileWaitingForAPerson(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		h.say(alice, "/steps web_search:2s pause:10s fetch:1s say:Approved")
		h.advance(15 * time.Second)
		wantLines(t, "typing actions", callLines(h.api.callsTo("sendChatAction", alice)),
			[]string{"0s sendChatAction", "12s sendChatAction"})
		h.wantScreen(alice, "Approved")
	})
}

// TestStepLines: with showSteps, one message lists the steps, edited as
// they start and finish; changes within a second become one edit.
func TestStepLines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{adjust: func(c *config.Config) { c.Channels.Telegram.ShowSteps = true }})
		h.say(alice, "/steps web_search:300ms fetch_page:200ms llm:1s shell:3s say:Done")
		h.advance(10 * time.Second)
		got := callLines(h.api.allCalls(), "sendMessage", "editMessageText")
		// Up to 2s nothing happens at the same instant; later the last step
		// and the reply coincide, so only the end state is fixed.
		wantLines(t, "first messages and edits", got[:3], []string{
			"0s sendMessage #1 🔧 web_search…",
			"1s editMessageText #1 ✅ web_search · 300 ms\n✅ fetch_page · 200 ms",
			"2s editMessageText #1 ✅ web_search · 300 ms\n✅ fetch_page · 200 ms\n🔧 shell…",
		})
		h.wantScreen(alice, "✅ web_search · 300 ms\n✅ fetch_page · 200 ms\n✅ shell · 3 s", "Thinking about the next step. Done")
		var prev time.Duration = -time.Hour
		for _, c := range h.api.allCalls() {
			if c.Method == "sendMessage" || c.Method == "editMessageText" {
				if c.At-prev < time.Second {
					t.Errorf("two messages or edits within a second: %v and %v", prev, c.At)
				}
				prev = c.At
			}
		}
	})
}

// TestStepLinesStopped: a step cut off by a stop is marked as stopped.
func TestStepLinesStopped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{adjust: func(c *config.Config) { c.Channels.Telegram.ShowSteps = true }})
		h.say(alice, "/steps web_search:300ms shell:hang")
		h.advance(5 * time.Second)
		h.say(alice, "/stop")
		h.advance(5 * time.Second)
		h.wantScreen(alice, "✅ web_search · 300 ms\n⏹️ shell", "⏹️ Stopped while shell was running after 5 s.")
	})
}

// TestRateLimit429: a 429 is waited out for retry_after, then the message
// is sent once; other messages to the chat wait too.
func TestRateLimit429(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{prepare: func(f *fakeAPI, _ *memTransport) {
			f.fail(fault{Method: "sendMessage", Chat: alice, Times: 2, Code: 429,
				Desc: "Too Many Requests: retry after 3", RetryAfter: 3})
		}})
		h.say(alice, "/status")
		h.say(alice, "/steps say:Hello")
		h.advance(10 * time.Second)
		wantLines(t, "sendMessage calls", callLines(h.api.callsTo("sendMessage", alice)), []string{
			"0s sendMessage !Too Many Requests: retry after 3",
			"3s sendMessage !Too Many Requests: retry after 3",
			"6s sendMessage #1 " + textIdle,
			"7s sendMessage #2 Hello",
		})
		if got := h.outbox.states(); strings.Join(got, ",") != "final:delivered" {
			t.Errorf("outbox = %v", got)
		}
	})
}

// TestServerErrorsRetried: 5xx answers are retried with backoff.
func TestServerErrorsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{prepare: func(f *fakeAPI, _ *memTransport) {
			f.fail(fault{Method: "sendMessage", Chat: alice, Times: 3, Status: 502, Desc: "502"})
		}})
		h.say(alice, "/steps say:Hello")
		h.advance(10 * time.Second)
		wantLines(t, "sendMessage calls", callLines(h.api.callsTo("sendMessage", alice)), []string{
			"0s sendMessage !502",
			"1s sendMessage !502", // backoff 0.5s, then the chat's 1 s spacing
			"2s sendMessage !502",
			"4s sendMessage #1 Hello", // backoff 2s
		})
		if got := h.outbox.states(); strings.Join(got, ",") != "final:delivered" {
			t.Errorf("outbox = %v", got)
		}
	})
}

// TestNetworkErrorsRetried: network failures are retried too, and the
// token in the failing URL never reaches the logs.
func TestNetworkErrorsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tr *memTransport
		failures := 0
		h := newHarness(t, setup{prepare: func(_ *fakeAPI, m *memTransport) { tr = m }})
		tr.setFail(func(r *http.Request) error {
			if strings.HasSuffix(r.URL.Path, "/sendMessage") && failures < 2 {
				failures++
				return fmt.Errorf("%w while posting to %s", errNetwork, r.URL)
			}
			return nil
		})
		h.say(alice, "/steps say:Hello")
		h.advance(10 * time.Second)
		h.wantScreen(alice, "Hello")
		if !strings.Contains(h.logs.String(), "send failed; retrying") {
			t.Errorf("retries not logged:\n%s", h.logs.String())
		}
	})
}

// TestFinalNotDelivered: when every attempt fails the final reply is
// recorded in the outbox (attempt counted, still pending) and logged with
// the chat id; the next outbox sweep delivers it once Telegram is back.
func TestFinalNotDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{prepare: func(f *fakeAPI, _ *memTransport) {
			f.fail(fault{Method: "sendMessage", Chat: alice, Times: maxAttempts, Status: 503, Desc: "503"})
		}})
		h.say(alice, "/steps say:Hello")
		h.advance(time.Minute)
		h.wantScreen(alice)
		if got := h.outbox.states(); strings.Join(got, ",") != "final:pending" {
			t.Errorf("outbox = %v, want the final pending", got)
		}
		logs := h.logs.String()
		if !strings.Contains(logs, `msg="telegram: message not delivered" channel=telegram chat=1001`) {
			t.Errorf("failure not logged with the chat id:\n%s", logs)
		}
		h.outbox.mu.Lock()
		attempts := h.outbox.rows[1].m.Attempts
		h.outbox.mu.Unlock()
		if attempts != 1 {
			t.Errorf("attempts = %d, want 1", attempts)
		}
		h.advance(resendInterval)
		h.wantScreen(alice, "Hello")
		if got := h.outbox.states(); strings.Join(got, ",") != "final:delivered" {
			t.Errorf("outbox after the sweep = %v", got)
		}
	})
}

// TestFinalRefused: a permanent refusal (the user blocked the bot) marks
// the outbox message failed at once.
func TestFinalRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{prepare: func(f *fakeAPI, _ *memTransport) {
			f.fail(fault{Method: "sendMessage", Chat: alice, Times: 10, Code: 403, Desc: "Forbidden: bot was blocked by the user"})
		}})
		h.say(alice, "/steps say:Hello")
		h.advance(time.Minute)
		if got := callLines(h.api.callsTo("sendMessage", alice)); len(got) != 1 {
			t.Errorf("a refused message was retried:\n%s", strings.Join(got, "\n"))
		}
		if got := h.outbox.states(); strings.Join(got, ",") != "final:failed" {
			t.Errorf("outbox = %v, want the final failed", got)
		}
		if !strings.Contains(h.logs.String(), "chat=1001") {
			t.Errorf("failure not logged with the chat id")
		}
	})
}

// TestGlobalRateAndFlood: 50 chats write at once. Everyone gets their
// answers, no chat gets two messages within a second, and no second sees
// more than 30 calls to chats.
func TestGlobalRateAndFlood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		const n = 50
		for i := range int64(n) {
			h.api.say(2000+i, "/status")
			h.api.say(2000+i, fmt.Sprintf("/steps say:hi_%d", i))
		}
		synctest.Wait()
		h.advance(30 * time.Second)
		for i := range int64(n) {
			h.wantScreen(2000+i, textIdle, fmt.Sprintf("hi %d", i))
		}
		calls := h.api.allCalls()
		var chatCalls []apiCall
		for _, c := range calls {
			if c.Chat != 0 {
				chatCalls = append(chatCalls, c)
			}
		}
		for i, c := range chatCalls {
			inWindow := 0
			for _, d := range chatCalls[i:] {
				if d.At-c.At < time.Second {
					inWindow++
				}
			}
			if inWindow > globalPerSecond {
				t.Fatalf("%d calls in the second from %v", inWindow, c.At)
			}
		}
		last := map[int64]time.Duration{}
		for _, c := range chatCalls {
			if c.Method != "sendMessage" {
				continue
			}
			if prev, ok := last[c.Chat]; ok && c.At-prev < time.Second {
				t.Errorf("chat %d got messages at %v and %v", c.Chat, prev, c.At)
			}
			last[c.Chat] = c.At
		}
	})
}

// TestOrderPerChat: a chat's messages are handled in the order sent, even
// when they arrive in one batch; several chats at once each keep theirs.
func TestOrderPerChat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{}) // busy mode queue: "second" is queued, /stop drops it
		chats := []int64{alice, bob, 1003}
		for _, id := range chats {
			for _, text := range []string{"/status", "/steps pause:hang", "second", "/stop", "/help"} {
				h.api.say(id, text)
			}
		}
		synctest.Wait()
		h.advance(10 * time.Second)
		help := helpText(h.src.Current())
		for _, id := range chats {
			h.wantScreen(id, textIdle, conv.AckText(gateway.Ack{Status: gateway.StatusQueued}), "⏹️ Stopped after 0 s.",
				"🗑️ 1 queued message was dropped.", help)
		}
	})
}

// TestBudgetWarningOnceBeforeTheStop: at budgetWarningRatio (the default
// 0.8) of the wall clock the person gets one message saying when the turn
// will be stopped — a message of its own, before the stop notice; a runner
// that takes the gateway's note (the demo) wraps up and finishes in time.
func TestBudgetWarningOnceBeforeTheStop(t *testing.T) {
	cases := []struct {
		name   string
		ratio  *float64
		script string
		want   []string
	}{
		{
			name:   "stopped at the wall clock",
			script: "/steps shell:hang",
			want: []string{
				"1m20s sendMessage #1 ⏳ Your request will be stopped in 20 s unless it finishes.",
				"1m40s sendMessage #2 ⚠️ This request was stopped at its time limit of 1 min 40 s while shell was running. Try again, or ask for something smaller.",
			},
		},
		{
			name:   "the runner wraps up",
			script: "/steps build:90s deploy:hang say:Built",
			want: []string{
				"1m20s sendMessage #1 ⏳ Your request will be stopped in 20 s unless it finishes.",
				"1m30s sendMessage #2 🧭 Note from the gateway: 20 s left before this turn is stopped. Wrap up now: start no new long task and give your best answer with what you have. Built",
			},
		},
		{
			name:   "ratio 0: no warning",
			ratio:  secs(0),
			script: "/steps shell:hang",
			want: []string{
				"1m40s sendMessage #1 ⚠️ This request was stopped at its time limit of 1 min 40 s while shell was running. Try again, or ask for something smaller.",
			},
		},
		{
			name:   "a turn that finishes first is not warned",
			script: "/steps build:70s say:Built",
			want:   []string{"1m10s sendMessage #1 Built"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, setup{adjust: func(c *config.Config) {
					c.Channels.Telegram.Timeouts.TimeoutSeconds = secs(100)
					c.Channels.Telegram.Timeouts.ProgressNotifyAfterSeconds = secs(0)
					c.Channels.Telegram.Timeouts.BudgetWarningRatio = tc.ratio
				}})
				h.say(alice, tc.script)
				h.advance(3 * time.Minute)
				wantLines(t, "messages", callLines(h.api.allCalls(), "sendMessage", "editMessageText"), tc.want)
			})
		})
	}
}
