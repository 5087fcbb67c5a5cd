package cluster_test

// What the suite assumes about the gateway's cluster mode, one helper per
// assumption, so that a difference found when the cluster mode lands is
// fixed here and not in every test. Each helper keeps to what a user sees:
// an answer's code and words, a history entry, an event's state.

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/internal/clusterrig"
	"github.com/turnguard/turnguard/internal/fakebot"
	"github.com/turnguard/turnguard/internal/testwait"
	"github.com/turnguard/turnguard/internal/wsclient"
)

// Scripts of the demo runner (runner/demo: /steps).
const (
	hangTurn = "/steps web_search:50ms shell:hang" // runs until stopped
	// streamTurn streams text (llm steps send deltas) with tool steps
	// between, about two seconds in all.
	streamTurn    = "/steps llm:700ms web_search:300ms llm:700ms say:Streamed_to_every_replica"
	streamedReply = "Streamed to every replica"
)

// hasReply reports whether the history holds an assistant message
// containing text.
func hasReply(h wsclient.History, text string) bool {
	for _, m := range h.Messages {
		if m.Role == "assistant" && strings.Contains(m.Text(), text) {
			return true
		}
	}
	return false
}

// session is the canonical key of a session name (docs/protocol.md §5).
func session(name string) string { return "agent:main:" + name }

// busyRunID returns the run id a busy refusal names: busy mode reject
// answers ok:false, UNAVAILABLE, details {code: SESSION_BUSY, runId}
// (docs/protocol.md, chat.send). Guess: a busy session held on another
// replica is refused with the same shape.
func busyRunID(a wsclient.Ack) (string, bool) {
	if a.OK || a.Err == nil || a.Err.Code != "UNAVAILABLE" || a.Err.Details["code"] != "SESSION_BUSY" {
		return "", false
	}
	id, _ := a.Err.Details["runId"].(string)
	return id, id != ""
}

// started reports whether chat.send started runID.
func started(a wsclient.Ack, runID string) bool {
	return a.OK && a.Status == "started" && a.RunID == runID
}

// retryableRefusal reports whether a send was refused for now, with retrying
// worth it (UNAVAILABLE, retryable) — what a send gets while the store is
// down. Guess: the NOT_ACCEPTING_TURNS answer of a store that cannot write,
// or any other retryable UNAVAILABLE.
func retryableRefusal(a wsclient.Ack) bool {
	return !a.OK && a.Err != nil && a.Err.Code == "UNAVAILABLE" && a.Err.Retryable
}

// terminalEntries lists the assistant messages of a history by how they
// ended: "reply" for a normal answer, else the stop reason (a turn that did
// not end normally leaves one entry with its stop reason; the demo scripts
// used stream no partial reply before such an end).
func terminalEntries(h wsclient.History) []string {
	var out []string
	for _, m := range h.Messages {
		if m.Role != "assistant" {
			continue
		}
		if m.StopReason == "" || m.StopReason == "stop" {
			out = append(out, "reply")
		} else {
			out = append(out, m.StopReason)
		}
	}
	return out
}

// refusalWithin bounds how long a send may take to be refused while the
// store is down: a refusal, not a hang. (The engine's claim gives up after
// 10 s at most; a database that refuses connections fails at once.)
const refusalWithin = 5 * time.Second

// interruptedNotices are the history entries telling the user that the turn
// was cut off by a replica's death (an assistant message with stopReason
// interrupted, as after a restart of one process). Guess: takeover by a
// survivor records the same entry.
func interruptedNotices(h wsclient.History) []string {
	var out []string
	for _, m := range h.Messages {
		if m.Role == "assistant" && m.StopReason == "interrupted" {
			out = append(out, m.Text())
		}
	}
	return out
}

// telegramInterrupted reports whether a Telegram message is the interrupted
// notice (messages.Interrupted's words).
func telegramInterrupted(text string) bool {
	return strings.Contains(text, "interrupted by a server problem")
}

// endSeen reports whether what a watcher on a surviving replica got tells
// its user the run is over after its owner died or was stopped: a terminal
// chat event that is not a final (aborted or error; stop reason interrupted
// guessed, any accepted), or the socket closed with 1012 (reload history).
func endSeen(e wsclient.Event, closeCode int, gotEvent bool) error {
	if gotEvent {
		if e.State == "final" {
			return fmt.Errorf("the watcher saw a final for a run whose owner died: %s", e)
		}
		return nil
	}
	if closeCode == 1012 {
		return nil
	}
	return fmt.Errorf("the watcher's socket closed with %d, want 1012 or a terminal event", closeCode)
}

