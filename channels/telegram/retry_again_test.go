package telegram

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
)

// TestRetryTappedAgainLaterIsAnswered: a Retry button is used once. Tapped
// again after its retried turn ended (and past the idempotency window,
// server.idempotencyTTLSeconds, 300 s) it is refused in words and starts
// nothing (a replayed token); the retried turn's own notice carries a
// button of its own, which starts a turn again under a run id of its own,
// whose ending reaches the chat.
func TestRetryTappedAgainLaterIsAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := setup{adjust: func(c *config.Config) { c.Channels.Telegram.Timeouts.StepTimeoutSeconds = secs(100) }}
		s.store = openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))
		h := newHarness(t, s)
		var st started
		defer h.eng.Bus().Subscribe("", st.handle)()

		h.say(alice, "/steps fetch:1s shell:hang")
		h.advance(2 * time.Minute)
		noticeID := h.api.lastMsgID(alice)
		data := h.api.button(alice, noticeID)
		h.api.tap(alice, alice, noticeID, data)
		synctest.Wait()
		h.advance(2 * time.Minute) // the retried turn times out too: 2nd notice
		n2 := len(h.screen(alice))
		notice2 := h.api.lastMsgID(alice)
		data2 := h.api.button(alice, notice2)
		h.advance(10 * time.Minute)             // past the idempotency TTL
		h.api.tap(alice, alice, noticeID, data) // the same, first button again: used
		synctest.Wait()
		h.advance(time.Minute)
		if got := st.list(); len(got) != 2 {
			t.Fatalf("the first button tapped again started a turn: %q", got)
		}
		if answers := callbackAnswers(h); answers[len(answers)-1] != textRetryUsed {
			t.Fatalf("the first button tapped again answered %q, want %q", answers, textRetryUsed)
		}
		if data2 == "" || data2 == data {
			t.Fatalf("the retried turn's notice has button %q (the first: %q), want one of its own", data2, data)
		}
		h.api.tap(alice, alice, notice2, data2)
		synctest.Wait()
		h.advance(2 * time.Minute)
		h.advance(30 * time.Second)
		t.Logf("turns started: %q", st.list())
		scr := h.screen(alice)
		runs := map[string]bool{}
		for _, s := range st.list() {
			id, _, _ := strings.Cut(s, " ")
			runs[id] = true
		}
		if len(st.list()) != 3 || len(runs) != 3 {
			t.Fatalf("turns started = %q, want 3 with distinct run ids", st.list())
		}
		if len(scr) <= n2 || !strings.HasPrefix(scr[len(scr)-1], "⚠️ No progress") {
			t.Fatalf("the third turn's notice never reached the chat:\n%s\nlogs:\n%s", quoteAll(scr), h.logs.String())
		}
	})
}

// TestRetryTapWhileQueuedThenDropped: a Retry tapped while another request
// runs is queued; tapping it again then starts nothing and says so; once
// /stop drops the queue, the button works again (no tap is stuck as
// "already running").
func TestRetryTapWhileQueuedThenDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{adjust: func(c *config.Config) { c.Channels.Telegram.Timeouts.StepTimeoutSeconds = secs(100) }})
		var st started
		defer h.eng.Bus().Subscribe("", st.handle)()
		h.say(alice, "/steps fetch:1s shell:hang")
		h.advance(2 * time.Minute)
		noticeID := h.api.lastMsgID(alice)
		data := h.api.button(alice, noticeID)
		h.say(alice, "/steps fetch:30s")
		h.advance(time.Second)
		for range 2 {
			h.api.tap(alice, alice, noticeID, data)
			synctest.Wait()
		}
		h.say(alice, "/stop")
		h.advance(5 * time.Second)
		h.api.tap(alice, alice, noticeID, data)
		synctest.Wait()
		if answers, want := callbackAnswers(h), []string{textRetrying, textRetryRunning, textRetrying}; !slices.Equal(answers, want) {
			t.Errorf("taps answered %q, want %q", answers, want)
		}
		if got := st.list(); len(got) != 3 {
			t.Errorf("turns started = %q, want the first, the second and the retry after /stop", got)
		}
	})
}

// callbackAnswers are the texts the taps so far were answered with, in
// order.
func callbackAnswers(h *harness) []string {
	var answers []string
	for _, c := range h.api.callsTo("answerCallbackQuery", 0) {
		answers = append(answers, c.Text)
	}
	return answers
}
