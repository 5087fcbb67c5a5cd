package telegram

// Drafts (channels.telegram.streaming) with the real client library
// against internal/fakebot, which enforces Telegram's draft rules. These
// run in real time: the gateway and the fake talk over loopback HTTP.

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/internal/fakebot"
	"github.com/turnguard/turnguard/runner"
	"github.com/turnguard/turnguard/runner/demo"
)

// within bounds every wait for the gateway in these tests.
const draftWithin = 20 * time.Second

// draftRig is a channel with a real engine and the demo runner, polling
// internal/fakebot.
type draftRig struct {
	t    *testing.T
	bot  *fakebot.Bot
	eng  *gateway.Engine
	logs *syncBuffer

	mu      sync.Mutex
	ending  map[string]event.Event // each run's Finished or Aborted
	started []time.Time            // when each turn started
}

// newDraftRig starts the channel; adjust changes the configuration (the
// "⏳ Still working" notice comes after 0.5 s).
func newDraftRig(t *testing.T, adjust func(*config.Config)) *draftRig {
	t.Helper()
	r := &draftRig{t: t, bot: fakebot.New(t), logs: &syncBuffer{}, ending: map[string]event.Event{}}
	c := config.Default()
	tg := &c.Channels.Telegram
	tg.Enabled, tg.Token, tg.APIURL = true, fakebot.Token, r.bot.URL()
	notify := 0.5
	tg.Timeouts.ProgressNotifyAfterSeconds = &notify
	if adjust != nil {
		adjust(c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	src := config.NewSource(c)
	log := slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	dm := demo.New()
	eng, err := gateway.New(gateway.Options{Config: src, Runners: map[string]runner.Runner{"demo": dm}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	eng.Start(context.Background())
	r.eng = eng
	unsub := eng.Bus().Subscribe("", func(ev event.Event) {
		r.mu.Lock()
		defer r.mu.Unlock()
		switch {
		case ev.Kind.Terminal():
			r.ending[ev.RunID] = ev
		case ev.Kind == event.TurnStarted:
			r.started = append(r.started, time.Now())
		}
	})
	ch, err := New(eng, src, Options{Log: log, PollTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- ch.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-ran:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(draftWithin):
			t.Error("Run did not return after its context ended")
		}
		dm.Release()
		eng.Shutdown(context.Background())
		cctx, ccancel := context.WithTimeout(context.Background(), draftWithin)
		defer ccancel()
		if err := ch.Close(cctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		unsub()
		if t.Failed() {
			t.Logf("gateway log:\n%s", r.logs.String())
		}
	})
	return r
}

// endings returns the Finished and Aborted events seen so far.
func (r *draftRig) endings() map[string]event.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]event.Event, len(r.ending))
	for k, v := range r.ending {
		out[k] = v
	}
	return out
}

// sentIn returns the texts of the real messages that reached chat.
func (r *draftRig) sentIn(chat int64) []string {
	var out []string
	for _, m := range r.bot.Messages() {
		if m.Method == "sendMessage" && m.OK && m.ChatID == fmt.Sprint(chat) {
			out = append(out, m.Text)
		}
	}
	return out
}

// draftShowing waits for a draft whose text contains s.
func (r *draftRig) draftShowing(s string) fakebot.Draft {
	r.t.Helper()
	return r.bot.WaitDraft(draftWithin, "showing "+s, func(d fakebot.Draft) bool { return strings.Contains(d.Text, s) })
}

// sent waits for a real message containing s.
func (r *draftRig) sent(s string) string {
	r.t.Helper()
	return r.bot.WaitSent(draftWithin, "containing "+s, func(t string) bool { return strings.Contains(t, s) })
}

// noOpenDrafts checks that every draft was followed by a real message: a
// draft is only a preview.
func (r *draftRig) noOpenDrafts() {
	r.t.Helper()
	for _, d := range r.bot.Drafts() {
		if !d.Followed {
			r.t.Errorf("draft %d (%q) was never followed by a real message:%s", d.DraftID, d.Text, r.bot)
		}
	}
}

// TestStreamingModes: how a turn is shown in each mode. In draft mode a
// private chat sees Telegram's "Thinking…" (an empty draft), then the reply
// as it streams and the "⏳ Still working" notice as the draft's live
// status, with the Stop button, paced like messages; the reply is a real
// message after it. A group falls back to edited messages, as edit mode
// does everywhere; streaming off shows nothing live.
func TestStreamingModes(t *testing.T) {
	// The notice comes after a step has run 1 s: web_search runs less
	// (the draft stays Thinking… until the text), build more.
	const script = "/steps web_search:900ms say:Working_on_it build:2500ms say:All_done"
	cases := []struct {
		name       string
		streaming  string
		chat       int64
		wantDrafts bool // the notice is in a draft
		wantNotice bool // the notice is a message
	}{
		{"draft in a private chat", config.TelegramStreamDraft, fakebot.Chat, true, false},
		{"draft falls back to edit in a group", config.TelegramStreamDraft, fakebot.Group, false, true},
		{"edit", config.TelegramStreamEdit, fakebot.Chat, false, true},
		{"off", config.TelegramStreamOff, fakebot.Chat, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newDraftRig(t, func(c *config.Config) {
				c.Channels.Telegram.Streaming, c.Channels.Telegram.Timeouts.ProgressNotifyAfterSeconds = tc.streaming, secs(1)
			})
			text := script
			if tc.chat < 0 {
				text = "@" + fakebot.Username + " " + script
			}
			r.bot.SayIn(tc.chat, text)
			r.sent("All done")
			r.noOpenDrafts()

			drafts := r.bot.Drafts()
			if !tc.wantDrafts {
				if len(drafts) != 0 {
					t.Errorf("drafts were shown: %+v", drafts)
				}
			} else {
				if len(drafts) != 1 {
					t.Fatalf("drafts %+v, want one for the turn", drafts)
				}
				d := drafts[0]
				if d.Texts[0] != "" || !d.CanStop {
					t.Errorf("the draft did not open as Telegram's Thinking… with a Stop button: %+v", d)
				}
				streamed := slices.IndexFunc(d.Texts, func(s string) bool { return strings.Contains(s, "Working on it") })
				notice := slices.IndexFunc(d.Texts, func(s string) bool {
					return strings.Contains(s, "Working on it") && strings.Contains(s, "⏳ Still working — build has been running for")
				})
				if streamed < 0 || notice < streamed {
					t.Errorf("the draft did not show the reply as it streamed, then the notice below it: %q", d.Texts)
				}
				if n := r.bot.MaxInWindow(fakebot.Chat, time.Second); n > 2 {
					t.Errorf("%d calls to the chat within a second: drafts are not paced:%s", n, r.bot)
				}
			}
			sent := r.sentIn(tc.chat)
			noticeSent := slices.ContainsFunc(sent, func(s string) bool { return strings.HasPrefix(s, "⏳ Still working") })
			if noticeSent != tc.wantNotice {
				t.Errorf("a ⏳ Still working message was sent: %v, want %v; sent %q", noticeSent, tc.wantNotice, sent)
			}
			if n := r.bot.Count("All done"); n != 1 {
				t.Errorf("the reply reached the chat %d times, want once: %q", n, sent)
			}
		})
	}
}

