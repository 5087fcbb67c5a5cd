package main

// Crash-recovery process tests: the built binary is killed with SIGKILL in
// the middle of a turn and started again on the same store. They use the
// process helpers of process_test.go (startGateway, dialGateway, …).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/fakebot"
	"github.com/turnguard/turnguard/store"
	"github.com/turnguard/turnguard/store/storetest"
)

const crashOpToken = "crash-operator-token"

// crashConfig is a gateway with a token, an operator token (the test reads
// the operator API like an operator would) and its store in dir.
func crashConfig(dir string) string {
	return crashConfigStore(fmt.Sprintf("  path: %s\n", filepath.Join(dir, "gateway.db")))
}

// crashConfigStore is crashConfig with the given keys of the store section.
func crashConfigStore(storeKeys string) string {
	return fmt.Sprintf(`server:
  listen: 127.0.0.1:0
  token: %s
  operatorToken: %s
agents:
  defaults:
    abortGraceSeconds: 5
store:
%s`, testToken, crashOpToken, storeKeys)
}

// historyMessage is a chat.history entry.
type historyMessage struct {
	Role    string `json:"role"`
	Content []struct {
		Text string `json:"text"`
	} `json:"content"`
	StopReason string `json:"stopReason"`
}

// history returns the session's history as the protocol reports it.
func history(t *testing.T, cl *wsClient, session string) []historyMessage {
	t.Helper()
	res := cl.call("chat.history", map[string]any{"sessionKey": session, "limit": 100})
	if !res.OK {
		t.Fatalf("chat.history: %+v", res.Error)
	}
	var p struct{ Messages []historyMessage }
	if err := json.Unmarshal(res.Payload, &p); err != nil {
		t.Fatalf("chat.history payload %s: %v", res.Payload, err)
	}
	return p.Messages
}

// interruptedNotices returns the texts of the history entries that tell the
// user the gateway restarted.
func interruptedNotices(msgs []historyMessage) []string {
	var out []string
	for _, m := range msgs {
		if m.Role == "assistant" && m.StopReason == "interrupted" {
			for _, c := range m.Content {
				out = append(out, c.Text)
			}
		}
	}
	return out
}

// waitCurrentStep polls the store file until the running turn is recorded
// in step current, so that killing the process cannot race the
// asynchronous writer.
func waitCurrentStep(t *testing.T, path, runID, current string) {
	t.Helper()
	waitTurn(t, path, runID, "in step "+current, func(tr store.Turn) bool { return tr.CurrentStep.Name == current })
}

// waitTurn polls the store file (written by another process) until the turn
// runID satisfies ok, for at most 10 s.
func waitTurn(t *testing.T, path, runID, what string, ok func(store.Turn) bool) {
	t.Helper()
	storetest.WaitTurnFile(t, path, runID, what, ok)
}

// waitTurnIn polls st (written by another process) until the turn runID
// satisfies ok, for at most 10 s.
func waitTurnIn(t *testing.T, st store.Reader, runID, what string, ok func(store.Turn) bool) {
	t.Helper()
	storetest.WaitTurn(t, st, runID, what, ok)
}

// operatorGet GETs an operator API path with the operator token.
func operatorGet(t *testing.T, addr, path string, v any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+crashOpToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, res.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v\n%s", path, err, b)
	}
}

// startHanging starts the gateway on dir and a WebSocket turn run in
// session that hangs in step shell, and returns once the store file records
// it in that step (so a kill cannot race the asynchronous writer).
func startHanging(t *testing.T, dir, cfg, session, run string) (*gatewayProc, *wsClient) {
	t.Helper()
	p := startGateway(t, dir, cfg)
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, session, run, "/steps shell:hang")
	cl.waitEvent("agent", 10*time.Second, toolStarted(run, "shell"))
	waitCurrentStep(t, filepath.Join(dir, "gateway.db"), run, "shell")
	return p, cl
}

