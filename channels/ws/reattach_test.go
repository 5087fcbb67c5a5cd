package ws

import (
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/gateway"
	"github.com/turnguard/turnguard/timeout"

	"github.com/turnguard/turnguard/internal/faketime"
)

// TestHistoryReattachesToTheRunningTurn: a page reloaded while its turn
// runs (a new connection of the same browser) learns from chat.history the
// running turn — its step running for 39 s with the "still working" notice,
// the step completed before it — receives the turn's next events with the
// same tool ids, and its Stop ends the turn. Once idle, the history carries
// no turnguard block.
func TestHistoryReattachesToTheRunningTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const token = "web-token-71aa"
		e := newPipeEnv(t, envOpts{opts: Options{Token: token}, adjust: func(c *config.Config) {
			c.Agents.Defaults.ProgressNotifyAfterSeconds = secs(30)
			c.Agents.Defaults.ProgressRepeatSeconds = secs(600)
			c.Agents.Defaults.StepTimeoutSeconds = secs(300)
		}})
		key := deviceKey(7)
		first := e.connectSigned("webchat", key, token, nil)
		if r := first.call("chat.send", map[string]any{"sessionKey": "agent:main:web", "message": "/steps web_search:1s shell:hang",
			"idempotencyKey": "w1"}); !r.OK {
			t.Fatalf("chat.send %s", r.raw)
		}
		first.ws.Close() // the page is reloaded
		faketime.Advance(40 * time.Second)

		page := e.connectSigned("webchat", key, token, nil)
		page.wait = time.Minute
		h := page.call("chat.history", map[string]any{"sessionKey": "agent:main:web", "limit": 200})
		if !h.OK {
			t.Fatalf("chat.history %s", h.raw)
		}
		var res struct {
			Messages  []historyMessage `json:"messages"`
			Turnguard *reattachInfo    `json:"turnguard"`
		}
		if err := json.Unmarshal(h.Payload, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Messages) != 1 || res.Messages[0].Content[0].Text != "/steps web_search:1s shell:hang" {
			t.Fatalf("history %s, want the running turn's user message", h.raw)
		}
		if res.Turnguard == nil || res.Turnguard.ActiveRun == nil {
			t.Fatalf("chat.history of a session with a running turn has no turnguard.activeRun: %s", h.raw)
		}
		got := *res.Turnguard.ActiveRun
		want := activeRunView{
			RunID: "w1", StartedAt: got.StartedAt, ElapsedMs: 40000,
			CurrentStep: &stepView{ToolCallID: "w1:2", Name: "shell", Kind: "tool", StartedAt: got.StartedAt + 1000, ElapsedMs: 39000},
			LastStep:    &stepView{ToolCallID: "w1:1", Name: "web_search", Kind: "tool", StartedAt: got.StartedAt},
			Stalled:     true, ProgressText: "⏳ Still working — shell has been running for 39 s…",
		}
		if a, b := mustJSON(got), mustJSON(want); string(a) != string(b) {
			t.Fatalf("activeRun\n got %s\nwant %s", a, b)
		}
		if res.Turnguard.Queue != nil {
			t.Fatalf("queue %v, want none", res.Turnguard.Queue)
		}

		// Stop from the reloaded page ends the turn; the open step's result
		// carries the tool id the page drew from activeRun.
		id := page.request("chat.abort", map[string]any{"sessionKey": "agent:main:web"})
		ab := page.chat("w1", "aborted")
		if r := page.response(id); !r.OK || r.get("aborted") != true {
			t.Fatalf("Stop after reload: %s", r.raw)
		}
		if ab.str("stopReason") != "user" {
			t.Fatalf("aborted %s", ab.raw)
		}
		var closed bool
		for _, f := range page.all {
			if f.Event == "agent" && f.str("stream") == "tool" && f.str("data.phase") == "result" &&
				f.str("data.toolCallId") == got.CurrentStep.ToolCallID && f.get("data.isError") == true {
				closed = true
			}
		}
		if !closed {
			t.Fatalf("no tool result for %s after the stop:\n%s", got.CurrentStep.ToolCallID, page.dump())
		}
		e.waitIdle()
		if h := page.call("chat.history", map[string]any{"sessionKey": "agent:main:web"}); h.get("turnguard") != nil {
			t.Fatalf("idle session's history still has a turnguard block: %s", h.raw)
		}
	})
}

