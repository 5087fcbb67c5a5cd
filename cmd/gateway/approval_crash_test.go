package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnguard/turnguard/event"
	"github.com/turnguard/turnguard/internal/testwait"
	"github.com/turnguard/turnguard/store"
)

// TestCrashWhileAskingExpiresTheQuestion: the gateway process is killed
// (SIGKILL) while a turn waits on its person's answer. At the next start the
// turn is ended as interrupted (its person finds the notice in the
// history), the question reads back expired in the store — not answered —
// and an answer sent after the restart is told the question is no longer
// open, and changes nothing.
func TestCrashWhileAskingExpiresTheQuestion(t *testing.T) {
	dir := t.TempDir()
	cfg := crashConfig(dir)
	db := filepath.Join(dir, "gateway.db")
	const run, session = "run-asking", "main"

	p := startGateway(t, dir, cfg)
	cl := dialGateway(t, p.addr, testToken)
	chatSend(cl, session, run, "/steps ask:deploy say:Finished")
	ev := cl.waitEvent("approval", 10*time.Second, func(raw json.RawMessage) bool {
		var a struct {
			RunID, State string
		}
		return json.Unmarshal(raw, &a) == nil && a.RunID == run && a.State == "requested"
	})
	var asked struct {
		Approval event.Approval `json:"approval"`
	}
	if err := json.Unmarshal(ev.Payload, &asked); err != nil || asked.Approval.ID == "" || asked.Approval.Title != "Run deploy" {
		t.Fatalf("approval event %s: %v", ev.Payload, err)
	}
	id := asked.Approval.ID
	// The kill must not race the store's asynchronous writer: wait until
	// the question is on disk.
	approvalIn(t, db, id, func(a store.ApprovalRecord) bool { return a.Status == store.ApprovalPending })
	p.signal(syscall.SIGKILL)
	p.wait(5 * time.Second)

	p = startGateway(t, dir, cfg)
	cl = dialGateway(t, p.addr, testToken)
	got := interruptedNotices(history(t, cl, session))
	if len(got) != 1 || !strings.HasPrefix(got[0], "⚠️ Your request was interrupted by a server problem") {
		t.Fatalf("interrupted notices after the restart: %q, want one", got)
	}
	a := approvalIn(t, db, id, func(store.ApprovalRecord) bool { return true })
	if a.Status != event.ApprovalExpired || a.OptionID != "" || a.AnsweredBy != "" || a.ResolvedAt.IsZero() {
		t.Fatalf("the question after the restart: %+v, want expired and not answered", a)
	}
	res := cl.call("approval.resolve", map[string]any{"id": id, "optionId": "allow", "sessionKey": session})
	if res.OK || res.Error == nil || !strings.Contains(res.Error.Message, "unknown or expired approval") {
		t.Fatalf("an answer after the restart: ok=%v %s %+v, want refused as unknown or expired", res.OK, res.Payload, res.Error)
	}
	if a := approvalIn(t, db, id, func(store.ApprovalRecord) bool { return true }); a.Status != event.ApprovalExpired {
		t.Fatalf("the late answer changed the question: %+v", a)
	}
}

// approvalIn waits (10 s) until the store file at path has question id in a
// state ok accepts, and returns it.
func approvalIn(t *testing.T, path, id string, ok func(store.ApprovalRecord) bool) store.ApprovalRecord {
	t.Helper()
	var got store.ApprovalRecord
	testwait.NoError(t, 10*time.Second, func() error { // real time: a real process writes the store
		st, err := store.Open(context.Background(), path, store.Options{Unlocked: true}) // the gateway holds the lock
		if err != nil {
			return err
		}
		defer st.Close()
		a, found, err := st.Approval(context.Background(), id)
		switch {
		case err != nil:
			return err
		case !found:
			return errNotYet("question " + id + " not in the store")
		case !ok(a):
			return errNotYet("question " + id + " is " + a.Status)
		}
		got = a
		return nil
	})
	return got
}

type errNotYet string

func (e errNotYet) Error() string { return string(e) }