// TestCrashInterruptedNoticeOnce: a turn running `/steps shell:hang` when
// the process is killed (SIGKILL) is ended at the next start, before
// traffic is accepted, as interrupted; its WebSocket user — disconnected by
// the crash — finds exactly one interrupted notice naming the last action
// in chat.history; a further restart does not add another; the operator
// sees the episode in /api/stall-history.
func TestCrashInterruptedNoticeOnce(t *testing.T) {
	dir := t.TempDir()
	cfg := crashConfig(dir)
	db := filepath.Join(dir, "gateway.db")
	const run, session = "run-crash-once", "main"
	// The interrupted message (messages.interrupted), naming the step that
	// was running when the process died.
	const wantStart, wantEnd = "⚠️ Your request was interrupted by a server problem — last action was shell.", "Please send it again."

	p, _ := startHanging(t, dir, cfg, session, run)
	p.signal(syscall.SIGKILL)
	p.wait(5 * time.Second)

	for restart := 1; restart <= 2; restart++ {
		p := startGateway(t, dir, cfg)
		cl := dialGateway(t, p.addr, testToken)
		got := interruptedNotices(history(t, cl, session))
		if len(got) != 1 || !strings.HasPrefix(got[0], wantStart) || !strings.HasSuffix(got[0], wantEnd) {
			t.Fatalf("after restart %d the history holds the interrupted notices %q; want exactly one: %q…%q", restart, got, wantStart, wantEnd)
		}
		if n := strings.Count(p.log(), "turn interrupted by the last stop"); n != map[int]int{1: 1, 2: 0}[restart] {
			t.Errorf("restart %d logged %d interrupted turns", restart, n)
		}

		var sh struct {
			Episodes []struct{ RunID, Outcome, StopReason string }
		}
		operatorGet(t, p.addr, "/api/stall-history?run="+run, &sh)
		if len(sh.Episodes) != 1 || sh.Episodes[0].Outcome != "aborted" || sh.Episodes[0].StopReason != "interrupted" {
			t.Errorf("restart %d: stall history %+v, want one episode aborted with stop reason interrupted", restart, sh.Episodes)
		}
		var turns struct{ Count int }
		operatorGet(t, p.addr, "/api/turns", &turns)
		if turns.Count != 0 {
			t.Errorf("restart %d: %d live turns, want none", restart, turns.Count)
		}

		// The second cycle ends with another crash, the first with a clean stop.
		if restart == 1 {
			p.signal(syscall.SIGTERM)
			if code := p.wait(10 * time.Second); code != 0 {
				t.Fatalf("exit code %d", code)
			}
		} else {
			p.signal(syscall.SIGKILL)
			p.wait(5 * time.Second)
		}
	}

	// The store agrees: one turn, interrupted, and nothing for WebSocket in
	// the outbox (its users read the history).
	st, err := store.Open(context.Background(), db, store.Options{Unlocked: true}) // the last gateway may still run
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	turn, err := st.Turn(context.Background(), run)
	if err != nil || turn.State != store.TurnAborted || turn.StopReason != "interrupted" {
		t.Errorf("stored turn %+v, %v", turn, err)
	}
	if pending, err := st.Pending(context.Background(), "", 100); err != nil || len(pending) != 0 {
		t.Errorf("outbox pending %v, %v; want none", pending, err)
	}
}