// TestReattachBlock: the block's shape for each state a turn can be in and
// its queue, within the answer's budget (queued texts are cut, never the
// block dropped).
func TestReattachBlock(t *testing.T) {
	e := newEngineEnv(t, envOpts{})
	t.Cleanup(func() { e.eng.Shutdown(t.Context()) })
	at := time.Date(2026, 11, 23, 22, 0, 0, 0, time.UTC)
	long := strings.Repeat("ü", 5000)
	cases := []struct {
		name     string
		st       gateway.TurnStatus
		budget   int
		want     string
		maxBytes int
	}{
		{name: "idle, nothing queued", st: gateway.TurnStatus{SessionKey: "k"}, want: "null"},
		{
			name: "stopping, an LLM call running (no tool id), paused (no notice)",
			st:   running("r", "aborted", at, event.Step{Kind: event.StepLLM, Seq: 3, StartedAt: at}, event.Step{}, true, true, nil),
			want: `{"activeRun":{"runId":"r","startedAt":` + ms13(at) + `,"elapsedMs":5000,"stopping":true,` +
				`"currentStep":{"name":"llm","kind":"llm","startedAt":` + ms13(at) + `,"elapsedMs":2000},"paused":true,"stalled":true}}`,
		},
		{
			name: "queued behind a running turn, a long text cut",
			st: running("r", "running", at, event.Step{}, event.Step{Kind: "tool", Name: "shell", Seq: 1, StartedAt: at}, false, false,
				[]gateway.QueuedMessage{{RunID: "q1", Text: "next please", QueuedAt: at}, {RunID: "q2", Text: long, QueuedAt: at}}),
			budget: 8000, maxBytes: 8000 / queueShare,
			want: `{"activeRun":{"runId":"r","startedAt":` + ms13(at) + `,"elapsedMs":5000,` +
				`"lastStep":{"toolCallId":"r:1","name":"shell","kind":"tool","startedAt":` + ms13(at) + `},"paused":false,"stalled":false},` +
				`"queue":[{"runId":"q1","turnRunId":"q1","busy":"queue","text":"next please","queuedAt":` + ms13(at) + `,"ahead":0},` +
				`{"runId":"q2","turnRunId":"q2","busy":"queue","text":"CUT","queuedAt":` + ms13(at) + `,"ahead":1}]}`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			budget := tc.budget
			if budget == 0 {
				budget = 1 << 20
			}
			info, used := e.srv.reattach(tc.st, budget)
			var cut string
			if info != nil && len(info.Queue) > 1 {
				cut = info.Queue[1].Text
				if !strings.HasSuffix(cut, "too long to show here]") || !strings.HasPrefix(cut, "üü") {
					t.Fatalf("long queued text not cut: %q…", cut[:min(len(cut), 40)])
				}
				info.Queue[1].Text = "CUT"
			}
			if got := string(mustJSON(info)); got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			if tc.maxBytes > 0 && (jsonLen(cut) > tc.maxBytes/2 || used > tc.budget/2) {
				t.Fatalf("block takes %d bytes (cut text %d) of a %d-byte answer", used, jsonLen(cut), tc.budget)
			}
		})
	}
}

// running is the status of a session whose turn id has run 5 s (its
// current step, if any, 2 s), with queue behind it.
func running(id, state string, start time.Time, cur, last event.Step, paused, stalled bool, queue []gateway.QueuedMessage) gateway.TurnStatus {
	st := gateway.TurnStatus{SessionKey: "k", Running: true, Limits: timeout.Defaults(), Queue: queue}
	s := &st.Turn
	s.RunID, s.State, s.StartedAt, s.Elapsed, s.CurrentStep, s.LastStep, s.Paused, s.Stalled =
		id, state, start, 5*time.Second, cur, last, paused, stalled
	if !cur.IsZero() {
		s.StepElapsed = 2 * time.Second
	}
	return st
}

func ms13(t time.Time) string { return string(mustJSON(t.UnixMilli())) }