var digits = regexp.MustCompile(`[0-9]+`)

// TestDraftStopTapIsStop: a tap on the draft's Stop button stops the turn
// exactly as /stop does: stop reason user, the queued message dropped, the
// same words (the partial reply, the stop notice, what was dropped), which
// follow the draft.
func TestDraftStopTapIsStop(t *testing.T) {
	var words [2][]string
	for i, tap := range []bool{true, false} {
		name := map[bool]string{true: "tap", false: "/stop"}[tap]
		t.Run(name, func(t *testing.T) {
			r := newDraftRig(t, nil)
			r.bot.Say("/steps say:Half_way shell:hang")
			d := r.draftShowing("Half way")
			r.bot.Say("/steps say:Queued_turn_ran")
			r.sent("📥")
			if tap {
				r.bot.TapStop(d.DraftID)
			} else {
				r.bot.Say("/stop")
			}
			r.sent("🗑️")
			r.noOpenDrafts()
			var runs []string
			for id, ev := range r.endings() {
				runs = append(runs, id)
				if ev.Kind != event.Aborted || ev.StopReason != event.ReasonUser {
					t.Errorf("run %s ended %s (%s), want aborted with reason user", id, ev.Kind, ev.StopReason)
				}
			}
			if len(runs) != 1 {
				t.Errorf("runs that ended: %q, want the stopped one only (the queued one was dropped)", runs)
			}
			for _, s := range r.sentIn(fakebot.Chat) {
				words[i] = append(words[i], digits.ReplaceAllString(s, "N"))
			}
		})
	}
	if strings.Join(words[0], "\n") != strings.Join(words[1], "\n") {
		t.Errorf("a Stop tap says\n  %q\n/stop says\n  %q", words[0], words[1])
	}
	if !slices.ContainsFunc(words[0], func(s string) bool { return strings.HasPrefix(s, "⏹️ Stopped while shell was running") }) {
		t.Errorf("no stop notice: %q", words[0])
	}
}