// TestCrashMetricsAfterRestart: the operator side comes up with the
// recovered gateway: /metrics answers with the token and counts the
// restarted process from zero; the interrupted turn is not live.
func TestCrashMetricsAfterRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := crashConfig(dir)
	p, _ := startHanging(t, dir, cfg, "main", "run-m")
	p.signal(syscall.SIGKILL)
	p.wait(5 * time.Second)

	p2 := startGateway(t, dir, cfg)
	req, _ := http.NewRequest(http.MethodGet, "http://"+p2.addr+"/metrics", nil)
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/metrics without the token: %v %v", res, err)
	} else {
		res.Body.Close()
	}
	req.Header.Set("Authorization", "Bearer "+crashOpToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{"turnguard_active_turns 0", `turnguard_build_info{`, "turnguard_store_events_dropped_total 0",
		`turnguard_turns_by_class{class="stuck"} 0`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(string(b), testToken) || strings.Contains(string(b), crashOpToken) {
		t.Errorf("a token leaked into /metrics")
	}
	for _, tok := range []string{testToken, crashOpToken} {
		if strings.Contains(p.log()+p2.log(), tok) {
			t.Errorf("a token leaked into the log")
		}
	}
}

// --- Telegram -------------------------------------------------------------

// The fake Telegram Bot API is internal/fakebot (the cluster suite's too).
const (
	crashBotToken = fakebot.Token
	crashChat     = fakebot.Chat
)

// messagesOf returns the texts delivered to the test chat and those refused.
func messagesOf(bot *fakebot.Bot) (sent, failed []string) {
	for _, m := range bot.Messages() {
		switch {
		case m.Method != "sendMessage":
		case m.OK:
			sent = append(sent, m.Text)
		default:
			failed = append(failed, m.Text)
		}
	}
	return sent, failed
}

// waitSent waits until a delivered message contains text, and returns how
// many do.
func waitSent(bot *fakebot.Bot, text string, d time.Duration) int {
	bot.WaitSent(d, "a message containing "+strconv.Quote(text), func(s string) bool { return strings.Contains(s, text) })
	return bot.Count(text)
}

func countContaining(texts []string, s string) int {
	n := 0
	for _, t := range texts {
		if strings.Contains(t, s) {
			n++
		}
	}
	return n
}

func telegramConfig(dir string, bot *fakebot.Bot) string {
	return crashConfig(dir) + fmt.Sprintf(`channels:
  telegram:
    enabled: true
    token: %q
    apiURL: %s
    allowedChatIDs: [%d]
`, crashBotToken, bot.URL(), crashChat)
}

// waitOutbox polls the store file until cond holds for the outbox of runID
// (its rows, pending ones first), and returns them.
func waitOutbox(t *testing.T, path string, what string, cond func(pending []store.OutboxMessage, c store.OutboxCounts) bool) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, path, store.Options{Unlocked: true}) // the gateway holds the lock
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deadline := time.Now().Add(30 * time.Second)
	var pending []store.OutboxMessage
	var counts store.OutboxCounts
	for time.Now().Before(deadline) {
		pending, err = st.Pending(ctx, "", 100)
		if err == nil {
			counts, err = st.Counts(ctx)
		}
		if err == nil && cond(pending, counts) {
			return
		}
		time.Sleep(50 * time.Millisecond) // real time: polling another process's database
	}
	t.Fatalf("outbox never reached %s: pending %+v, counts %+v, err %v", what, pending, counts, err)
}

// scrape GETs /metrics with the operator token.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+crashOpToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

// TestCrashTelegramInterruptedNoticeOnce: the same crash for a Telegram
// user: after the restart the interrupted notice reaches the chat through
// the outbox, exactly once, and a further restart does not send it again.
func TestCrashTelegramInterruptedNoticeOnce(t *testing.T) {
	dir := t.TempDir()
	bot := fakebot.New(t)
	cfg := telegramConfig(dir, bot)
	db := filepath.Join(dir, "gateway.db")
	const notice = "Your request was interrupted by a server problem"

	p := startGateway(t, dir, cfg)
	msgID := bot.Say("/steps shell:hang")
	run := fmt.Sprintf("tg-%d-%d", crashChat, msgID)
	waitCurrentStep(t, db, run, "shell")
	p.signal(syscall.SIGKILL)
	p.wait(5 * time.Second)

	p2 := startGateway(t, dir, cfg)
	if n := waitSent(bot, notice, 30*time.Second); n != 1 {
		t.Fatalf("the interrupted notice reached the chat %d times", n)
	}
	for _, d := range bot.Drafts() {
		if !d.Followed { // a draft is a preview: the notice must follow the killed turn's
			t.Errorf("draft %d (%q) was not followed by a message:%s", d.DraftID, d.Text, bot)
		}
	}
	waitOutbox(t, db, "the notice delivered", func(pending []store.OutboxMessage, c store.OutboxCounts) bool {
		return len(pending) == 0 && c.Delivered == 1
	})
	if m := scrape(t, p2.addr); !strings.Contains(m, `turnguard_deliveries_total{channel="telegram",result="delivered"} 1`) ||
		!strings.Contains(m, `turnguard_telegram_api_calls_total{method="sendMessage",result="ok"}`) {
		t.Errorf("/metrics after the resend lacks the delivery:\n%s", grepLines(m, "turnguard_deliveries_total", "turnguard_telegram_api_calls_total"))
	}
	p2.signal(syscall.SIGTERM)
	if code := p2.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}

	// A third start: the notice is not sent again. A new message's reply
	// is sent after anything resent at start-up, so once it arrives the
	// count is final.
	startGateway(t, dir, cfg)
	bot.Say("/steps say:Still_here")
	waitSent(bot, "Still here", 30*time.Second)
	if sent, _ := messagesOf(bot); countContaining(sent, notice) != 1 {
		t.Errorf("after another restart the chat got the interrupted notice %d times: %q", countContaining(sent, notice), sent)
	}
	for _, l := range []string{p.log(), p2.log()} {
		if strings.Contains(l, "SECRET") {
			t.Errorf("the bot token is in the log")
		}
	}
}

