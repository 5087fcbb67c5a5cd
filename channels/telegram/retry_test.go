package telegram

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/store"
)

// lastMsgID is the id of the newest message the bot sent to chatID.
func (f *fakeAPI) lastMsgID(chatID int64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	ms := f.msgs[chatID]
	if len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].id
}

// tapOld is like tap, under a message Telegram no longer shows in full
// (older than 48 hours): the update carries only its chat and id.
func (f *fakeAPI) tapOld(chatID, from int64, msgID int, data string) {
	f.mu.Lock()
	id := fmt.Sprintf("cbq-%d", f.nextUpdate+1)
	f.mu.Unlock()
	f.push(models.Update{CallbackQuery: &models.CallbackQuery{
		ID: id, From: models.User{ID: from, FirstName: "User"}, Data: data, ChatInstance: "ci",
		Message: models.MaybeInaccessibleMessage{Type: models.MaybeInaccessibleMessageTypeInaccessibleMessage,
			InaccessibleMessage: &models.InaccessibleMessage{Chat: models.Chat{ID: chatID, Type: models.ChatTypePrivate}, MessageID: msgID}},
	}})
}

// started collects the engine's TurnStarted events: "run text".
type started struct {
	mu  sync.Mutex
	got []string
}

func (s *started) handle(ev event.Event) {
	if ev.Kind == event.TurnStarted {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.got = append(s.got, ev.RunID+" "+ev.Text)
	}
}

func (s *started) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// TestRetryButtonResendsOriginal: a turn that times out ends with a notice
// carrying a Retry button; tapping it answers the tap and sends the
// original message again as a new turn (which the user then sees run); a
// second tap of the same button starts nothing more; a tap in another
// chat is refused; a reply and a /stop notice carry no button. With the
// store writing the endings (durable), the notice claimed from the outbox
// carries the button too.
func TestRetryButtonResendsOriginal(t *testing.T) {
	for _, durable := range []bool{false, true} {
		name := "in memory"
		if durable {
			name = "durable"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := setup{adjust: func(c *config.Config) { c.Channels.Telegram.Timeouts.StepTimeoutSeconds = secs(100) }}
				if durable {
					s.store = openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))
				}
				h := newHarness(t, s)
				var st started
				defer h.eng.Bus().Subscribe("", st.handle)()

				const original = "/steps fetch:1s shell:hang"
				h.say(alice, original)
				h.advance(2 * time.Minute)
				notice := h.last(alice)
				if !strings.HasPrefix(notice, "⚠️ No progress for 1 min 40 s") {
					t.Fatalf("last message = %q, want the step timeout notice", notice)
				}
				noticeID := h.api.lastMsgID(alice)
				first := st.list()
				if len(first) != 1 {
					t.Fatalf("turns started = %q", first)
				}
				firstRun, _, _ := strings.Cut(first[0], " ")
				data := h.api.button(alice, noticeID)
				if !strings.HasPrefix(data, retryPrefix) || len(data) > maxCallbackData || strings.Contains(data, firstRun) {
					t.Fatalf("button under the notice = %q, want a token (%s…, at most %d bytes, not the run id %s)",
						data, retryPrefix, maxCallbackData, firstRun)
				}

				// Tapped in another chat: refused, nothing starts.
				h.api.tap(bob, bob, 1, data)
				synctest.Wait()
				// Tapped in its chat: answered, and the original message runs again.
				h.api.tap(alice, alice, noticeID, data)
				synctest.Wait()
				h.api.tap(alice, alice, noticeID, data) // a second tap while it runs: nothing more, said so
				synctest.Wait()
				var answers []string
				for _, c := range h.api.callsTo("answerCallbackQuery", 0) {
					answers = append(answers, c.Text)
				}
				if want := []string{textRetryElsewere, textRetrying, textRetryRunning}; !slices.Equal(answers, want) {
					t.Errorf("taps answered %q, want %q", answers, want)
				}
				got := st.list()
				if len(got) != 2 || !strings.HasSuffix(got[1], " "+original) || got[1] == first[0] {
					t.Fatalf("turns started = %q, want a second turn with %q", got, original)
				}
				h.advance(2 * time.Minute)
				if last := h.last(alice); last != notice {
					t.Errorf("after the retry the chat ends with %q, want the retried turn's notice %q", last, notice)
				}

				// No button under a reply or under the person's own /stop.
				h.say(alice, "/steps say:Hello")
				h.advance(5 * time.Second)
				if b := h.api.button(alice, h.api.lastMsgID(alice)); h.last(alice) != "Hello" || b != "" {
					t.Errorf("reply %q has button %q, want Hello without", h.last(alice), b)
				}
				h.say(alice, "/steps shell:hang")
				h.advance(time.Second)
				h.say(alice, "/stop")
				h.advance(5 * time.Second)
				if b := h.api.button(alice, h.api.lastMsgID(alice)); !strings.HasPrefix(h.last(alice), "⏹️ Stopped") || b != "" {
					t.Errorf("stop notice %q has button %q, want none", h.last(alice), b)
				}
			})
		})
	}
}