// TestHistoryShowsTheQueue: messages queued behind a running turn (the
// default busy mode) are in chat.history's turnguard.queue, oldest first,
// with the run ids their turns will have — not among the history's
// messages until their turns start; when the running turn is stopped they
// run in order under those run ids, and then the block is gone.
func TestHistoryShowsTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{})
		c, _ := e.connect("webchat", "")
		send := func(id, text string) frame {
			t.Helper()
			r := c.call("chat.send", map[string]any{"sessionKey": "agent:main:web", "message": text, "idempotencyKey": id})
			if !r.OK {
				t.Fatalf("chat.send %s: %s", id, r.raw)
			}
			return r
		}
		send("w1", "/steps shell:hang")
		for i, id := range []string{"q1", "q2"} {
			if r := send(id, "/steps say:"+id); r.str("status") != "queued" || r.get("ahead") != float64(i) {
				t.Fatalf("chat.send %s while busy: %s, want queued with %d ahead", id, r.raw, i)
			}
		}
		faketime.Advance(time.Second)

		page, _ := e.connect("webchat", "")
		h := page.call("chat.history", map[string]any{"sessionKey": "agent:main:web"})
		var res struct {
			Messages  []historyMessage `json:"messages"`
			Turnguard *reattachInfo    `json:"turnguard"`
		}
		if err := json.Unmarshal(h.Payload, &res); err != nil || res.Turnguard == nil {
			t.Fatalf("chat.history %s: %v", h.raw, err)
		}
		if len(res.Messages) != 1 {
			t.Fatalf("history has %d messages, want only the running turn's: %s", len(res.Messages), h.raw)
		}
		q := res.Turnguard.Queue
		if len(q) != 2 || q[0].RunID != "q1" || q[0].Text != "/steps say:q1" || q[0].Ahead != 0 ||
			q[1].RunID != "q2" || q[1].Ahead != 1 || q[0].QueuedAt == 0 {
			t.Fatalf("queue %+v, want q1 then q2", q)
		}
		if a := res.Turnguard.ActiveRun; a == nil || a.RunID != "w1" {
			t.Fatalf("activeRun %+v, want w1", a)
		}

		// The first turn stopped: q1 then q2 run as themselves.
		c.call("chat.abort", map[string]any{"sessionKey": "agent:main:web", "runId": "w1"})
		page.until("q1's start", func(f frame) bool {
			return f.Event == "agent" && f.str("runId") == "q1" && f.str("data.phase") == "start"
		})
		page.chat("q1", "final")
		page.chat("q2", "final")
		e.waitIdle()
		if h := page.call("chat.history", map[string]any{"sessionKey": "agent:main:web"}); h.get("turnguard") != nil {
			t.Fatalf("all ran, yet the history has a turnguard block: %s", h.raw)
		}
	})
}

// TestHistoryWithAQueueFitsTheAnswerBudget: a session whose running turn
// (its message and its reply so far) and five queued messages are long
// still answers chat.history within server.maxAnswerBytes: the reply so far
// and the queued texts are cut (saying so) and the history keeps its newest
// messages.
func TestHistoryWithAQueueFitsTheAnswerBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const budget = 32 << 10
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) { c.Server.MaxAnswerBytes = budget }})
		c, _ := e.connect("webchat", "")
		long := strings.Repeat("ü\"", 4000)                                // 4,000 × 8 bytes once JSON-escaped: 32 KB
		first := "/steps say:" + strings.Repeat("ü", 5000) + " shell:hang" // a reply so far of 10 KB
		if r := c.call("chat.send", map[string]any{"sessionKey": "web", "message": first,
			"idempotencyKey": "run"}); !r.OK {
			t.Fatalf("chat.send %s", r.raw)
		}
		for i := range 5 {
			id := "q" + string(rune('1'+i))
			if r := c.call("chat.send", map[string]any{"sessionKey": "web", "message": long, "idempotencyKey": id}); r.str("status") != "queued" {
				t.Fatalf("chat.send %s: %s", id, r.raw)
			}
		}
		h := c.call("chat.history", map[string]any{"sessionKey": "web"})
		if !h.OK || len(h.Payload) > budget {
			t.Fatalf("chat.history answer: ok %v, %d payload bytes, budget %d", h.OK, len(h.Payload), budget)
		}
		var res struct {
			Messages  []historyMessage `json:"messages"`
			Turnguard *reattachInfo    `json:"turnguard"`
		}
		if err := json.Unmarshal(h.Payload, &res); err != nil || res.Turnguard == nil || res.Turnguard.ActiveRun == nil {
			t.Fatalf("chat.history %.300s: %v", h.raw, err)
		}
		if q := res.Turnguard.Queue; len(q) != 5 || !strings.HasSuffix(q[4].Text, "too long to show here]") {
			t.Fatalf("queue of %d, last %.80q…, want 5 cut texts", len(q), q[len(q)-1].Text)
		}
		if a := res.Turnguard.ActiveRun; !strings.HasPrefix(a.Text, "üü") || !strings.HasSuffix(a.Text, "too long to show here]") {
			t.Fatalf("reply so far %.80q…, want it cut", a.Text)
		}
		if len(res.Messages) == 0 || res.Messages[len(res.Messages)-1].Content[0].Text != first {
			t.Fatalf("history lost the running turn's message: %.300s", h.raw)
		}
	})
}

// TestHistoryReattachCarriesTheReplySoFar: a page reloaded while its turn
// works after streaming part of its reply gets that text with the running
// turn, not only at the next delta.
func TestHistoryReattachCarriesTheReplySoFar(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{})
		c, _ := e.connect("webchat", "")
		c.call("chat.send", map[string]any{"sessionKey": "web", "message": "/steps say:Half_way_there shell:hang", "idempotencyKey": "r"})
		faketime.Advance(time.Second)
		page, _ := e.connect("webchat", "")
		h := page.call("chat.history", map[string]any{"sessionKey": "web"})
		if got := h.str("turnguard.activeRun.text"); got != "Half way there" {
			t.Fatalf("activeRun.text %q, want the reply so far; %s", got, h.raw)
		}
	})
}