// TestCrashTelegramFinalDeliveredAfterRestart: the final reply's delivery
// fails (the Bot API answers 500 to every try); the failure is recorded in
// the outbox; the gateway is killed; after the restart, with Telegram
// healthy again, the reply is delivered — once.
func TestCrashTelegramFinalDeliveredAfterRestart(t *testing.T) {
	dir := t.TempDir()
	bot := fakebot.New(t)
	cfg := telegramConfig(dir, bot)
	db := filepath.Join(dir, "gateway.db")
	const reply = "Here is the final reply"

	bot.SetFail(true)
	p := startGateway(t, dir, cfg)
	bot.Say("/steps web_search:50ms say:Here_is_the_final_reply")
	// The channel retries the send a few times, then records the failed
	// attempt; the message stays pending.
	waitOutbox(t, db, "a failed attempt recorded", func(pending []store.OutboxMessage, _ store.OutboxCounts) bool {
		return len(pending) == 1 && pending[0].Attempts >= 1 && strings.Contains(pending[0].Text, reply)
	})
	if sent, failed := messagesOf(bot); countContaining(sent, reply) != 0 || countContaining(failed, reply) == 0 {
		t.Fatalf("before the restart: delivered %q, refused %q", sent, failed)
	}
	m := scrape(t, p.addr)
	for _, want := range []string{`turnguard_deliveries_total{channel="telegram",result="retry"} 1`,
		`turnguard_telegram_api_calls_total{method="sendMessage",result="server_error"}`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(m, "turnguard_deliveries_total", "turnguard_telegram_api_calls_total"))
		}
	}
	p.signal(syscall.SIGKILL)
	p.wait(5 * time.Second)

	bot.SetFail(false)
	startGateway(t, dir, cfg)
	if n := waitSent(bot, reply, 30*time.Second); n != 1 {
		t.Fatalf("the final reply reached the chat %d times", n)
	}
	waitOutbox(t, db, "the reply delivered", func(pending []store.OutboxMessage, c store.OutboxCounts) bool {
		return len(pending) == 0 && c.Delivered == 1 && c.Failed == 0
	})
	bot.Say("/steps say:Ping")
	waitSent(bot, "Ping", 30*time.Second)
	if sent, _ := messagesOf(bot); countContaining(sent, reply) != 1 {
		t.Errorf("the final reply was delivered %d times: %q", countContaining(sent, reply), sent)
	}
}

// grepLines returns the lines of s that start with one of the prefixes.
func grepLines(s string, prefixes ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, "\n")
}

