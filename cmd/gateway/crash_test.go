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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/store"
)

const crashOpToken = "crash-operator-token"

// crashConfig is a gateway with a token, an operator token (the test reads
// the operator API like an operator would) and its store in dir.
func crashConfig(dir string) string {
	return fmt.Sprintf(`server:
  listen: 127.0.0.1:0
  token: %s
  operatorToken: %s
agents:
  defaults:
    abortGraceSeconds: 5
store:
  path: %s
`, testToken, crashOpToken, filepath.Join(dir, "gateway.db"))
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
	ctx := context.Background()
	st, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if turn, err := st.Turn(ctx, runID); err == nil && turn.CurrentStep.Name == current {
			return
		}
		time.Sleep(20 * time.Millisecond) // real time: polling another process's database
	}
	t.Fatalf("turn %s never recorded in step %s", runID, current)
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
	// The interrupted message (messages.interrupted). Whether it names the
	// step that was running ("— last action was shell") is up to
	// recoverInterrupted; this test pins that it arrives, once.
	const wantStart, wantEnd = "⚠️ The gateway restarted while working on your request", "Please send it again."

	p := startGateway(t, dir, cfg)
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, session, run, "/steps shell:hang")
	cl.waitEvent("agent", 10*time.Second, toolStarted(run, "shell"))
	waitCurrentStep(t, db, run, "shell")
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
	st, err := store.Open(context.Background(), db, store.Options{})
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
	p := startGateway(t, dir, cfg)
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, "main", "run-m", "/steps shell:hang")
	cl.waitEvent("agent", 10*time.Second, toolStarted("run-m", "shell"))
	waitCurrentStep(t, filepath.Join(dir, "gateway.db"), "run-m", "shell")
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
	for _, want := range []string{"turnguard_active_turns 0", `turnguard_build_info{`, "turnguard_store_events_dropped_total 0"} {
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