// TestHistoryQueueNamesTheTurnEachMessageRunsIn: a page reloaded while
// messages wait learns, for each, the run id of the turn it will be
// answered in (turnRunId), how it waits (busy) and how many turns are
// before that turn (ahead). In busy mode collect, the two messages sent
// while w1 runs are answered together in ONE follow-up turn, c1 (the first
// one's id; chat.send acked c2 with runId c1): both say turnRunId c1, ahead
// 0. In busy mode queue each is its own turn, the second one turn behind.
func TestHistoryQueueNamesTheTurnEachMessageRunsIn(t *testing.T) {
	type want struct {
		runID, turn, busy string
		ahead             int
	}
	for _, tc := range []struct {
		mode string
		want []want
	}{
		{config.BusyCollect, []want{{"c1", "c1", "collect", 0}, {"c2", "c1", "collect", 0}}},
		{config.BusyQueue, []want{{"c1", "c1", "queue", 0}, {"c2", "c2", "queue", 1}}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) { c.Agents.Defaults.Busy.Mode = tc.mode }})
				c, _ := e.connect("webchat", "")
				for _, m := range [][2]string{{"w1", "/steps shell:hang"}, {"c1", "/steps say:One"}, {"c2", "say:Two"}} {
					if r := c.call("chat.send", map[string]any{"sessionKey": "agent:main:web", "message": m[1], "idempotencyKey": m[0]}); !r.OK {
						t.Fatalf("chat.send %s: %s", m[0], r.raw)
					}
				}
				faketime.Advance(time.Second)
				page, _ := e.connect("webchat", "")
				h := page.call("chat.history", map[string]any{"sessionKey": "agent:main:web"})
				var res struct {
					Turnguard struct {
						Queue []struct {
							RunID     string `json:"runId"`
							TurnRunID string `json:"turnRunId"`
							Busy      string `json:"busy"`
							Ahead     int    `json:"ahead"`
						} `json:"queue"`
					} `json:"turnguard"`
				}
				if err := json.Unmarshal(h.Payload, &res); err != nil {
					t.Fatalf("chat.history %s: %v", h.raw, err)
				}
				var got []want
				for _, q := range res.Turnguard.Queue {
					got = append(got, want{q.RunID, q.TurnRunID, q.Busy, q.Ahead})
				}
				if len(got) != len(tc.want) || got[0] != tc.want[0] || got[1] != tc.want[1] {
					t.Fatalf("queue %+v, want %+v (%s)", got, tc.want, h.raw)
				}
				c.call("chat.abort", map[string]any{"sessionKey": "agent:main:web", "runId": "w1"})
				page.chat("c1", "final")
				e.waitIdle()
			})
		})
	}
}

// TestHistoryActiveRunCarriesItsOwnUserText: a page reloaded while a turn
// runs offers Retry for that turn with the turn's OWN message. A message
// steered into the turn later is the last user message of the history, but
// not what the turn was asked: activeRun.userText is the turn's message.
func TestHistoryActiveRunCarriesItsOwnUserText(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, envOpts{adjust: func(c *config.Config) { c.Agents.Defaults.Busy.Mode = config.BusySteer }})
		c, _ := e.connect("webchat", "")
		c.call("chat.send", map[string]any{"sessionKey": "agent:main:web", "message": "/steps shell:hang", "idempotencyKey": "w1"})
		faketime.Advance(time.Second)
		if r := c.call("chat.send", map[string]any{"sessionKey": "agent:main:web", "message": "also this", "idempotencyKey": "s1"}); !r.OK || r.str("status") != "steered" {
			t.Fatalf("steer %s", r.raw)
		}
		page, _ := e.connect("webchat", "")
		h := page.call("chat.history", map[string]any{"sessionKey": "agent:main:web"})
		var res struct {
			Messages  []json.RawMessage `json:"messages"`
			Turnguard struct {
				ActiveRun *struct {
					RunID    string `json:"runId"`
					UserText string `json:"userText"`
				} `json:"activeRun"`
			} `json:"turnguard"`
		}
		if err := json.Unmarshal(h.Payload, &res); err != nil || res.Turnguard.ActiveRun == nil {
			t.Fatalf("chat.history %s: %v", h.raw, err)
		}
		if last := string(res.Messages[len(res.Messages)-1]); !strings.Contains(last, "also this") {
			t.Fatalf("the steered message is not the history's last: %s", h.raw)
		}
		if a := res.Turnguard.ActiveRun; a.RunID != "w1" || a.UserText != "/steps shell:hang" {
			t.Fatalf("activeRun %+v, want w1 with its own text /steps shell:hang", *a)
		}
		c.call("chat.abort", map[string]any{"sessionKey": "agent:main:web", "runId": "w1"})
		e.waitIdle()
	})
}