// TestQueuedSurvivesSIGKILL: a message sent over WebSocket while the
// session's turn runs is answered "queued" (busy mode queue, the default)
// only once it is stored durably, so a SIGKILL right after the answer loses
// nothing. The restarted gateway first ends the cut-off turn with the
// interrupted notice, then runs the queued message as its own turn (its
// queued run id) — in that order in the history — and exactly once: a
// further restart runs nothing again.
func TestQueuedSurvivesSIGKILL(t *testing.T) {
	dir := t.TempDir()
	cfg := crashConfig(dir)
	db := filepath.Join(dir, "gateway.db")
	const first, queued, session = "run-before-crash", "run-queued", "main"
	const question, reply = "/steps say:Queued_answer", "Queued answer"

	p, cl := startHanging(t, dir, cfg, session, first)
	res := cl.call("chat.send", map[string]any{"sessionKey": session, "message": question, "idempotencyKey": queued})
	var ack struct{ RunID, Status, Busy string }
	if err := json.Unmarshal(res.Payload, &ack); err != nil || !res.OK || ack.Status != "queued" || ack.RunID != queued {
		t.Fatalf("chat.send while busy: ok=%v %s %+v; want status queued", res.OK, res.Payload, res.Error)
	}
	p.signal(syscall.SIGKILL) // at once: the answer promised the message is stored
	p.wait(5 * time.Second)

	for restart := 1; restart <= 2; restart++ {
		p := startGateway(t, dir, cfg)
		cl := dialGateway(t, p.addr, testToken)
		var msgs []historyMessage
		deadline := time.Now().Add(10 * time.Second)
		for {
			msgs = history(t, cl, session)
			if countReplies(msgs, reply) > 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond) // real time: the restored turn runs in another process
		}
		if n := countReplies(msgs, reply); n != 1 {
			t.Fatalf("restart %d: the history holds the queued message's reply %d times, want once:\n%s", restart, n, transcriptOf(msgs))
		}
		notice, user, answer := -1, -1, -1
		for i, m := range msgs {
			switch {
			case m.Role == "assistant" && m.StopReason == "interrupted":
				notice = i
			case m.Role == "user" && textOf(m) == question:
				user = i
			case m.Role == "assistant" && textOf(m) == reply:
				answer = i
			}
		}
		if notice < 0 || !(notice < user && user < answer) {
			t.Fatalf("restart %d: want the interrupted notice, then the queued message, then its reply:\n%s", restart, transcriptOf(msgs))
		}
		if restart == 1 {
			// The restored turn's TurnStarted reached the bus's other
			// subscribers too (restored after they subscribed).
			if m := scrape(t, p.addr); !strings.Contains(m, `turnguard_turns_started_total{channel="ws"} 1`) {
				t.Errorf("restart 1: the restored turn is not counted as started in /metrics:\n%s", grepLines(m, "turnguard_turns_"))
			}
		}
		p.signal(syscall.SIGTERM)
		if code := p.wait(10 * time.Second); code != 0 {
			t.Fatalf("restart %d: exit code %d", restart, code)
		}
	}

	st, err := store.Open(context.Background(), db, store.Options{Unlocked: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if q, err := st.Queued(context.Background()); err != nil || len(q) != 0 {
		t.Errorf("the store still queues %+v (%v): the message ran, it must be gone", q, err)
	}
	if tr, err := st.Turn(context.Background(), queued); err != nil || tr.State != store.TurnFinished {
		t.Errorf("the queued run's turn = %+v, %v; want finished under its queued run id", tr, err)
	}
}

func textOf(m historyMessage) string {
	var b strings.Builder
	for _, c := range m.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

func countReplies(msgs []historyMessage, reply string) int {
	n := 0
	for _, m := range msgs {
		if m.Role == "assistant" && textOf(m) == reply {
			n++
		}
	}
	return n
}

func transcriptOf(msgs []historyMessage) string {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "  %s [%s] %q\n", m.Role, m.StopReason, textOf(m))
	}
	return b.String()
}

// TestQueuedSurvivesSIGKILLTelegram: the same in a Telegram chat. The
// person's second message is answered "📥 Queued" once it is stored; the
// process is killed; after the restart the chat gets the interrupted notice
// of the first request and then the queued message's answer, each once —
// a third start sends neither again.
func TestQueuedSurvivesSIGKILLTelegram(t *testing.T) {
	dir := t.TempDir()
	bot := fakebot.New(t)
	cfg := telegramConfig(dir, bot)
	db := filepath.Join(dir, "gateway.db")
	const notice, reply = "Your request was interrupted by a server problem", "Queued from Telegram"

	p := startGateway(t, dir, cfg)
	msgID := bot.Say("/steps shell:hang")
	waitCurrentStep(t, db, fmt.Sprintf("tg-%d-%d", crashChat, msgID), "shell")
	bot.Say("/steps say:Queued_from_Telegram")
	waitSent(bot, "📥 Queued", 30*time.Second)
	p.signal(syscall.SIGKILL) // at once: the answer promised the message is stored
	p.wait(5 * time.Second)

	p2 := startGateway(t, dir, cfg)
	waitSent(bot, reply, 30*time.Second)
	sent, _ := messagesOf(bot)
	at := func(s string) int {
		for i, m := range sent {
			if strings.Contains(m, s) {
				return i
			}
		}
		return -1
	}
	if countContaining(sent, notice) != 1 || countContaining(sent, reply) != 1 || at(notice) > at(reply) {
		t.Fatalf("after the restart the chat got %q; want the interrupted notice, then the queued answer, once each", sent)
	}
	p2.signal(syscall.SIGTERM)
	if code := p2.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}

	startGateway(t, dir, cfg)
	bot.Say("/steps say:Still_here")
	waitSent(bot, "Still here", 30*time.Second)
	if sent, _ := messagesOf(bot); countContaining(sent, notice) != 1 || countContaining(sent, reply) != 1 {
		t.Errorf("after another restart the chat got %q: the notice or the queued answer again", sent)
	}
}