// signature is the part of a run's event sequence every watcher must see
// identically: the kept events (lifecycle, steps, terminal), in order.
// Chat deltas may drop (for a slow client, or on their way between
// replicas) and are batched per server, and the keepalive lifecycle
// "running" is per watcher; both are left out. So is the payload seq:
// each replica's server numbers the frames it makes of a run, deltas
// included (docs/protocol.md: a client may see gaps in it), so only its
// order is the same everywhere — a watcher whose payload seq goes
// backwards gets a "seq order" entry that no other watcher has.
func signature(evs []wsclient.Event) []string {
	var out []string
	var last int64
	for _, e := range evs {
		if e.Seq <= last {
			out = append(out, fmt.Sprintf("seq order: %d after %d", e.Seq, last))
		}
		last = e.Seq
		if e.Name == "chat" && e.State == "delta" {
			continue
		}
		if e.Name == "agent" && e.Stream == "lifecycle" && e.Data.Phase == "running" {
			continue
		}
		out = append(out, stripSeq(e.String()))
	}
	return out
}

// stripSeq drops the " seq=N" an event's String carries.
func stripSeq(s string) string {
	i := strings.Index(s, " seq=")
	if i < 0 {
		return s
	}
	j := strings.IndexByte(s[i+1:], ' ')
	if j < 0 {
		return s[:i]
	}
	return s[:i] + s[i+1+j:]
}

// owner returns the replica that runs runID: the one whose operator API
// (GET /api/turns) lists it. Guess: each replica lists only its own live
// turns; if several list it, an entry may say which replica holds it
// ("replica"), else the test fails here, to be adjusted.
func owner(t *testing.T, c *clusterrig.Cluster, runID string) int {
	t.Helper()
	i, _ := ownerWhere(t, c, "run "+runID, func(id, _ string) bool { return id == runID })
	return i
}

// ownerOfSession returns the replica running a turn of session sess, and
// that turn's run id (see owner).
func ownerOfSession(t *testing.T, c *clusterrig.Cluster, sess string) (int, string) {
	t.Helper()
	return ownerWhere(t, c, "a turn of "+sess, func(_, s string) bool { return s == sess })
}

func ownerWhere(t *testing.T, c *clusterrig.Cluster, what string, match func(runID, sess string) bool) (int, string) {
	t.Helper()
	var found []int
	var runID string
	testwait.Until(t, 10*time.Second, "a replica lists "+what+" in /api/turns", func() bool {
		found = found[:0]
		for i, g := range c.Gateways() {
			if !g.Running() {
				continue
			}
			var live struct {
				Turns []struct {
					RunID      string `json:"runId"`
					SessionKey string `json:"sessionKey"`
					State      string `json:"state"`
					Replica    string `json:"replica"`
				} `json:"turns"`
			}
			if err := g.OperatorGet("/api/turns", &live); err != nil {
				continue
			}
			for _, tr := range live.Turns {
				if tr.State == "running" && match(tr.RunID, tr.SessionKey) && (tr.Replica == "" || tr.Replica == g.ID) {
					found, runID = append(found, i), tr.RunID
				}
			}
		}
		return len(found) > 0
	})
	if len(found) != 1 {
		t.Fatalf("%s is listed as running on replicas %v; want exactly one owner (adjust ownerWhere() in guess_test.go)", what, found)
	}
	return found[0], runID
}

// others returns the replicas other than i, in order.
func others(c *clusterrig.Cluster, i int) []int {
	var out []int
	for j := range c.Gateways() {
		if j != i {
			out = append(out, j)
		}
	}
	return out
}

// toolStarted matches the agent event of runID's tool step name starting.
func toolStarted(runID, name string) func(wsclient.Event) bool {
	return func(e wsclient.Event) bool {
		return e.RunID == runID && e.Name == "agent" && e.Stream == "tool" && e.Data.Phase == "start" && e.Data.Name == name
	}
}

// chatState matches runID's chat event in state.
func chatState(runID, state string) func(wsclient.Event) bool {
	return func(e wsclient.Event) bool { return e.RunID == runID && e.Name == "chat" && e.State == state }
}

// processGone reports whether pid has exited (no such process, or a zombie
// nobody reaped yet).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
		return true
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	b := string(raw)
	// /proc/PID/stat: "pid (comm) S …"; the state follows the last ')'.
	if i := strings.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] == 'Z'
	}
	return false
}

// telegramSession is the fake chat's session key.
var telegramSession = fmt.Sprintf("telegram:%d", fakebot.Chat)