// TestRetryAfterRestart: the "interrupted" notice of a turn cut off by a
// restart (queued by the start-up recovery) carries Retry, and tapping it —
// even once the notice is too old for Telegram to send it in full — sends
// the message the store recorded for that turn: the channel never saw it in
// this process.
func TestRetryAfterRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		path := filepath.Join(t.TempDir(), "turnguard.db")
		st := openStore(t, path)
		const run, original = "tg-1001-7", "/steps say:Recovered"
		st.st.Handle(event.Event{Kind: event.TurnStarted, RunID: run, SessionKey: SessionKey(alice), Channel: "telegram",
			ChatRef: "1001", Text: original, Time: time.Now()})
		if err := st.st.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		// What cmd/gateway's recovery does at the next start.
		const notice = "⚠️ Your request was interrupted by a server problem. Please send it again."
		if _, err := st.st.Enqueue(ctx, store.OutboxMessage{Channel: "telegram", ChatRef: "1001", RunID: run,
			Kind: store.OutboxNotice, Text: notice}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.st.MarkInterrupted(ctx, run, notice); err != nil {
			t.Fatal(err)
		}

		h := newHarness(t, setup{store: st})
		h.advance(time.Second)
		h.wantScreen(alice, notice)
		id := h.api.lastMsgID(alice)
		b := h.api.button(alice, id)
		if !strings.HasPrefix(b, retryPrefix) {
			t.Fatalf("button under the interrupted notice = %q, want a Retry token", b)
		}
		h.api.tapOld(alice, alice, id, b) // tapped days later
		synctest.Wait()
		h.advance(5 * time.Second)
		h.wantScreen(alice, notice, "Recovered")
	})
}

// TestRecentRunsBounded: the channel remembers the text of a running or
// retryable turn, forgets one that ended as wanted, and keeps at most
// maxRecentRuns (the oldest go first; a Retry then asks the store).
func TestRecentRunsBounded(t *testing.T) {
	var r recentRuns
	start := func(id string) { r.note(event.Event{Kind: event.TurnStarted, RunID: id, Text: "q " + id}, alice) }
	end := func(id string, reason event.StopReason) {
		r.note(event.Event{Kind: event.Aborted, RunID: id, StopReason: reason}, alice)
	}
	start("timed-out")
	end("timed-out", event.ReasonTimeout)
	start("stopped")
	end("stopped", event.ReasonUser)
	start("running")
	if run, ok := r.get("timed-out"); !ok || run.text != "q timed-out" || run.reason != event.ReasonTimeout {
		t.Errorf("timed-out run = %+v, %v", run, ok)
	}
	if _, ok := r.get("stopped"); ok {
		t.Error("a turn the person stopped is still remembered")
	}
	if _, ok := r.get("running"); !ok {
		t.Error("the running turn is not remembered")
	}
	for i := range maxRecentRuns {
		start(fmt.Sprintf("r%d", i))
	}
	if _, ok := r.get("timed-out"); ok {
		t.Error("the oldest run is still remembered past maxRecentRuns")
	}
	if len(r.runs) > maxRecentRuns {
		t.Errorf("%d runs remembered, want at most %d", len(r.runs), maxRecentRuns)
	}
}