// TestDraftStopTapRacesTheReply: a Stop tap that comes as the turn ends
// either stops it or comes too late — one ending either way, the reply or
// the partial reply and the stop notice, each once, no draft left open —
// and a tap on the draft of a turn that has ended does not stop the turn
// that runs after it.
func TestDraftStopTapRacesTheReply(t *testing.T) {
	t.Run("late tap", func(t *testing.T) {
		r := newDraftRig(t, nil)
		r.bot.Say("/steps say:First shell:1500ms say:done")
		first := r.draftShowing("First")
		r.bot.Say("/steps shell:4s say:Second_done")
		r.sent("First done")
		r.bot.TapStop(first.DraftID)
		r.bot.WaitDraft(draftWithin, "of the second turn", func(d fakebot.Draft) bool {
			return d.DraftID != first.DraftID && strings.Contains(d.Text, "Still working — shell")
		})
		r.sent("Second done")
		if slices.ContainsFunc(r.sentIn(fakebot.Chat), func(s string) bool { return strings.Contains(s, "Stopped") }) {
			t.Errorf("the late tap stopped something: %q", r.sentIn(fakebot.Chat))
		}
		if d := r.bot.Drafts(); len(d) != 2 || d[0].DraftID == d[1].DraftID {
			t.Errorf("drafts %+v, want one per turn, each its own id:%s", d, r.bot)
		}
		r.noOpenDrafts()
	})
	// The turn's shell step ends 1.5 s after it started: taps aimed
	// around that moment.
	for _, after := range []time.Duration{1400 * time.Millisecond, 1500 * time.Millisecond, 1600 * time.Millisecond} {
		t.Run(fmt.Sprint("tap ", after, " after the start"), func(t *testing.T) {
			r := newDraftRig(t, nil)
			r.bot.Say("/steps say:Racing shell:1500ms say:finished")
			d := r.draftShowing("Racing")
			r.mu.Lock()
			start := r.started[0]
			r.mu.Unlock()
			time.Sleep(time.Until(start.Add(after))) // real time: aiming the tap at the turn's end
			r.bot.TapStop(d.DraftID)
			r.bot.WaitSent(draftWithin, "an ending", func(s string) bool {
				return strings.Contains(s, "Racing finished") || strings.HasPrefix(s, "⏹️ Stopped")
			})
			r.bot.Say("/steps say:Still_here")
			r.sent("Still here")
			sent := r.sentIn(fakebot.Chat)
			finished, stopped := r.bot.Count("Racing finished"), r.bot.Count("⏹️ Stopped")
			switch {
			case finished == 1 && stopped == 0:
				t.Log("the tap came too late: the turn finished")
			case finished == 0 && stopped == 1 && r.bot.Count("Racing") == 1:
				t.Log("the tap stopped the turn")
			default:
				t.Errorf("want one ending (the reply, or the partial reply and the stop notice), got %q", sent)
			}
			if n := len(r.endings()); n != 2 {
				t.Errorf("%d runs ended, want 2", n)
			}
			r.noOpenDrafts()
		})
	}
}
